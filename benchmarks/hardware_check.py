"""One prepared check of the project on an accelerator, within a time budget.

    python benchmarks/hardware_check.py [--budget-s 420] [--kernels matmul,softmax]
        [--dtypes bfloat16] [--cases matmul/bfloat16,flash_attention/bfloat16]
    python benchmarks/hardware_check.py --smoke --budget-s 90   # the same code on a CPU, tiny
                                                               # shapes, interpret mode

The project must be installed (its shipped kernels install as autotune.kernels); on a machine
without a network, install its wheel: see benchmarks/README.md.

The cases run in order of value (`CASES`; Mosaic GPU cases last, since a fault of theirs could
break the GPU for what follows), each in its own process with a timeout (`hardware_case.py`):
the kernel at its default configuration against its plain-JAX reference on awkward shapes (in
each dtype checked, the first time the kernel comes up), `autotune tune` (the CLI: device
worker, interpret-mode oracle) at a realistic shape within the case's share of the budget, then
the default configuration, the tuned one and the vendor's operation for the same call timed side
by side with one timer, the tuned one twice more on its own for the repeat spread.

The budget covers the whole run. Before each case the plan is made again from the time left:
every case still to run is reserved its measured overheads (`OVERHEADS`) and the least search
worth running for it (`Overheads.min_tune_s` times its `share`), in order of value while they fit; a case that no longer
fits is not run and is listed "not run: budget"; the time left over is shared among the cases
that fit by their `share`. A case's process is stopped at its allotment plus a margin, and never
past the budget + 5%.

Writes benchmarks/results/<device>-<date>.md and .json after every case (with --smoke: to --out,
default a temporary folder, since a CPU's figures mean nothing). Nothing is served: tuning writes
to a throw-away database.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CASE_SCRIPT = Path(__file__).resolve().parent / "hardware_case.py"
Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Case:
    """A kernel, called as model code calls it, at a realistic shape and a tiny one (--smoke)."""

    kernel: str
    shapes: Shapes
    smoke_shapes: Shapes | None  # None: only its correctness in smoke mode (see SMOKE_SKIPS)
    dtype: str
    static: dict[str, Any] = field(default_factory=dict)
    share: float = 1.0  # its weight: in its least search, and in the time left over

    @property
    def id(self) -> str:  # what --cases names
        return f"{self.kernel}/{self.dtype}"

    @property
    def label(self) -> str:
        flags = "".join(f" {k}={v}" for k, v in self.static.items())
        return f"{self.kernel} {self.dtype}{flags}"

    @property
    def mosaic_gpu(self) -> bool:
        return self.kernel.endswith("_mgpu")


def _mm(m: int, k: int, n: int) -> Shapes:
    return ((m, k), (k, n))


def _attn(b: int, h: int, s: int, d: int) -> Shapes:
    return ((b, h, s, d),) * 3


def _rows(r: int, c: int, vectors: int) -> Shapes:
    return ((r, c),) + ((c,),) * vectors


CAUSAL = {"causal": True}
CASES = [  # in order of value: the ones that matter most first, so a tight budget keeps them
    Case("matmul", _mm(4096, 4096, 4096), _mm(64, 64, 64), "bfloat16", share=3.0),
    Case("flash_attention", _attn(4, 16, 2048, 128), _attn(1, 2, 64, 16), "bfloat16", CAUSAL, 2.0),
    Case("matmul", _mm(2048, 2048, 2048), _mm(48, 32, 64), "float32", share=1.0),
    Case("flash_attention", _attn(2, 8, 1024, 64), _attn(1, 1, 32, 16), "float32", CAUSAL, 1.0),
    Case("bmm", ((16, 1024, 1024),) * 2, ((2, 32, 32),) * 2, "bfloat16", share=0.5),
    Case("softmax", _rows(8192, 4096, 0), _rows(16, 200, 0), "float32", share=0.4),
    Case("rms_norm", _rows(16384, 4096, 1), _rows(16, 200, 1), "bfloat16", share=0.4),
    Case("layer_norm", _rows(16384, 4096, 2), _rows(16, 200, 2), "bfloat16", share=0.4),
    Case("vector_add", ((1 << 26,),) * 2, ((5000,),) * 2, "float32", share=0.3),
    Case("matmul_mgpu", _mm(4096, 4096, 4096), None, "bfloat16", share=3.0),
]

# What runs after the kernel cases, on a GPU only (each in its own process, with the time its
# platform's Overheads.extras_s gives it), in order of value: --cases names each by its id.
EXTRAS = {  # id -> label
    "groups": "variant groups",  # variant_groups.py: each member of the shipped groups, the winner
    "train_step": "training step",  # train_step.py: a transformer block's step, tuned vs default vs XLA
    "readme": "README example",  # the README's JAX Hopper matmul example, as pasted
}

# GPU interpret mode simulates every thread of a Mosaic GPU kernel: seconds per call at the
# smallest shapes, too slow to tune and time in a smoke run (its correctness is still checked).
SMOKE_SKIPS = "Mosaic GPU kernels are not tuned in smoke mode (GPU interpret mode is a simulator)"

# Awkward shapes for the correctness section: no dimension a multiple of a block.
AWKWARD: dict[str, tuple[Shapes, Shapes]] = {  # kernel -> (accelerator, smoke)
    "vector_add": (((100_003,),) * 2, ((1_003,),) * 2),
    "matmul": (_mm(1000, 777, 1234), _mm(37, 29, 45)),
    "matmul_mgpu": (_mm(1000, 776, 1234), _mm(130, 96, 200)),
    "bmm": (((3, 200, 77), (3, 77, 130)), ((2, 20, 13), (2, 13, 24))),
    "softmax": (_rows(1000, 3000, 0), _rows(10, 300, 0)),
    "rms_norm": (_rows(1000, 3000, 1), _rows(10, 300, 1)),
    "layer_norm": (_rows(1000, 3000, 2), _rows(10, 300, 2)),
    "flash_attention": (_attn(2, 4, 1000, 64), _attn(1, 2, 40, 16)),
}
AWKWARD_STATIC = {"flash_attention": CAUSAL}
CHECKED_DTYPES = {"matmul_mgpu": ("bfloat16",)}  # wgmma multiplies 16-bit floats
ALL_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Overheads:
    """What a case costs besides its search, in seconds (measured: see each platform's entry)."""

    start_s: float  # a case's process: interpreter, jax, the device, the kernels' registration
    check_s: dict[str, float]  # one correctness check, by dtype (a compile and a call)
    tune_past_limit_s: float  # `autotune tune` runs this long past its --time-limit
    side_by_side_s: float  # the side-by-side section of a 16-bit case
    compile_s: dict[str, float]  # a compile beyond a 16-bit one's, by dtype (side by side: 2)
    min_tune_s: float  # the least search worth running, for a share of 1: less tunes nothing
    report_s: float  # writing the final report
    extras_s: dict[str, float]  # what each of EXTRAS is given (none: it does not run there)

    def case_s(self, checks: tuple[str, ...], dtype: str | None) -> float:
        """A case's cost besides its search (dtype None: correctness only)."""
        cost = self.start_s + sum(self.check_s.get(d, self.check_s["bfloat16"]) for d in checks)
        if dtype is not None:
            cost += self.tune_past_limit_s + self.side_by_side_s
            cost += 2 * self.compile_s.get(dtype, 0.0)
        return cost


OVERHEADS = {
    # H200, jax 0.11.2 (the run of 2026-12-04, benchmarks/results): each tune ran ~16 s past its
    # limit, each side by side took ~21 s, a float32 Triton compile 15-35 s, correctness ~37 s
    # for two kernels in two dtypes; a process's start-up is a guess (jax and CUDA, ~8 s)
    "gpu": Overheads(
        start_s=8.0,
        check_s={"float32": 15.0, "bfloat16": 5.0},
        tune_past_limit_s=16.0,
        side_by_side_s=21.0,
        compile_s={"float32": 15.0},
        min_tune_s=30.0,
        report_s=2.0,
        # guesses, not yet measured: the groups tune each member (--trials 16) at two calls;
        # the training step tunes its 16 calls at 4 trials each
        extras_s={"groups": 150.0, "train_step": 240.0, "readme": 90.0},
    ),
    # unmeasured: the GPU's figures, as a TPU's compiles are of the same order
    "tpu": Overheads(8.0, {"bfloat16": 10.0}, 16.0, 21.0, {}, 30.0, 2.0, {}),
    # this 2-core CPU host, jax 0.10.2, --smoke, others' jobs running: a case took 7-13 s (2
    # trials), matmul_mgpu's check in GPU interpret mode 9 s
    "cpu": Overheads(
        start_s=3.5,
        check_s={"float32": 1.5, "bfloat16": 1.5, "matmul_mgpu": 8.0},
        tune_past_limit_s=4.0,
        side_by_side_s=2.5,
        compile_s={},
        min_tune_s=2.0,
        report_s=1.0,
        extras_s={},
    ),
}
MARGIN = 1.25  # a case's process is stopped at this times its allotment (within the budget)
OVERRUN = 1.05  # the budget's tolerance: nothing runs past budget * OVERRUN


# ------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Step:
    """One process of the run: a case (its checks, then its tuning and side by side), or one of
    EXTRAS (case None)."""

    case: Case | None
    checks: tuple[str, ...]  # dtypes its kernel is checked in
    tuned: bool  # False: correctness only (a smoke run of a simulated kernel)
    extra: str | None = None  # an id of EXTRAS

    @property
    def label(self) -> str:
        return self.case.label if self.case else EXTRAS[self.extra]


def steps(cases: list[Case], dtypes: tuple[str, ...], smoke: bool, extras: list[str]) -> list[Step]:
    """The run's processes in order: each kernel checked in its dtypes by its first case."""
    checked: set[str] = set()
    out = []
    for case in sorted(cases, key=lambda c: c.mosaic_gpu):  # stable: value order otherwise
        checks = () if case.kernel in checked else CHECKED_DTYPES.get(case.kernel, ALL_DTYPES)
        checked.add(case.kernel)
        tuned = not (smoke and case.smoke_shapes is None)
        out.append(Step(case, tuple(d for d in checks if d in dtypes), tuned))
    return out + [Step(None, (), False, extra) for extra in extras]


def step_cost(step: Step, overheads: Overheads) -> float:
    """What a step costs besides its search."""
    if step.extra is not None:
        return overheads.start_s + overheads.extras_s[step.extra]
    checks = step.checks
    if step.case.mosaic_gpu and "matmul_mgpu" in overheads.check_s:  # simulated on a CPU
        checks = tuple("matmul_mgpu" for _ in checks)
    return overheads.case_s(checks, step.case.dtype if step.tuned else None)


def plan(todo: list[Step], left_s: float, overheads: Overheads) -> dict[int, float]:
    """Which of `todo` fit in `left_s`, and each one's search time: {index: seconds}.

    In order of value, each step is reserved its cost and, if tuned, the least search worth
    running for its share; one that does not fit is left out (a later, cheaper one may still
    fit). What is left over is shared among the tuned ones by their `share`."""
    chosen: dict[int, float] = {}
    reserved = 0.0
    for i, step in enumerate(todo):
        least = overheads.min_tune_s * step.case.share if step.tuned else 0.0
        need = step_cost(step, overheads) + least
        if reserved + need <= left_s:
            chosen[i] = least
            reserved += need
    shares = {i: todo[i].case.share for i in chosen if todo[i].tuned}
    spare = left_s - reserved
    return {
        i: t + (spare * shares[i] / sum(shares.values()) if i in shares else 0.0)
        for i, t in chosen.items()
    }


def job(step: Step, tune_s: float, db: str, smoke: bool, overheads: Overheads) -> dict[str, Any]:
    """What `hardware_case.py` runs for a step."""
    if step.extra is not None:
        return {"extra": step.extra, "timeout_s": overheads.extras_s[step.extra]}
    case = step.case
    kernel = case.kernel
    return {
        "kernel": kernel,
        "dtype": case.dtype,
        "static": case.static,
        "shapes": None if not step.tuned else case.smoke_shapes if smoke else case.shapes,
        "check_dtypes": list(step.checks),
        "check_shapes": AWKWARD[kernel][1 if smoke else 0],
        "check_static": AWKWARD_STATIC.get(kernel, {}),
        "db": db,
        "smoke": smoke,
        "trials": 2 if smoke else 200,
        "time_limit_s": max(1.0, tune_s),
        # the tune is stopped well past its usual overrun; the case's own timeout bounds it too
        "tune_timeout_s": tune_s + 3 * overheads.tune_past_limit_s,
    }


def run_step(job_doc: dict[str, Any], timeout_s: float, folder: Path) -> dict[str, Any]:
    """Run one step's process, stopped (with everything it started) after `timeout_s`."""
    job_path, result_path = folder / "job.json", folder / "result.json"
    job_path.write_text(json.dumps(job_doc))
    result_path.unlink(missing_ok=True)
    start = time.perf_counter()
    # its own process group: a timeout stops the tune and its device worker with it
    proc = subprocess.Popen(
        [sys.executable, str(CASE_SCRIPT), str(job_path), str(result_path)],
        start_new_session=True,
    )
    try:
        rc = proc.wait(timeout=max(1.0, timeout_s))
        outcome = "done" if rc == 0 else f"failed: exit code {rc}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        outcome = f"timeout after {timeout_s:.0f} s"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    if outcome != "done":
        outcome += f" (during {result.get('stage', 'start-up')})"
    result.update(outcome=outcome, wall_s=round(time.perf_counter() - start, 1))
    return result


# ------------------------------------------------------------------------------- the report


def ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.4f} ms"


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{100 * value:.1f}%"
    return f"{value:.2f}{unit}"


# Datasheet peaks (dense) by a device_kind substring: bf16 TFLOP/s, f32 TFLOP/s, HBM TB/s.
PEAKS = {"H200": (989.0, 67.0, 4.8), "H100": (989.0, 67.0, 3.35), "A100": (312.0, 19.5, 2.0)}


def report(info: dict[str, Any], rows: list[dict[str, Any]], budget_s: float, wall_s: float) -> str:
    """The Markdown report: versions, correctness, side by side, what did not run."""
    kind = info.get("device_kind", "unknown device")
    peaks = next((p for k, p in PEAKS.items() if k in kind), None)
    lines = [
        f"# Hardware check: {kind} ({info.get('date', '-')})",
        "",
        f"jax {info.get('jax', '-')}, Python {info.get('python', '-')}, backend "
        f"{info.get('backend', '-')}, runtime {info.get('runtime') or '-'}; L2 "
        f"{info.get('l2_bytes', 'unknown')} bytes; {wall_s:.0f} s of a {budget_s:.0f} s budget. "
        f"Command: `{' '.join(sys.argv)}`.",
        "",
        "## Default configurations against the references (awkward shapes)",
        "",
        "| kernel | dtype | shapes | verdict | max error | note |",
        "|---|---|---|---|---|---|",
    ]
    for c in (c for r in rows for c in r.get("correctness", [])):
        err = "-" if c["max_error"] is None else f"{c['max_error']:.2e}"
        lines.append(
            f"| {c['kernel']} | {c['dtype']} | {c['shapes']} | {'ok' if c['ok'] else 'FAIL'} "
            f"| {err} | {c['note'][:100]} |"
        )
    lines += [
        "",
        "## Tuned, default and vendor, side by side (medians of interleaved rounds, one timer)",
        "",
        "| case | shapes | timer | default | tuned | vendor | tuned/vendor | speedup | repeat spread "
        "| TFLOP/s | TB/s | % of peak | trials (ok/rejected) | trial timers | tuning s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    timed = [r for r in rows if "default_s" in r]
    for r in timed:
        tflops, tbs = r["tflops"], r["tb_per_s"]
        peak = ""
        if peaks and (tflops or tbs):
            peak = (
                f"{100 * tflops / peaks[0 if 'bfloat16' in r['case'] else 1]:.0f}% compute"
                if tflops
                else f"{100 * tbs / peaks[2]:.0f}% HBM"
            )
        lines.append(
            f"| {r['case']} | {r['shapes']} | {r['timer']} | {ms(r['default_s'])} "
            f"| {ms(r.get('tuned_s'))} | {ms(r['vendor_s'])} ({r['vendor']}) "
            f"| {fmt(r.get('tuned_over_vendor'), 'x')} | {fmt(r.get('tuned_speedup'), 'x')} "
            f"| {fmt(r.get('repeat_spread'), '%')} | {fmt(tflops)} | {fmt(tbs)} | {peak} "
            f"| {r['trials']} ({r['trials_ok']}/{r['trials_rejected']}) "
            f"| {', '.join(r['trial_timers'])} | {r.get('tune_wall_s', '-')} |"
        )
    if timed:
        lines += ["", "What the vendor's time counts:", ""]
        for r in timed:
            lines.append(f"- {r['case']}: {r['vendor_counted']}")
            if r.get("vendor_kernels"):  # per kernel, CUPTI without aggregation
                kernels = ", ".join(f"{name} {t:.4f} ms" for name, t in r["vendor_kernels"])
                lines.append(f"  - its kernels in one call: {kernels}")
    for r in (r for r in rows if "extra" in r):
        extra = r["extra"]
        lines += [
            "",
            f"{r['case']}: exit code {extra['rc']}, {extra['wall_s']} s; last lines:",
            "",
            *[f"    {line}" for line in extra["output"]],
        ]
    lines += ["", "## Each case", ""]
    for r in rows:
        line = f"- {r['case']}: {r['outcome']}"
        if "wall_s" in r:
            line += f", {r['wall_s']} s (planned {r['planned_s']} s, search {r['search_s']} s)"
        lines.append(line)
        if "tuned_config" in r:
            lines.append(f"  - tuned {r['tuned_config']} (default {r['default_config']})")
        lines += [f"  - {status}: {error}" for status, error in r.get("trial_errors", {}).items()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- main


def select(args: argparse.Namespace) -> list[Case]:
    """The cases the filters keep, in their order; a filter naming nothing known is refused."""
    filters = {"--kernels": args.kernels, "--dtypes": args.dtypes, "--cases": args.cases}
    known = {
        "--kernels": {c.kernel for c in CASES},
        "--dtypes": set(ALL_DTYPES),
        "--cases": {c.id for c in CASES} | set(EXTRAS),
    }
    wanted: dict[str, set[str]] = {}
    for flag, value in filters.items():
        if value:
            wanted[flag] = set(value.split(","))
            unknown = wanted[flag] - known[flag]
            if unknown:  # bad input: one line, exit 2
                print(
                    f"{flag}: unknown {', '.join(sorted(unknown))}: use "
                    f"{', '.join(sorted(known[flag]))}",
                    file=sys.stderr,
                )
                sys.exit(2)
    return [
        c
        for c in CASES
        if c.kernel in wanted.get("--kernels", {c.kernel})
        and c.dtype in wanted.get("--dtypes", {c.dtype})
        and c.id in wanted.get("--cases", {c.id})
    ]


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=420.0, help="the whole check's time budget")
    p.add_argument(
        "--smoke", action="store_true", help="tiny shapes on this host (interpret mode on a CPU)"
    )
    p.add_argument("--kernels", help="comma-separated kernel names (default: every case's)")
    p.add_argument("--dtypes", help="comma-separated dtypes (default: float32,bfloat16)")
    p.add_argument(
        "--cases",
        help=f"comma-separated case ids, kernel/dtype or one of {', '.join(EXTRAS)} (GPU only; "
        "default: all)",
    )
    p.add_argument(
        "--out",
        help="folder for the report (default: benchmarks/results; --smoke: a temporary one)",
    )
    args = p.parse_args(argv)
    cases = select(args)
    named = set((args.cases or "").split(","))
    if not cases and not named & set(EXTRAS):
        print("no case matches --kernels, --dtypes and --cases together", file=sys.stderr)
        return 2
    dtypes = tuple(args.dtypes.split(",")) if args.dtypes else ALL_DTYPES
    # this process and each case's (and its device worker's) share the GPU: none may take
    # XLA's default 75% of its memory up front, or the next one cannot start
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    info = device_info()
    overheads = OVERHEADS.get(info.get("platform", "gpu"), OVERHEADS["gpu"])
    # the extras run unfiltered, or where --cases names them, where their platform gives them time
    extras = [
        e
        for e in EXTRAS
        if e in overheads.extras_s
        and not args.smoke
        and (not (args.kernels or args.cases) or e in named)
    ]
    todo = steps(cases, dtypes, args.smoke, extras)
    if args.smoke:
        print(SMOKE_SKIPS)
    print(f"device {info.get('device_kind')} ({info.get('platform')}), jax {info.get('jax')}")
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(args.out) if args.out else Path(tmp) if args.smoke else RESULTS
        out_dir.mkdir(parents=True, exist_ok=True)
        name = f"{info.get('device_kind', 'unknown').replace(' ', '_')}-{info['date'][:10]}"
        rows: list[dict[str, Any]] = []

        def write() -> str:  # after every step: a check cut short keeps what it measured
            text = report(info, rows, args.budget_s, time.perf_counter() - start)
            (out_dir / f"{name}.md").write_text(text)
            doc = {"versions": info, "budget_s": args.budget_s, "cases": rows}
            (out_dir / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str))
            return text

        db = os.path.join(tmp, "check.db")
        hard_end = start + args.budget_s * OVERRUN - overheads.report_s
        for i, step in enumerate(todo):
            left = args.budget_s - overheads.report_s - (time.perf_counter() - start)
            fits = plan(todo[i:], left, overheads)
            row: dict[str, Any] = {"case": step.label}
            if step.case is not None:
                row["shapes"] = format_shapes(
                    (step.case.smoke_shapes if args.smoke else step.case.shapes) or ()
                )
            if 0 not in fits:
                print(f"{step.label}: not run: budget ({left:.0f} s left)")
                rows.append({**row, "outcome": "not run: budget"})
                write()
                continue
            search_s = fits[0]
            planned = step_cost(step, overheads) + search_s
            timeout = min(planned * MARGIN, hard_end - time.perf_counter())
            print(f"{step.label}: {planned:.0f} s planned ({search_s:.0f} s of search)")
            result = run_step(job(step, search_s, db, args.smoke, overheads), timeout, Path(tmp))
            rows.append(
                {**row, **result, "planned_s": round(planned, 1), "search_s": round(search_s, 1)}
            )
            print(f"  {result['outcome']}, {result['wall_s']} s")
            write()
        print(write())
        print(f"wrote {out_dir / name}.md and .json")
    ran = [r for r in rows if r["outcome"] != "not run: budget"]
    ok = all(r["outcome"] == "done" for r in ran)
    ok = ok and all(c["ok"] for r in ran for c in r.get("correctness", []))
    ok = ok and all(r.get("rc", 0) == 0 and r.get("tuned_ok", True) for r in ran)
    ok = ok and all(r["extra"]["rc"] == 0 for r in ran if "extra" in r)
    return 0 if ok else 1


def device_info() -> dict[str, Any]:
    """The versions and the device, asked of a short-lived process (this one never touches
    the device, so that nothing a case does can reach it)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import hardware_case; "
        "import autotune.kernels; print(json.dumps(hardware_case.versions()))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(CASE_SCRIPT.parent)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        sys.exit(
            f"cannot read the device: {tail[0]} (is the project installed? see benchmarks/README.md)"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def format_shapes(shapes: Shapes) -> str:
    return ",".join("x".join(map(str, s)) for s in shapes)


if __name__ == "__main__":
    sys.exit(main())
