"""One prepared check of the project on an accelerator, within a time budget.

    python benchmarks/hardware_check.py [--budget-s 480] [--kernels matmul,softmax]
    python benchmarks/hardware_check.py --smoke   # the same code on a CPU, tiny shapes,
                                                  # interpret mode

The project must be installed (its shipped kernels install as autotune.kernels); on a machine
without a network, install its wheel: see benchmarks/README.md.

In order: the versions and the device; every shipped kernel at its default configuration
against its plain-JAX reference on awkward shapes, float32 and bfloat16 (verdict, max error);
`autotune tune` (the CLI: device worker, interpret-mode oracle) of every kernel at a realistic
shape within its share of the budget; then, side by side in this process with one timer
(interleaved rounds), the default configuration, the tuned one and the vendor's operation for
the same call, with the tuned one timed twice more on its own for the repeat spread.

Writes benchmarks/results/<device>-<date>.md and .json (with --smoke: to --out, default a
temporary folder, since a CPU's figures mean nothing). Nothing is served: tuning writes to a
throw-away database.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
Shapes = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Case:
    """A kernel, called as model code calls it, at a realistic shape and a tiny one (--smoke)."""

    kernel: str
    shapes: Shapes
    smoke_shapes: Shapes | None  # None: not tuned in smoke mode (see SMOKE_SKIPS)
    dtype: str
    static: dict[str, Any] = field(default_factory=dict)
    share: float = 1.0  # of the tuning budget, relative to the other cases

    @property
    def label(self) -> str:
        flags = "".join(f" {k}={v}" for k, v in self.static.items())
        return f"{self.kernel} {self.dtype}{flags}"


def _mm(m: int, k: int, n: int) -> Shapes:
    return ((m, k), (k, n))


def _attn(b: int, h: int, s: int, d: int) -> Shapes:
    return ((b, h, s, d),) * 3


def _rows(r: int, c: int, vectors: int) -> Shapes:
    return ((r, c),) + ((c,),) * vectors


CASES = [  # the ones that matter most first: a check cut short keeps them
    Case("matmul", _mm(4096, 4096, 4096), _mm(64, 64, 64), "bfloat16", share=3.0),
    Case("matmul_mgpu", _mm(4096, 4096, 4096), None, "bfloat16", share=3.0),
    Case(
        "flash_attention",
        _attn(4, 16, 2048, 128),
        _attn(1, 2, 64, 16),
        "bfloat16",
        {"causal": True},
        share=1.5,
    ),
    Case("matmul", _mm(2048, 2048, 2048), _mm(48, 32, 64), "float32", share=0.6),
    Case(
        "flash_attention",
        _attn(2, 8, 1024, 64),
        _attn(1, 1, 32, 16),
        "float32",
        {"causal": True},
        share=0.6,
    ),
    Case("bmm", ((16, 1024, 1024),) * 2, ((2, 32, 32),) * 2, "bfloat16", share=0.4),
    Case("softmax", _rows(8192, 4096, 0), _rows(16, 200, 0), "float32", share=0.4),
    Case("rms_norm", _rows(16384, 4096, 1), _rows(16, 200, 1), "bfloat16", share=0.4),
    Case("layer_norm", _rows(16384, 4096, 2), _rows(16, 200, 2), "bfloat16", share=0.4),
    Case("vector_add", ((1 << 26,),) * 2, ((5000,),) * 2, "float32", share=0.3),
]

# The training step of a transformer block, forward and backward, after the kernel cases (on a GPU):
# benchmarks/train_step.py lists its calls, tunes them and times the step tuned, at the defaults
# and in plain JAX (cuDNN's attention where jax.nn picks it), in its own process.
TRAIN_STEP_CASE = ["--batch", "2", "--seq", "1024", "--d-model", "1024", "--heads", "8", "--trials", "4"]  # fmt: skip

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
AWKWARD_STATIC = {"flash_attention": {"causal": True}}
CHECKED_DTYPES = {"matmul_mgpu": ("bfloat16",)}  # wgmma multiplies 16-bit floats

# Datasheet peaks (dense) by a device_kind substring: bf16 TFLOP/s, f32 TFLOP/s, HBM TB/s.
PEAKS = {"H200": (989.0, 67.0, 4.8), "H100": (989.0, 67.0, 3.35), "A100": (312.0, 19.5, 2.0)}


def work(case: Case, shapes: Shapes) -> tuple[float, float]:
    """(floating-point operations, bytes read and written) of one call."""
    itemsize = 2 if case.dtype == "bfloat16" else 4
    elems = sum(math.prod(s) for s in shapes)
    if case.kernel in ("matmul", "bmm"):
        *batch, m, k = shapes[0]
        n = shapes[1][-1]
        b = math.prod(batch)
        return 2.0 * b * m * k * n, float((elems + b * m * n) * itemsize)
    if case.kernel == "flash_attention":
        b, h, s, d = shapes[0]
        flops = 4.0 * b * h * s * s * d * (0.5 if case.static.get("causal") else 1.0)
        return flops, float((elems + b * h * s * d) * itemsize)
    out = math.prod(shapes[0])  # elementwise and row-wise: one output of the first shape
    return 0.0, float((elems + out) * itemsize)


def vendor_op(case: Case) -> tuple[str, Callable]:
    """The vendor library's (or XLA's) operation for the same call."""
    import jax
    import jax.numpy as jnp

    from autotune.kernels import layer_norm_reference, rms_norm_reference

    # float32 in float32, as the kernels compute it; other dtypes as XLA does by default
    precision = "highest" if case.dtype == "float32" else None
    if case.kernel in ("matmul", "matmul_mgpu"):
        return "jnp.dot (cuBLAS on GPU)", functools.partial(jnp.dot, precision=precision)
    if case.kernel == "bmm":
        return "jnp.matmul (cuBLAS on GPU)", functools.partial(jnp.matmul, precision=precision)
    if case.kernel == "softmax":
        return "jax.nn.softmax (XLA)", functools.partial(jax.nn.softmax, axis=-1)
    if case.kernel == "rms_norm":
        return "plain JAX (XLA fused)", rms_norm_reference
    if case.kernel == "layer_norm":
        return "plain JAX (XLA fused)", layer_norm_reference
    if case.kernel == "vector_add":
        return "x + y (XLA)", jnp.add
    if case.kernel == "flash_attention":
        return attention_op(case.static.get("causal", False))
    raise KeyError(case.kernel)


def attention_op(causal: bool) -> tuple[str, Callable]:
    """jax.nn.dot_product_attention through cuDNN where it runs, else XLA's; [B, H, S, D]
    inputs (jax.nn's layout is [B, S, H, D]: the transposes are XLA's, outside cuDNN)."""
    import jax

    def on(implementation: str | None) -> Callable:
        def op(q, k, v):
            q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
            out = jax.nn.dot_product_attention(
                q, k, v, is_causal=causal, implementation=implementation
            )
            return out.transpose(0, 2, 1, 3)

        return op

    return "jax.nn.dot_product_attention", on


# ------------------------------------------------------------------------------- the sections


def versions(device: Any) -> dict[str, Any]:
    import jax

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "platform": device.platform,
        "device_kind": device.device_kind,
        "backend": device.backend,
        "runtime": device.runtime_summary,
        "devices": len(jax.devices()),
    }
    try:  # the L2 size the driver reports, where PyTorch is installed beside JAX
        import torch

        if torch.cuda.is_available():
            info["l2_bytes"] = torch.cuda.get_device_properties(0).L2_cache_size
    except ImportError:
        pass
    return info


def inputs(shapes: Shapes, dtype: str, seed: int = 0) -> list[Any]:
    import jax

    from autotune.tuner import random_inputs

    return random_inputs([jax.ShapeDtypeStruct(s, dtype) for s in shapes], seed)


def correctness(kernels: list[str], smoke: bool) -> list[dict[str, Any]]:
    """Each kernel at its default configuration against its reference, f32 and bf16."""
    import jax
    import numpy as np

    from autotune import registry
    from autotune.device import current_device
    from autotune.verify import compare

    rows = []
    for name in kernels:
        kernel = registry.resolve(name)
        spec, shapes = kernel.spec, AWKWARD[name][1 if smoke else 0]
        static = AWKWARD_STATIC.get(name, {})
        for dtype in CHECKED_DTYPES.get(name, ("float32", "bfloat16")):
            args = inputs(shapes, dtype)
            sig = spec.signature(args, static, current_device())
            config = spec.default_config(sig)
            start = time.perf_counter()
            try:
                fn = spec.bound_function(config, interpret=True)
                out = jax.block_until_ready(jax.jit(functools.partial(fn, **static))(*args))
                ref = jax.tree_util.tree_map(
                    lambda r, o: np.asarray(r).astype(o.dtype), spec.reference(*args, **static), out
                )
                verdict = compare(out, ref)
                ok, err, note = verdict.ok, verdict.max_error, verdict.message
            except Exception as e:  # a kernel that fails to compile or run is a finding
                ok, err, note = False, float("nan"), f"{type(e).__name__}: {e}"[:300]
            rows.append(
                {
                    "kernel": name,
                    "dtype": dtype,
                    "shapes": format_shapes(shapes),
                    "config": config,
                    "ok": ok,
                    "max_error": err,
                    "note": note,
                    "seconds": round(time.perf_counter() - start, 2),
                }
            )
            print(
                f"  {name:16} {dtype:9} {'ok' if ok else 'FAIL'}  max error {err:.2e} {note[:120]}"
            )
    return rows


def tune(case: Case, shapes: Shapes, db: str, time_limit: float, smoke: bool) -> dict[str, Any]:
    """`autotune tune` for the case, as a user runs it; the tuning wall time and its trials."""
    cmd = [sys.executable, "-m", "autotune.cli", "tune", case.kernel]
    cmd += ["--shape", format_shapes(shapes), "--dtype", case.dtype, "--db", db, "--seed", "0"]
    cmd += ["--trials", "2" if smoke else "200", "--time-limit", f"{time_limit:.0f}"]
    if smoke:  # a CPU needs no isolation from crashing candidates, and saves a worker's start
        cmd.append("--no-isolate")
    for k, v in case.static.items():
        cmd += ["--static", f"{k}={json.dumps(v)}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=time_limit + 300)
    wall = time.perf_counter() - start
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    print(f"  {case.label:34} rc {proc.returncode}  {wall:6.1f} s  {' | '.join(tail)[:160]}")
    return {"rc": proc.returncode, "tune_wall_s": round(wall, 1), "tune_output": tail}


def side_by_side(case: Case, shapes: Shapes, db: str, smoke: bool) -> dict[str, Any]:
    """The default, tuned and vendor calls timed interleaved with one timer; the tuned config
    checked against the reference at this shape and timed twice more for its repeat spread."""
    import jax
    import numpy as np

    from autotune import registry
    from autotune.db import TuningDB
    from autotune.device import current_device
    from autotune.measure import (
        TimingPolicy,
        cache_bytes,
        interleaved,
        rotation_sets,
        time_compiled,
    )
    from autotune.verify import compare

    device = current_device()
    kernel = registry.resolve(case.kernel)
    spec = kernel.spec
    args = inputs(shapes, case.dtype)
    sig = spec.signature(args, case.static, device)
    key = spec.key(sig, device)
    with TuningDB(db) as handle:
        entry = handle.best(key)
        trials = handle.trials(**key.as_dict())
    default = spec.default_config(sig)
    tuned = entry["config"] if entry else None
    vendor_name, vendor = vendor_op(case)
    if case.kernel == "flash_attention":
        vendor_name, vendor = _runnable_attention(vendor_name, vendor, args, smoke)

    def at(config: dict[str, Any]) -> Callable:
        return functools.partial(spec.bound_function(config, interpret=True), **case.static)

    def compiled(fn: Callable) -> Any:
        return jax.jit(fn).lower(*args).compile()

    exes = {"default": compiled(at(default))}
    if tuned is not None:
        exes["tuned"] = compiled(at(tuned))
    exes["vendor"] = compiled(vendor)
    sets = [args, *rotation_sets(args, cache_bytes(device))]
    policy = TimingPolicy(max_time_s=0.5 if not smoke else 0.05)
    samples, timer = interleaved(
        list(exes.values()), sets, rounds=5, reps=3 if smoke else 10, policy=policy
    )
    median = {name: float(np.median(s)) for name, s in zip(exes, samples)}
    row: dict[str, Any] = {
        "case": case.label,
        "shapes": format_shapes(shapes),
        "timer": timer,
        "default_config": default,
        "tuned_config": tuned,
        "vendor": vendor_name,
        **{f"{name}_s": t for name, t in median.items()},
        "trials": len(trials),
        "trials_ok": sum(t["status"] == "ok" for t in trials),
        "trials_rejected": sum(t["status"] == "rejected" for t in trials),
        "trial_timers": sorted({t["timer"] for t in trials if t.get("timer")}),
        # the first error of each kind of failed trial: a rejection's or a crash's reason
        "trial_errors": {
            t["status"]: (t["error"] or "")[:300] for t in reversed(trials) if t["status"] != "ok"
        },
    }
    if tuned is not None:
        out = jax.block_until_ready(exes["tuned"](*args))
        ref = jax.tree_util.tree_map(
            lambda r, o: np.asarray(r).astype(o.dtype), spec.reference(*args, **case.static), out
        )
        verdict = compare(out, ref, case.static.get("precision"))
        again = [time_compiled(exes["tuned"], args, policy, sets[1:]) for _ in range(2)]
        row.update(
            tuned_ok=verdict.ok,
            tuned_max_error=verdict.max_error,
            repeat_spread=abs(again[0].median_s / again[1].median_s - 1.0),
            repeat_timer=again[0].timer,
            tuned_over_vendor=median["vendor"] / median["tuned"],
            tuned_speedup=median["default"] / median["tuned"],
        )
    flops, nbytes = work(case, shapes)
    best = median.get("tuned", median["default"])
    row["tflops"] = flops / best / 1e12 if flops else None
    row["tb_per_s"] = nbytes / best / 1e12
    print(
        f"  {case.label:34} {timer:5}  default {ms(median['default'])}  tuned "
        f"{ms(median.get('tuned'))}  vendor {ms(median['vendor'])}"
    )
    return row


def _runnable_attention(
    name: str, make: Callable, args: list[Any], smoke: bool
) -> tuple[str, Callable]:
    """cuDNN's attention where it runs for these inputs, else XLA's."""
    import jax

    for implementation in ([] if smoke else ["cudnn"]) + [None]:
        op = make(implementation)
        try:
            jax.block_until_ready(jax.jit(op)(*args))
        except Exception as e:  # cuDNN refuses some shapes, dtypes and GPUs
            print(f"  attention through {implementation}: {type(e).__name__}: {str(e)[:120]}")
            continue
        return f"{name} ({implementation or 'xla'})", op
    raise RuntimeError("no attention implementation runs here")


README_EXAMPLE = "### JAX's own Hopper matmul, tuned without editing it"


def readme_example(timeout_s: float) -> dict[str, Any]:
    """The README's example that tunes JAX's own Mosaic GPU matmul, run as a user would paste it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(README_EXAMPLE) :]
    code = section[
        section.index("```python\n") + 10 : section.index("\n```", section.index("```python"))
    ]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s
        )
        rc, output = proc.returncode, (proc.stdout + proc.stderr).strip().splitlines()[-4:]
    except subprocess.TimeoutExpired:
        rc, output = None, [f"stopped after {timeout_s:.0f} s"]
    wall = time.perf_counter() - start
    print(f"  README example: rc {rc}, {wall:.1f} s: {' | '.join(output)[:300]}")
    return {"rc": rc, "wall_s": round(wall, 1), "output": output}


# ------------------------------------------------------------------------------- the report


def ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.4f} ms"


def format_shapes(shapes: Shapes) -> str:
    return ",".join("x".join(map(str, s)) for s in shapes)


def report(
    info: dict[str, Any], checks: list[dict], rows: list[dict], example: dict | None, wall_s: float
) -> str:
    """The Markdown report: versions, the correctness table, the side-by-side table."""
    peaks = next((p for k, p in PEAKS.items() if k in info["device_kind"]), None)
    lines = [
        f"# Hardware check: {info['device_kind']} ({info['date']})",
        "",
        f"jax {info['jax']}, Python {info['python']}, backend {info['backend']}, runtime "
        f"{info['runtime'] or '-'}; L2 {info.get('l2_bytes', 'unknown')} bytes; "
        f"{wall_s:.0f} s in all. Command: `{' '.join(sys.argv)}`.",
        "",
        "## Default configurations against the references (awkward shapes)",
        "",
        "| kernel | dtype | shapes | verdict | max error | note |",
        "|---|---|---|---|---|---|",
    ]
    for c in checks:
        lines.append(
            f"| {c['kernel']} | {c['dtype']} | {c['shapes']} | {'ok' if c['ok'] else 'FAIL'} "
            f"| {c['max_error']:.2e} | {c['note'][:100]} |"
        )
    lines += [
        "",
        "## Tuned, default and vendor, side by side (medians of interleaved rounds, one timer)",
        "",
        "| case | shapes | timer | default | tuned | vendor | tuned/vendor | speedup | repeat spread "
        "| TFLOP/s | TB/s | % of peak | trials (ok/rejected) | trial timers | tuning s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tflops, tbs = r["tflops"], r["tb_per_s"]
        peak = ""
        if peaks:
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
    if example is not None:
        lines += [
            "",
            f"README example ({README_EXAMPLE.lstrip('# ')}): exit code {example['rc']}, "
            f"{example['wall_s']} s; last lines:",
            "",
            *[f"    {line}" for line in example["output"]],
        ]
    lines += ["", "Tuned configurations, and the first error of each kind of failed trial:", ""]
    for r in rows:
        lines.append(f"- {r['case']}: {r['tuned_config']} (default {r['default_config']})")
        lines += [f"  - {status}: {error}" for status, error in r["trial_errors"].items()]
    return "\n".join(lines) + "\n"


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{100 * value:.1f}%"
    return f"{value:.2f}{unit}"


# ------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=480.0, help="the whole check's time budget")
    p.add_argument(
        "--smoke", action="store_true", help="tiny shapes on this host (interpret mode on a CPU)"
    )
    p.add_argument("--kernels", help="comma-separated kernel names (default: every case)")
    p.add_argument(
        "--readme-example-s",
        type=float,
        default=90.0,
        help="time for the README's JAX Hopper matmul example (on a GPU only; 0: skip it)",
    )
    p.add_argument(
        "--train-step-s",
        type=float,
        default=600.0,
        help="time for benchmarks/train_step.py after the cases (on a GPU only; 0: skip it)",
    )
    p.add_argument(
        "--out",
        help="folder for the report (default: benchmarks/results; --smoke: a temporary one)",
    )
    args = p.parse_args(argv)
    start = time.perf_counter()
    # this process and each tuning run's device worker share the GPU: none may take it all
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import autotune.kernels  # noqa: F401  (registers the shipped kernels)
    except ModuleNotFoundError as e:
        # the shipped kernels install under the package (autotune.kernels): a bare checkout on
        # PYTHONPATH lacks them
        sys.exit(
            f"{e}: install the project first (pip install -e ., or its wheel: see benchmarks/README.md)"
        )
    from autotune.device import current_device

    cases = [c for c in CASES if not args.kernels or c.kernel in args.kernels.split(",")]
    # Mosaic GPU kernels last: a kernel that breaks the GPU's context breaks what runs after it
    checked = sorted({c.kernel for c in cases}, key=lambda k: (k.endswith("_mgpu"), k))
    if args.smoke:
        cases = [c for c in cases if c.smoke_shapes is not None]
        print(SMOKE_SKIPS)
    device = current_device()
    info = versions(device)
    print(
        f"device {info['device_kind']} ({info['platform']}, {info['backend']}), jax {info['jax']}"
    )
    print("default configurations against the references:")
    checks = correctness(checked, args.smoke)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(args.out) if args.out else Path(tmp) if args.smoke else RESULTS
        out_dir.mkdir(parents=True, exist_ok=True)
        name = f"{info['device_kind'].replace(' ', '_')}-{info['date'][:10]}"

        example: dict[str, Any] | None = None

        def write() -> str:  # after every case: a check cut short keeps what it measured
            text = report(info, checks, rows, example, time.perf_counter() - start)
            (out_dir / f"{name}.md").write_text(text)
            doc = {
                "versions": info,
                "correctness": checks,
                "cases": rows,
                "readme_example": example,
            }
            (out_dir / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str))
            return text

        db = os.path.join(tmp, "check.db")
        run_example = info["platform"] == "gpu" and args.readme_example_s > 0
        budget = args.budget_s - (args.readme_example_s if run_example else 0.0)
        print("tuning (autotune tune) and timing side by side:")
        for i, case in enumerate(cases):
            shapes = case.smoke_shapes if args.smoke else case.shapes
            # this case's share of what is left, after ~10 s per case for the side-by-side timing
            # and ~10 s for the CLI's start-up, its device worker's and the oracle
            left = budget - (time.perf_counter() - start) - 10.0 * (len(cases) - i)
            share = case.share / sum(c.share for c in cases[i:])
            time_limit = max(5.0, left * share - 10.0)
            outcome = tune(case, shapes, db, time_limit, args.smoke)
            try:
                rows.append({**side_by_side(case, shapes, db, args.smoke), **outcome})
            except Exception as e:  # one failing case must not lose the others' figures
                print(f"  {case.label}: side-by-side failed: {type(e).__name__}: {e}"[:300])
            write()
        if run_example:
            example = readme_example(args.readme_example_s)
        if info["platform"] == "gpu" and args.train_step_s > 0:
            script = [sys.executable, str(ROOT / "benchmarks" / "train_step.py"), *TRAIN_STEP_CASE]
            try:
                train = subprocess.run(
                    script, capture_output=True, text=True, timeout=args.train_step_s
                )
                print(f"training step, rc {train.returncode}:\n{train.stdout[-2500:]}")
            except subprocess.TimeoutExpired:
                print(f"training step: stopped after {args.train_step_s:.0f} s")
        print(write())
        print(f"wrote {out_dir / name}.md and .json")
    ok = all(c["ok"] for c in checks) and all(r.get("tuned_ok", False) for r in rows)
    return 0 if ok and len(rows) == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
