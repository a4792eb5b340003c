"""Tune the shipped variant groups on this machine and print each member's time and the winner.

    PYTHONPATH=. python benchmarks/variant_groups.py [--trials 16] [--time-limit S]
        [--group matmul_variants] [--db PATH] [--out FILE]

Per group and call: every member that can run it, tuned (`--trials` each, within
`--time-limit` seconds each) and then timed side by side at its best by one timer (the group's
own tuning, autotune.tuning.group), fastest first; and every member that cannot, with the
reason. Each group's rows are printed (and written to --out) as soon as it is done. On an
accelerator the calls are bf16 4096^3 (matmul_variants) and 4x16x2048x128, causal
(attention_variants); on a CPU, where the Pallas members run interpreted, small ones. Nothing
here is served: the tuning goes to a throw-away database, or to --db (the hardware check's,
whose earlier tuning of the same calls warm-starts the members).
"""

from __future__ import annotations

import argparse
import os
import tempfile

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


def group_rows(group: str, shapes, static: dict, dtype: str, db: str, args) -> list[str]:
    """The group tuned for the call: each member's row, the winner first, then the skipped."""
    import jax

    from autotune.tuning.tune import tune

    inputs = [jax.ShapeDtypeStruct(s, dtype) for s in shapes]
    call = ",".join("x".join(map(str, s)) for s in shapes) + "".join(
        f" {k}={v}" for k, v in static.items()
    )
    r = tune(
        group,
        inputs,
        kwargs=static,
        n_trials=args.trials,
        time_limit_s=args.time_limit,
        db=db,
        seed=0,
    )
    lines = []
    for i, f in enumerate(r.finalists):
        best = r.members.get(f.config["variant"])
        config = " ".join(f"{k}={v}" for k, v in sorted(best.best_config.items())) if best else ""
        note = ("winner" if i == 0 else "") + (f" ({config})" if config else "")
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
    args = p.parse_args()

    import jax

    on_cpu = jax.default_backend() == "cpu"
    dtype = args.dtype or ("float32" if on_cpu else "bfloat16")
    device = jax.devices()[0]
    lines = [f"{device.platform} / {device.device_kind}, jax {jax.__version__}", "", *HEADER]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or os.path.join(tmp, "bench.db")
        for group, shapes, static in CASES["cpu" if on_cpu else "accelerator"]:
            if args.group not in (None, group):
                continue
            rows = group_rows(group, shapes, static, dtype, db, args)
            print("\n".join(rows), flush=True)
            lines += rows
            if args.out:  # after each group: a run stopped later keeps it
                with open(args.out, "w") as f:
                    f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
