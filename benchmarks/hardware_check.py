"""One prepared check of the project on an accelerator, within a time budget.

    python benchmarks/hardware_check.py [--budget-s 540] [--started-at EPOCH_S] [--kernels matmul,softmax]
        [--dtypes bfloat16] [--cases matmul/bfloat16,groups_matmul] [--out DIR]
    python benchmarks/hardware_check.py --plan-only --device-kind "NVIDIA H100 80GB HBM3" \
        --budget-s 540                                  # what that run would do, on any host
    python benchmarks/hardware_check.py --smoke --budget-s 90   # the same code on a CPU, tiny
                                                               # shapes, interpret mode

The project must be installed (its shipped kernels install as autotune.kernels); on a machine
without a network, install its wheel: see benchmarks/README.md.

The steps run in order of value (`order()`): the prepared ones (`PREPARED`), every bfloat16 case
first (matmul 4096^3, flash attention forward and backward at 4x16x2048x128 causal,
`matmul_mgpu`), then a training step and the two variant groups, the float32 cases after, then
the rest; then every other registered kernel that declares an example (autotune.registry: a kernel
added since, `attention_mgpu`), at its example's shapes and dtypes (`registered_cases`). Each
step runs in its own process with a time limit (`hardware_case.py`), and prints and writes what
it measured as it goes. A case is
`autotune tune` (the CLI: device worker, interpret-mode oracle) at a realistic shape, its time
limit what the step has left once the rest of the step is reserved; then, once the tune's
processes have ended (a TPU admits one process), the kernel at its default configuration
against its plain-JAX reference on awkward shapes (in its own dtype, and in the dtypes no case
of its kernel covers, by the kernel's last case), then the default configuration, the tuned one
and the vendor's operation for the same call timed side by side with one timer, the tuned one
twice more on its own for the repeat spread. An extra (`EXTRAS`) is a script given what its
step has left (`--budget-s`), its output streamed.

The budget covers the whole run, from `--started-at` (the time the command began, before it
installed the carried wheels) where given. Before each step the plan is made again from the time left:
every step still to run is reserved its measured overheads (`OVERHEADS`) and the least search
worth running for it (`Overheads.min_tune_s` times its `share`), in order of value while they
fit; a step that no longer fits is not run and is listed "not run: budget"; the time left over
is shared among the cases that fit by their `share`. A step's process is stopped at its
allotment plus a margin, and never past the budget + 5%. `--plan-only` prints that plan, made
as the run would make it with every step taking its planned time, for the device kind given,
without touching a device.

Writes <device>-<date and time>.md and .json to benchmarks/results (--out: there) after every
step, and tuned/<the same name>.json: the tuned entries of this device kind, an `autotune db
export` document in the layout a kernel's `tuned=` reads (the shipped kernels read
autotune/kernels/tuned/: commit it there with the report). With --smoke, all of it goes to
--out, default a temporary folder, since a CPU's figures mean nothing. Nothing is served while
the check runs: tuning writes to a throw-away database.
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
    # a kernel PREPARED has no case of, at its example: its own dtypes (None: hardware_case's)
    dtypes: tuple[str, ...] | None = None

    @property
    def id(self) -> str:  # what --cases names
        return f"{self.kernel}/{self.dtype}"

    @property
    def label(self) -> str:
        flags = "".join(f" {k}={v}" for k, v in self.static.items())
        return f"{self.kernel} {self.dtype}{flags}"

    @property
    def mosaic_gpu(self) -> bool:
        return _kernel(self.kernel).spec.backend == "mosaic_gpu"

    @property
    def simulated(self) -> bool:
        """Whether a CPU's smoke run checks it in its backend's interpret mode: a prepared
        case's kernel (GPU interpret mode runs matmul_mgpu), not one known from its
        registration only (jax 0.10.2's cannot run JAX's attention)."""
        return self.dtypes is None


def _kernel(name: str) -> Any:
    from autotune import registry

    return registry.resolve(name)


@dataclass(frozen=True)
class Extra:
    """A script run after its place in the order (hardware_case.EXTRA_SCRIPTS), on an
    accelerator only, with the time its platform's `Overheads.extras_s` gives it."""

    id: str  # what --cases names
    label: str
    gpu_only: bool = False


def _mm(m: int, k: int, n: int) -> Shapes:
    return ((m, k), (k, n))


def _attn(b: int, h: int, s: int, d: int) -> Shapes:
    return ((b, h, s, d),) * 3


def _attn_bwd(b: int, h: int, s: int, d: int) -> Shapes:
    # q, k, v, dO, then the forward's log-sum-exp and delta (float32: hardware_case.arg_dtypes)
    return ((b, h, s, d),) * 4 + ((b, h, s),) * 2


def _rows(r: int, c: int, vectors: int) -> Shapes:
    return ((r, c),) + ((c,),) * vectors


CAUSAL = {"causal": True}
ATTENTION, BACKWARD = _attn(4, 16, 2048, 128), _attn_bwd(4, 16, 2048, 128)
PREPARED: list[Case | Extra] = [  # in order of value: a tight budget keeps the first ones
    Case("matmul", _mm(4096, 4096, 4096), _mm(64, 64, 64), "bfloat16", share=2.0),
    Case("flash_attention", ATTENTION, _attn(1, 2, 64, 16), "bfloat16", CAUSAL, 1.5),
    # the backward: its two kernels, each against the whole of cuDNN's backward (dq, dk, dv)
    Case("flash_attention_dq", BACKWARD, _attn_bwd(1, 2, 64, 16), "bfloat16", CAUSAL, 0.5),
    Case("flash_attention_dkv", BACKWARD, _attn_bwd(1, 2, 64, 16), "bfloat16", CAUSAL, 0.5),
    Case("matmul_mgpu", _mm(4096, 4096, 4096), None, "bfloat16", share=1.0),
    # the step a model runs (its 16 calls tuned in turn), then the groups' choice of member
    Extra("train_step", "training step"),
    Extra("groups_matmul", "variant group matmul_variants"),
    Extra("groups_attention", "variant group attention_variants"),
    Case("matmul", _mm(2048, 2048, 2048), _mm(48, 32, 64), "float32", share=1.0),
    Case("flash_attention", _attn(2, 8, 1024, 64), _attn(1, 1, 32, 16), "float32", CAUSAL, 1.0),
    Case("bmm", ((16, 1024, 1024),) * 2, ((2, 32, 32),) * 2, "bfloat16", share=0.5),
    Case("softmax", _rows(8192, 4096, 0), _rows(16, 200, 0), "float32", share=0.4),
    Case("rms_norm", _rows(16384, 4096, 1), _rows(16, 200, 1), "bfloat16", share=0.4),
    Case("layer_norm", _rows(16384, 4096, 2), _rows(16, 200, 2), "bfloat16", share=0.4),
    Case("vector_add", ((1 << 26,),) * 2, ((5000,),) * 2, "float32", share=0.3),
    Extra("readme", "README example (JAX's Hopper matmul)", gpu_only=True),
]


def registered_cases() -> list[Case]:
    """A case for every registered kernel that declares an example and has no case in
    PREPARED, after PREPARED's: at its example's shapes (on a device and in smoke mode alike), in its
    example's dtypes, with its static arguments, and a small share."""
    from autotune import registry

    prepared = {c.kernel for c in PREPARED if isinstance(c, Case)}
    cases = []
    for name, kernel in registry.registered().items():
        example = kernel.spec.example
        if example is None or name in prepared:
            continue
        shapes = tuple(a.shape for a in example.args)
        dtypes = tuple(a.dtype for a in example.args)
        cases.append(Case(name, shapes, shapes, dtypes[0], dict(example.static), 0.2, dtypes))
    return cases


def order() -> list[Case | Extra]:
    """Every step's case or extra, in order of value: PREPARED's, then `registered_cases`
    (worked out when a run starts: registering the kernels is part of its budget)."""
    return PREPARED + registered_cases()


CASES = [c for c in PREPARED if isinstance(c, Case)]
EXTRAS = {e.id: e for e in PREPARED if isinstance(e, Extra)}


def every_dtype() -> tuple[str, ...]:
    """The dtypes a run checks and tunes by default: ALL_DTYPES, and the cases' own."""
    cases = {c.dtype for c in order() if isinstance(c, Case)}
    return ALL_DTYPES + tuple(sorted(cases - set(ALL_DTYPES)))


# GPU interpret mode simulates every thread of a Mosaic GPU kernel: seconds per call at the
# smallest shapes, too slow to tune and time in a smoke run (its correctness is still checked).
SMOKE_SKIPS = "Mosaic GPU kernels are not tuned in smoke mode (GPU interpret mode is a simulator)"
GPU_ONLY = "not run: a Mosaic GPU kernel needs a Hopper GPU"

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
    "flash_attention_dq": (_attn_bwd(2, 4, 1000, 64), _attn_bwd(1, 2, 40, 16)),
    "flash_attention_dkv": (_attn_bwd(2, 4, 1000, 64), _attn_bwd(1, 2, 40, 16)),
}
AWKWARD_STATIC = {
    k: CAUSAL for k in ("flash_attention", "flash_attention_dq", "flash_attention_dkv")
}
CHECKED_DTYPES = {  # kernel -> the dtypes it is checked in (default: ALL_DTYPES)
    "matmul_mgpu": ("bfloat16",),  # wgmma multiplies 16-bit floats
    # the backward's float32 would cost two float32 Triton compiles (~15 s each) in the bf16
    # part of the run; the forward's float32 case checks the float32 path of its kernels
    "flash_attention_dq": ("bfloat16",),
    "flash_attention_dkv": ("bfloat16",),
}
ALL_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Overheads:
    """What a step costs besides its search, in seconds (measured: see each platform's entry)."""

    start_s: float  # a step's process: interpreter, jax, the device, the kernels' registration
    check_s: dict[str, float]  # one correctness check, by dtype (a compile and a call)
    tune_past_limit_s: float  # `autotune tune` runs this long past its --time-limit
    side_by_side_s: float  # the side-by-side section of a 16-bit case
    compile_s: dict[str, float]  # a compile beyond a 16-bit one's, by dtype (side by side: 2)
    min_tune_s: float  # the least search worth running, for a share of 1: less tunes nothing
    report_s: float  # writing the final report and the tuned table
    extras_s: dict[str, float]  # what each of EXTRAS is given (none: it does not run there)
    install_s: float = 0.0  # installing the carried wheels before the run (none: installed)

    def after_tune_s(self, checks: tuple[str, ...], dtype: str) -> float:
        """What a case still needs once its tune has ended: its correctness checks and its
        side by side (a float32 one compiles twice more)."""
        after = sum(self.check_s.get(d, self.check_s["bfloat16"]) for d in checks)
        return after + self.side_by_side_s + 2 * self.compile_s.get(dtype, 0.0)

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
    # for two kernels in two dtypes; a process's start-up is a guess (jax and CUDA, ~8 s). The
    # least search, 12 s for a share of 1, measures ~12-40 candidates at 0.3-1 s each (0.27 s
    # a config with the compile pool on, the H200's grid of matmul). Installing the carried
    # wheels (6.1 MB, --no-deps) took 2.8 s on the CPU host; 10 s allows for pip's start.
    "gpu": Overheads(
        start_s=8.0,
        check_s={"float32": 15.0, "bfloat16": 5.0},
        tune_past_limit_s=16.0,
        side_by_side_s=21.0,
        compile_s={"float32": 15.0},
        min_tune_s=12.0,
        report_s=2.0,
        # not yet measured: what each script is given, as its --budget-s; each fits its work
        # to it (the step tunes its calls while its timing's share is left, a group's members
        # share what is left before its side by side) and prints its rows as they are done
        extras_s={
            "train_step": 80.0,
            "groups_matmul": 40.0,
            "groups_attention": 50.0,
            "readme": 60.0,
        },
        install_s=10.0,
    ),
    # unmeasured: the GPU's figures, as a TPU's compiles are of the same order
    "tpu": Overheads(
        start_s=8.0,
        check_s={"bfloat16": 10.0},
        tune_past_limit_s=16.0,
        side_by_side_s=21.0,
        compile_s={},
        min_tune_s=12.0,
        report_s=2.0,
        extras_s={"train_step": 80.0, "groups_matmul": 40.0, "groups_attention": 50.0},
    ),
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
MARGIN = 1.25  # a step's process is stopped at this times its allotment (within the budget)
OVERRUN = 1.05  # the budget's tolerance: nothing runs past budget * OVERRUN
DEVICE_INFO_S = 10.0  # reading the versions and the device (a process of its own), as planned


# ------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Step:
    """One process of the run: a case (its checks, then its tuning and side by side), or one of
    EXTRAS (case None)."""

    case: Case | None
    checks: tuple[str, ...]  # dtypes its kernel is checked in
    tuned: bool  # False: correctness only (a smoke run of a simulated kernel)
    extra: Extra | None = None

    @property
    def label(self) -> str:
        return self.case.label if self.case else self.extra.label

    @property
    def share(self) -> float:
        return self.case.share if self.tuned else 0.0


def steps(
    items: list[Case | Extra], dtypes: tuple[str, ...], smoke: bool, overheads: Overheads
) -> list[Step]:
    """The run's processes in order. A case checks its kernel in its own dtype, and its
    kernel's last case also in the dtypes no case of that kernel covers; an extra runs where
    its platform gives it time (never in smoke mode)."""
    cases = [c for c in items if isinstance(c, Case)]
    out = []
    for item in items:
        if isinstance(item, Extra):
            if item.id in overheads.extras_s and not smoke:
                out.append(Step(None, (), False, item))
            continue
        allowed = CHECKED_DTYPES.get(item.kernel, item.dtypes[:1] if item.dtypes else ALL_DTYPES)
        own = [c for c in cases if c.kernel == item.kernel]
        wanted = {item.dtype} | (
            set(allowed) - {c.dtype for c in own} if item is own[-1] else set()
        )
        checks = tuple(d for d in allowed if d in wanted and d in dtypes)
        tuned = not (smoke and item.smoke_shapes is None)
        out.append(Step(item, checks, tuned))
    return out


def runs_on(item: Case | Extra, platform: str) -> bool:
    """Whether a case or extra can run on this platform (Mosaic GPU: on a GPU, or simulated on
    a CPU)."""
    if isinstance(item, Case):
        return not item.mosaic_gpu or platform == "gpu" or (platform == "cpu" and item.simulated)
    return not item.gpu_only or platform in ("gpu", "cpu")


def step_cost(step: Step, overheads: Overheads) -> float:
    """What a step costs besides its search."""
    if step.extra is not None:
        return overheads.start_s + overheads.extras_s[step.extra.id]
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
        least = overheads.min_tune_s * step.share
        need = step_cost(step, overheads) + least
        if reserved + need <= left_s:
            chosen[i] = least
            reserved += need
    shares = {i: todo[i].share for i in chosen if todo[i].share}
    spare = left_s - reserved
    return {
        i: t + (spare * shares[i] / sum(shares.values()) if i in shares else 0.0)
        for i, t in chosen.items()
    }


@dataclass(frozen=True)
class Planned:
    """A step as the run plans it just before it starts."""

    step: Step
    start_s: float  # seconds into the run
    planned_s: float | None  # its cost and search; None: not run (budget)
    search_s: float = 0.0
    limit_s: float = 0.0  # its process is stopped after this long


def next_step(todo: list[Step], elapsed_s: float, budget_s: float, overheads: Overheads) -> Planned:
    """The plan for todo[0], `elapsed_s` into the run: what the run does before each step."""
    left = budget_s - overheads.report_s - elapsed_s
    fits = plan(todo, left, overheads)
    if 0 not in fits:
        return Planned(todo[0], elapsed_s, None)
    planned = step_cost(todo[0], overheads) + fits[0]
    hard_end = budget_s * OVERRUN - overheads.report_s
    limit = min(planned * MARGIN, hard_end - elapsed_s)
    return Planned(todo[0], elapsed_s, planned, fits[0], limit)


def whole_plan(todo: list[Step], budget_s: float, overheads: Overheads) -> list[Planned]:
    """The run's plan before it starts: each step planned as the run plans it, every step
    taking its planned time, after the carried wheels are installed (`Overheads.install_s`)
    and the device is read (DEVICE_INFO_S)."""
    out, elapsed = [], overheads.install_s + DEVICE_INFO_S
    for i in range(len(todo)):
        planned = next_step(todo[i:], elapsed, budget_s, overheads)
        out.append(planned)
        elapsed += planned.planned_s or 0.0
    return out


def print_plan(kind: str, platform: str, budget_s: float, planned: list[Planned]) -> None:
    overheads = overheads_of(platform)
    print(
        f"plan for {kind} ({platform}) within {budget_s:.0f} s (stopped by {budget_s * OVERRUN:.0f} s):"
    )
    print("| # | step | starts at s | planned s | of it search s | time limit s |")
    print("|---|---|---|---|---|---|")
    if overheads.install_s:
        print(f"| - | install the carried wheels | 0 | {overheads.install_s:.0f} | | |")
    print(f"| - | read the device | {overheads.install_s:.0f} | {DEVICE_INFO_S:.0f} | | |")
    for n, p in enumerate(planned, 1):
        if p.planned_s is None:
            print(f"| {n} | {p.step.label} | | not run: budget | | |")
            continue
        print(
            f"| {n} | {p.step.label} | {p.start_s:.0f} | {p.planned_s:.0f} | {p.search_s:.0f} "
            f"| {p.limit_s:.0f} |"
        )
    ran = [p for p in planned if p.planned_s is not None]
    end = ran[-1].start_s + ran[-1].planned_s if ran else overheads.install_s + DEVICE_INFO_S
    print(
        f"{len(ran)} of {len(planned)} steps run; planned to end at {end:.0f} s, the report "
        f"written by {end + overheads.report_s:.0f} s of the {budget_s:.0f} s budget"
    )


def overheads_of(platform: str) -> Overheads:
    return OVERHEADS.get(platform, OVERHEADS["gpu"])


def job(
    step: Step, tune_s: float, db: str, smoke: bool, info: dict[str, Any], limit_s: float = 1e9
) -> dict[str, Any]:
    """What `hardware_case.py` runs for a step stopped after `limit_s`. A case's tune is given
    what the step has left when it starts, less what the step needs after it (`after_tune_s`,
    `tune_past_limit_s`), so that its checks and side by side always run; an extra's script, its
    share of the step's limit as its --budget-s."""
    overheads = overheads_of(info.get("platform", "gpu"))
    if step.extra is not None:
        # the script stops itself first, within its process's limit, and says so
        timeout = min(overheads.extras_s[step.extra.id], limit_s - overheads.start_s)
        return {"extra": step.extra.id, "timeout_s": max(1.0, timeout), "db": db}
    case = step.case
    kernel = case.kernel
    return {
        "kernel": kernel,
        "dtype": case.dtype,
        "static": case.static,
        "platform": info.get("platform", "gpu"),
        "shapes": None if not step.tuned else case.smoke_shapes if smoke else case.shapes,
        "check_dtypes": list(step.checks),
        "check_shapes": AWKWARD[kernel][1 if smoke else 0] if kernel in AWKWARD else case.shapes,
        "check_static": AWKWARD_STATIC.get(kernel, {}),
        "db": db,
        "smoke": smoke,
        "trials": 2 if smoke else 200,
        "time_limit_s": max(1.0, tune_s),
        # the tune is stopped well past its usual overrun, and where the step then has no more
        # left than its checks and side by side need (hardware_case.tune_limits)
        "tune_timeout_s": tune_s + 3 * overheads.tune_past_limit_s,
        "tune_past_limit_s": overheads.tune_past_limit_s,
        "after_tune_s": overheads.after_tune_s(step.checks, case.dtype) if step.tuned else 0.0,
        "limit_s": limit_s,
    }


def run_step(job_doc: dict[str, Any], timeout_s: float, folder: Path) -> dict[str, Any]:
    """Run one step's process, stopped (with everything it started) after `timeout_s`."""
    job_path, result_path = folder / "job.json", folder / "result.json"
    # the step's clock: its process fits its tune to what is left of `timeout_s` from here
    job_path.write_text(json.dumps({**job_doc, "started_at": time.time()}))
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


def export_tuned(db: str, device_kind: str, path: Path) -> int:
    """The tuned entries of this device kind in `db` as an `autotune db export` document at
    `path` (the layout a kernel's `tuned=` reads); how many. Nothing tuned: no file."""
    from autotune.db import TuningDB

    if not Path(db).exists():
        return 0
    with TuningDB(db) as handle:
        doc = handle.export(device_kind=device_kind)
    if doc["entries"]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return len(doc["entries"])


# ------------------------------------------------------------------------------- the report


def ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.4f} ms"


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{100 * value:.1f}%"
    return f"{value:.2f}{unit}"


# Peaks (dense) of one device by a device_kind substring, more specific names first: bf16
# TFLOP/s, f32 TFLOP/s (None: no float32 peak of its own), HBM TB/s. NVIDIA's datasheets; the
# TPUs' from JAX's tpu_info.py, per device as JAX makes them (a v4 or v5p megacore: the chip;
# v7x: one of its two TensorCores).
PEAKS = {
    "H200": (989.0, 67.0, 4.8),
    "H100": (989.0, 67.0, 3.35),
    "A100": (312.0, 19.5, 2.0),
    "TPU v5 lite": (197.0, None, 0.82),
    "TPU v6 lite": (920.0, None, 1.64),
    "TPU v4": (275.0, None, 1.23),
    "TPU v5": (459.0, None, 2.46),
    "TPU7": (1155.0, None, 3.7),
}


def report(
    info: dict[str, Any], rows: list[dict[str, Any]], budget_s: float, wall_s: float, tuned: int
) -> str:
    """The Markdown report: versions, correctness, side by side, the extras' output, each
    step's outcome, and how many tuned entries the exported table holds."""
    kind = info.get("device_kind", "unknown device")
    peaks = next((p for k, p in PEAKS.items() if k in kind), None)
    lines = [
        f"# Hardware check: {kind} ({info.get('date', '-')})",
        "",
        f"jax {info.get('jax', '-')}, Python {info.get('python', '-')}, backend "
        f"{info.get('backend', '-')}, runtime {info.get('runtime') or '-'}; L2 "
        f"{info.get('l2_bytes', 'unknown')} bytes; {wall_s:.0f} s of a {budget_s:.0f} s budget. "
        f"Command: `{' '.join(sys.argv)}`. Tuned entries exported (tuned/, the layout `tuned=` "
        f"reads): {tuned}.",
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
        compute = peaks and peaks[0 if "bfloat16" in r["case"] else 1]
        if peaks and tflops and compute:
            peak = f"{100 * tflops / compute:.0f}% compute"
        elif peaks and tbs and not tflops:
            peak = f"{100 * tbs / peaks[2]:.0f}% HBM"
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
        if "planned_s" in r:
            line += (
                f", {r['wall_s']} s (planned {r['planned_s']} s, search {r['search_s']} s, "
                f"limit {r['limit_s']} s)"
            )
        lines.append(line)
        if "tuned_config" in r:
            lines.append(f"  - tuned {r['tuned_config']} (default {r['default_config']})")
        lines += [f"  - {status}: {error}" for status, error in r.get("trial_errors", {}).items()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- main


def select(args: argparse.Namespace) -> list[Case | Extra]:
    """The cases and extras the filters keep, in their order; a filter naming nothing known is
    refused. Extras run unfiltered, or where --cases names them."""
    filters = {"--kernels": args.kernels, "--dtypes": args.dtypes, "--cases": args.cases}
    items = order()
    cases = [c for c in items if isinstance(c, Case)]
    known = {
        "--kernels": {c.kernel for c in cases},
        "--dtypes": set(every_dtype()),
        "--cases": {c.id for c in cases} | set(EXTRAS),
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
    named = wanted.get("--cases", set())
    unfiltered = not (args.kernels or args.cases)
    return [
        item
        for item in items
        if (isinstance(item, Extra) and (unfiltered or item.id in named))
        or (
            isinstance(item, Case)
            and item.kernel in wanted.get("--kernels", {item.kernel})
            and item.dtype in wanted.get("--dtypes", {item.dtype})
            and item.id in wanted.get("--cases", {item.id})
        )
    ]


def platform_of_kind(device_kind: str) -> str:
    """The platform a device kind names: "TPU v5 lite" a TPU, "cpu" the CPU, the rest GPUs."""
    if device_kind.upper().startswith("TPU"):
        return "tpu"
    return "cpu" if device_kind.lower() == "cpu" else "gpu"


def run_name(info: dict[str, Any]) -> str:
    """The report's and the tuned table's file name: the device kind and when the run began (to
    the minute: a second command of the same day writes files of its own)."""
    when = info["date"][:16].replace(":", "")
    return f"{info.get('device_kind', 'unknown').replace(' ', '_')}-{when}"


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=540.0, help="the whole check's time budget")
    p.add_argument(
        "--smoke", action="store_true", help="tiny shapes on this host (interpret mode on a CPU)"
    )
    p.add_argument("--kernels", help="comma-separated kernel names (default: every case's)")
    p.add_argument("--dtypes", help="comma-separated dtypes (default: float32,bfloat16)")
    p.add_argument(
        "--cases",
        help=f"comma-separated case ids, kernel/dtype or one of {', '.join(EXTRAS)} (default: all)",
    )
    p.add_argument(
        "--out",
        help="folder for the report (default: benchmarks/results; --smoke: a temporary one)",
    )
    p.add_argument("--plan-only", action="store_true", help="print the plan and stop: nothing runs")
    p.add_argument(
        "--started-at",
        type=float,
        help="when the command began, in seconds since the epoch (`date +%%s`, before the wheels "
        "were installed): the budget counts from then (default: now)",
    )
    p.add_argument(
        "--device-kind",
        help='with --plan-only: the device to plan for, as jax names it (e.g. "NVIDIA H100 '
        '80GB HBM3", "TPU v5 lite"; default: this host\'s)',
    )
    args = p.parse_args(argv)
    if args.device_kind and not args.plan_only:
        print("--device-kind plans for another device: give --plan-only too", file=sys.stderr)
        return 2
    if args.started_at is not None:
        before = time.time() - args.started_at
        if not 0 <= before < args.budget_s:
            print(
                f"--started-at {args.started_at:.0f} is {before:.0f} s ago: give the command's "
                f"start (`date +%s`), within the {args.budget_s:.0f} s budget",
                file=sys.stderr,
            )
            return 2
        start -= before  # the install before this process counts against the budget
    items = select(args)
    if not items:
        print("no case matches --kernels, --dtypes and --cases together", file=sys.stderr)
        return 2
    dtypes = tuple(args.dtypes.split(",")) if args.dtypes else every_dtype()
    # this process and each step's (and its device worker's) share the GPU: none may take
    # XLA's default 75% of its memory up front, or the next one cannot start
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if args.device_kind:
        info = {"device_kind": args.device_kind, "platform": platform_of_kind(args.device_kind)}
    else:
        info = device_info()
    platform = info.get("platform", "gpu")
    overheads = overheads_of(platform)
    skipped = [i for i in items if not runs_on(i, platform)]
    todo = steps([i for i in items if runs_on(i, platform)], dtypes, args.smoke, overheads)
    if args.plan_only:
        print_plan(
            info["device_kind"], platform, args.budget_s, whole_plan(todo, args.budget_s, overheads)
        )
        for item in skipped:
            print(f"{item.label}: {GPU_ONLY}")
        return 0
    if args.smoke:
        print(SMOKE_SKIPS)
    print(f"device {info.get('device_kind')} ({platform}), jax {info.get('jax')}")
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(args.out) if args.out else Path(tmp) if args.smoke else RESULTS
        out_dir.mkdir(parents=True, exist_ok=True)
        name = run_name(info)
        db = os.path.join(tmp, "check.db")
        tuned_path = out_dir / "tuned" / f"{name}.json"
        rows: list[dict[str, Any]] = [{"case": item.label, "outcome": GPU_ONLY} for item in skipped]

        def write() -> str:  # after every step: a check cut short keeps what it measured
            exported = export_tuned(db, info["device_kind"], tuned_path)
            text = report(info, rows, args.budget_s, time.perf_counter() - start, exported)
            (out_dir / f"{name}.md").write_text(text)
            doc = {"versions": info, "budget_s": args.budget_s, "cases": rows}
            (out_dir / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str))
            return text

        for i, step in enumerate(todo):
            planned = next_step(todo[i:], time.perf_counter() - start, args.budget_s, overheads)
            row: dict[str, Any] = {"case": step.label}
            if step.case is not None:
                row["shapes"] = format_shapes(
                    (step.case.smoke_shapes if args.smoke else step.case.shapes) or ()
                )
            if planned.planned_s is None:
                left = args.budget_s - overheads.report_s - planned.start_s
                print(f"{step.label}: not run: budget ({left:.0f} s left)")
                rows.append({**row, "outcome": "not run: budget"})
                write()
                continue
            print(
                f"{step.label}: {planned.planned_s:.0f} s planned ({planned.search_s:.0f} s of "
                f"search), stopped after {planned.limit_s:.0f} s",
                flush=True,
            )
            result = run_step(
                job(step, planned.search_s, db, args.smoke, info, planned.limit_s),
                planned.limit_s,
                Path(tmp),
            )
            rows.append(
                {
                    **row,
                    **result,
                    "planned_s": round(planned.planned_s, 1),
                    "search_s": round(planned.search_s, 1),
                    "limit_s": round(planned.limit_s, 1),
                }
            )
            print(f"  {result['outcome']}, {result['wall_s']} s", flush=True)
            write()
        print(write())
        print(
            f"wrote {out_dir / name}.md and .json"
            + (f", {tuned_path}" if tuned_path.exists() else "")
        )
    ran = [r for r in rows if not r["outcome"].startswith("not run")]
    ok = all(r["outcome"] == "done" for r in ran)
    ok = ok and all(c["ok"] for r in ran for c in r.get("correctness", []))
    ok = ok and all(r.get("rc", 0) == 0 and r.get("tuned_ok", True) for r in ran)
    ok = ok and all(r["extra"]["rc"] == 0 for r in ran if "extra" in r)
    return 0 if ok else 1


def device_info() -> dict[str, Any]:
    """The versions and the device, asked of a short-lived process (this one never touches
    the device, so that nothing a step does can reach it)."""
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
