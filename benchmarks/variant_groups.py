"""Tune the shipped variant groups on this machine and print each member's time and the winner.

    PYTHONPATH=. python benchmarks/variant_groups.py [--trials 16] [--time-limit S]
        [--group matmul_variants] [--db PATH] [--out FILE] [--budget-s S]

Per group and call: every member that can run it, tuned (`--trials` each, within
`--time-limit` seconds each) and then timed side by side at its best by one timer (the group's
own tuning, autotune.tuning.group), fastest first; and every member that cannot, with the
reason. Each member's row is printed (and written to --out) as soon as it is tuned, the
group's side by side when the group is done. With `--budget-s` (the hardware check gives its
step's share) the script keeps to it: each member's search is an equal part of what is left
once the group's side by side is set aside (`SIDE_BY_SIDE_S`), at most `--time-limit`. On an
accelerator the calls are bf16 4096^3 (matmul_variants) and 4x16x2048x128, causal
(attention_variants); on a CPU, where the Pallas members run interpreted, small ones. Nothing
here is served: the tuning goes to a throw-away database, or to --db (the hardware check's,
whose earlier tuning of the same calls warm-starts the members).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

# (group, argument shapes, static arguments) per platform
CASES = {
    "cpu": [
        ("matmul_variants", [(256, 256), (256, 256)], {}),
        ("attention_variants", [(1, 2, 128, 64)] * 3, {"causal": True}),
    ],
    "accelerator": [
        ("matmul_variants", [(4096, 4096), (4096, 4096)], {}),
        ("attention_variants", [(4, 16, 2048, 128)] * 3, {"causal": True}),
    ],
}
GROUPS = [group for group, _, _ in CASES["cpu"]]
HEADER = ["| group | call | member | time ms | |", "|---|---|---|---|---|"]
# What a group needs after its members' searches, set aside from --budget-s (a guess on an
# accelerator): each member's compile and timing side by side, its oracle, storing.
SIDE_BY_SIDE_S = {"cpu": 8.0, "accelerator": 15.0}
MEMBER_OVERHEAD_S = 3.0  # a member's tuning besides its search: its oracle, the finalists
MIN_SEARCH_S = 2.0


def member_limit(left_s: float, members: int, time_limit: float | None) -> float:
    """Each tuned member's search time when `left_s` seconds are left for `members` of them:
    an equal part less what a member costs besides its search, at most `time_limit`, at least
    `MIN_SEARCH_S` (a search of less measures nothing)."""
    share = max(MIN_SEARCH_S, left_s / max(members, 1) - MEMBER_OVERHEAD_S)
    return share if time_limit is None else min(share, time_limit)


def group_rows(
    group: str, shapes, static: dict, dtype: str, db: str, args, emit, deadline: float | None
) -> list[str]:
    """The group tuned for the call: each member's row as it is tuned (`emit`), then the
    side by side's, the winner first, then the skipped. `deadline`: a perf_counter time the
    group's tuning is fitted to."""
    import time

    import jax

    from autotune import registry
    from autotune.device import current_device
    from autotune.tuning.context import TuneContext
    from autotune.tuning.settings import TuneSettings
    from autotune.tuning.task import bind, kernel_of, task_of_call
    from autotune.tuning.tune import tune_task

    inputs = [jax.ShapeDtypeStruct(s, dtype) for s in shapes]
    call = ",".join("x".join(map(str, s)) for s in shapes) + "".join(
        f" {k}={v}" for k, v in static.items()
    )
    time_limit = args.time_limit
    if deadline is not None:
        tuned_members = [m for m in registry.resolve(group).members.values() if m.kernel]
        platform = "cpu" if jax.default_backend() == "cpu" else "accelerator"
        left = deadline - time.perf_counter() - SIDE_BY_SIDE_S[platform]
        time_limit = member_limit(left, len(tuned_members), time_limit)

    def member_done(name: str, result, why: str | None) -> None:
        if why is not None:
            row = f"| {group} | {dtype} {call} | {name} | | skipped: {why}"[:300] + " |"
        elif result is None:
            row = f"| {group} | {dtype} {call} | {name} | | plain: nothing to tune |"
        else:
            config = " ".join(f"{k}={v}" for k, v in sorted(result.best_config.items()))
            row = (
                f"| {group} | {dtype} {call} | {name} | {result.best_time_s * 1e3:.4f} "
                f"| tuned alone, {len(result.trials)} trials ({config}) |"
            )
        emit([row])

    # tune() as a user calls it, with a context that hears of each member as it is done
    settings = TuneSettings().replace(n_trials=args.trials, time_limit_s=time_limit, seed=0)
    kernel = kernel_of(group)
    task = task_of_call(group, inputs, static, settings)
    bound = bind(task, current_device(), kernel, inputs)
    r = tune_task(bound, TuneContext(settings, db, member_done=member_done))
    lines = []
    for i, f in enumerate(r.finalists):
        best = r.members.get(f.config["variant"])
        config = " ".join(f"{k}={v}" for k, v in sorted(best.best_config.items())) if best else ""
        note = "side by side" + (", winner" if i == 0 else "") + (f" ({config})" if config else "")
        lines.append(
            f"| {group} | {dtype} {call} | {f.config['variant']} | {f.time_s * 1e3:.4f} | {note.strip()} |"
        )
    for name, why in r.skipped.items():
        lines.append(f"| {group} | {dtype} {call} | {name} | | skipped: {why} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--time-limit", type=float, help="seconds of search per member (default: none)")
    p.add_argument("--group", choices=GROUPS, help="one group (default: both)")
    p.add_argument("--db", help="the tuning database (default: a throw-away one)")
    p.add_argument("--dtype", help="default: bfloat16 on an accelerator, float32 on a CPU")
    p.add_argument("--out", help="also write the table to this file")
    p.add_argument("--budget-s", type=float, help="the whole script's seconds (default: none)")
    args = p.parse_args()
    start = time.perf_counter()

    import jax

    on_cpu = jax.default_backend() == "cpu"
    dtype = args.dtype or ("float32" if on_cpu else "bfloat16")
    device = jax.devices()[0]
    lines = [f"{device.platform} / {device.device_kind}, jax {jax.__version__}", "", *HEADER]
    print("\n".join(lines), flush=True)

    def emit(rows: list[str]) -> None:  # as each is done: a run stopped later keeps them
        print("\n".join(rows), flush=True)
        lines.extend(rows)
        if args.out:
            with open(args.out, "w") as f:
                f.write("\n".join(lines) + "\n")

    cases = [c for c in CASES["cpu" if on_cpu else "accelerator"] if args.group in (None, c[0])]
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or os.path.join(tmp, "bench.db")
        for i, (group, shapes, static) in enumerate(cases):
            deadline = None
            if args.budget_s is not None:  # what is left, shared by the groups still to tune
                now = time.perf_counter()
                deadline = now + (start + args.budget_s - now) / (len(cases) - i)
            emit(group_rows(group, shapes, static, dtype, db, args, emit, deadline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
