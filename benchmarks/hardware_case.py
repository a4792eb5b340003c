"""One step of the hardware check, in its own process (`hardware_check.py` starts it, with a
timeout): a case (a kernel at its default configuration against its reference on awkward
shapes, then `autotune tune` of it at a realistic shape, then the default, tuned and vendor calls
side by side), or one of the extras (a script, its output streamed as it comes).

    python benchmarks/hardware_case.py JOB.json RESULT.json

JOB.json says what to run (`hardware_check.job`). RESULT.json is rewritten after each section, so
a case stopped by its timeout keeps what it measured; its `stage` names the section it was in.
A fault in this process (a sticky CUDA error, a crash) ends this case only.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
Shapes = list[list[int]]


def format_shapes(shapes: Shapes) -> str:
    return ",".join("x".join(map(str, s)) for s in shapes)


# The backward kernels take the forward's log-sum-exp and delta = rowsum(dO * O) in float32
# beside their 16-bit q, k, v and dO: how many of their last arguments are float32 whatever the
# case's dtype.
FLOAT32_TAIL = {"flash_attention_dq": 2, "flash_attention_dkv": 2}
# Attention's dots of one call, in units of b * h * sq * sk * d multiply-adds (x2 flops): the
# forward's two (scores, p @ v), dq's three (scores, dp, ds @ k), dkv's four (and dv, dk).
ATTENTION_DOTS = {"flash_attention": 2, "flash_attention_dq": 3, "flash_attention_dkv": 4}
# what each attention kernel writes, in q-sized arrays: out; dq; dk and dv
ATTENTION_OUTPUTS = {"flash_attention": 1, "flash_attention_dq": 1, "flash_attention_dkv": 2}


def arg_dtypes(kernel: str, dtype: str, n: int) -> list[str]:
    """The dtypes of a kernel's `n` arguments in a case of `dtype`; for a case at its example
    (a kernel hardware_check knows from its registration), the example's own."""
    tail = FLOAT32_TAIL.get(kernel)
    if tail is None:
        from autotune import registry

        example = registry.resolve(kernel).spec.example
        if example is not None and len(example.args) == n and example.args[0].dtype == dtype:
            return [a.dtype for a in example.args]
        tail = 0
    return [dtype] * (n - tail) + ["float32"] * tail


def work(kernel: str, dtype: str, static: dict, shapes: Shapes) -> tuple[float, float]:
    """(floating-point operations, bytes read and written) of one call."""
    itemsize = 2 if dtype == "bfloat16" else 4
    elems = sum(math.prod(s) for s in shapes)
    if kernel in ("matmul", "matmul_mgpu", "bmm"):
        *batch, m, k = shapes[0]
        n = shapes[1][-1]
        b = math.prod(batch)
        return 2.0 * b * m * k * n, float((elems + b * m * n) * itemsize)
    if kernel in ATTENTION_DOTS:
        b, h, s, d = shapes[0]
        causal = 0.5 if static.get("causal") else 1.0
        flops = 2.0 * ATTENTION_DOTS[kernel] * b * h * s * s * d * causal
        return flops, float((elems + ATTENTION_OUTPUTS[kernel] * b * h * s * d) * itemsize)
    out = math.prod(shapes[0])  # elementwise and row-wise: one output of the first shape
    return 0.0, float((elems + out) * itemsize)


def vendor_op(kernel: str, dtype: str, static: dict) -> tuple[str, Callable | None]:
    """The vendor library's (or XLA's) operation for the same call; attention, forward or
    backward: None (see `attention_ops`)."""
    import jax
    import jax.numpy as jnp

    from autotune.kernels import layer_norm_reference, rms_norm_reference

    # float32 in float32, as the kernels compute it; other dtypes as XLA does by default
    precision = "highest" if dtype == "float32" else None
    ops: dict[str, tuple[str, Callable | None]] = {
        "matmul": ("jnp.dot (cuBLAS on GPU)", functools.partial(jnp.dot, precision=precision)),
        "bmm": ("jnp.matmul (cuBLAS on GPU)", functools.partial(jnp.matmul, precision=precision)),
        "softmax": ("jax.nn.softmax (XLA)", functools.partial(jax.nn.softmax, axis=-1)),
        "rms_norm": ("plain JAX (XLA fused)", rms_norm_reference),
        "layer_norm": ("plain JAX (XLA fused)", layer_norm_reference),
        "vector_add": ("x + y (XLA)", jnp.add),
        "flash_attention": ("jax.nn.dot_product_attention", None),
    }
    ops["matmul_mgpu"] = ops["matmul"]
    # dq's and dkv's rows each against the whole backward, which computes dq, dk and dv at once
    # from its forward's residuals (as our kernels take the forward's lse and delta)
    backward = (
        "the VJP of jax.nn.dot_product_attention (dq, dk and dv together, its forward's "
        "residuals computed before the timed call)",
        None,
    )
    ops["flash_attention_dq"] = ops["flash_attention_dkv"] = backward
    if kernel not in ops:  # a kernel known from its registration: its reference, by XLA
        from autotune import registry

        reference = registry.resolve(kernel).spec.reference
        return "its reference (XLA)", functools.partial(reference, **static)
    return ops[kernel]


def attention_ops(
    causal: bool, implementation: str, precision: str, backward: bool
) -> tuple[Callable, Callable]:
    """jax.nn.dot_product_attention by `implementation` ("cudnn", "xla") on its
    [B, S, H, D] layout, float32 at `precision`; with `backward`, its VJP alone: dq, dk and dv
    from the forward's residuals and dO. And what turns the kernel's [B, H, S, D] arguments
    into its inputs, outside the timed call: views as [B * H, S, 1, D] (`heads_as_batch`, no
    transpose); for the backward, the forward run once and its residuals (cuDNN's output and
    softmax statistics, or XLA's) passed with dO, as our dq and dkv take the forward's lse and
    delta: timing `jax.vjp(forward, ...)` whole would count the vendor's forward too."""
    import jax

    from autotune.kernels.attention_mgpu.attention_mgpu import heads_as_batch

    def forward(q, k, v):
        with jax.default_matmul_precision(precision):
            return jax.nn.dot_product_attention(
                q, k, v, is_causal=causal, implementation=implementation
            )

    if not backward:

        def to_native(args: list) -> list:
            return [jax.block_until_ready(heads_as_batch(a)) for a in args[:3]]

        return forward, to_native
    residuals: list = []  # the VJP's structure, set by to_native

    def grads(*leaves_and_do):
        *leaves, do = leaves_and_do
        with jax.default_matmul_precision(precision):
            return jax.tree_util.tree_unflatten(residuals[0], leaves)(do)

    def to_native(args: list) -> list:
        q, k, v, do = (heads_as_batch(a) for a in args[:4])
        _, vjp = jax.vjp(forward, q, k, v)
        leaves, structure = jax.tree_util.tree_flatten(vjp)
        residuals[:] = [structure]
        return [jax.block_until_ready(a) for a in (*leaves, do)]

    return grads, to_native


# ------------------------------------------------------------------------------- the sections


def versions() -> dict[str, Any]:
    import jax

    from autotune.device import current_device

    device = current_device()
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


def inputs(kernel: str, shapes: Shapes, dtype: str, seed: int = 0) -> list[Any]:
    import jax

    from autotune import registry
    from autotune.measure.inputs import task_inputs

    dtypes = arg_dtypes(kernel, dtype, len(shapes))
    args = [jax.ShapeDtypeStruct(tuple(s), d) for s, d in zip(shapes, dtypes)]
    # integer data arguments (group sizes, page tables) made by the kernel's default workload
    return task_inputs(registry.resolve(kernel).spec, args, seed)


def correctness(
    kernel_name: str, dtypes: list[str], shapes: Shapes, static: dict
) -> list[dict[str, Any]]:
    """The kernel at its default configuration against its reference, in each dtype."""
    import jax
    import numpy as np

    from autotune import registry
    from autotune.device import current_device
    from autotune.measure.verify import compare

    spec = registry.resolve(kernel_name).spec
    rows = []
    for dtype in dtypes:
        args = inputs(kernel_name, shapes, dtype)
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
            ok, err, note = False, None, f"{type(e).__name__}: {e}"[:300]
        rows.append(
            {
                "kernel": kernel_name,
                "dtype": dtype,
                "shapes": format_shapes(shapes),
                "config": config,
                "ok": ok,
                "max_error": err,
                "note": note,
                "seconds": round(time.perf_counter() - start, 2),
            }
        )
        err_text = "-" if err is None else f"{err:.2e}"
        print(
            f"  {kernel_name:16} {dtype:9} {'ok' if ok else 'FAIL'}  max error {err_text} {note}"[
                :200
            ]
        )
    return rows


# What a step keeps in hand past what it plans to need after its tune: the interpreter's exit,
# the last write of its result.
STEP_SLACK_S = 2.0


def tune_limits(job: dict[str, Any], now: float) -> tuple[float, float] | None:
    """The tune's --time-limit and the time it is stopped after, from what the step has left
    at `now` (seconds since the epoch) once what it needs after the tune is set aside (its
    checks, its side by side: `after_tune_s`), so that those always run; None where that
    leaves no search worth starting (1 s, past the tune's usual overrun)."""
    left = job["limit_s"] - (now - job["started_at"]) - job["after_tune_s"] - STEP_SLACK_S
    timeout = min(job["tune_timeout_s"], left)
    search = min(job["time_limit_s"], timeout - job["tune_past_limit_s"])
    return None if search < 1.0 else (search, timeout)


def tune(job: dict[str, Any]) -> dict[str, Any]:
    """`autotune tune` for the case, as a user runs it, within what the step has left
    (`tune_limits`); the tuning wall time and its trials."""
    limits = tune_limits(job, time.time())
    if limits is None:
        print("  tune skipped: the step has no time left beyond its checks and side by side")
        return {"rc": None, "tune_wall_s": 0.0, "tune_output": ["skipped: no time left"]}
    search_s, timeout_s = limits
    cmd = [sys.executable, "-m", "autotune.cli", "tune", job["kernel"]]
    dtypes = ",".join(arg_dtypes(job["kernel"], job["dtype"], len(job["shapes"])))
    cmd += ["--shape", format_shapes(job["shapes"]), "--dtype", dtypes, "--db", job["db"]]
    cmd += ["--seed", "0", "--trials", str(job["trials"])]
    cmd += ["--time-limit", f"{search_s:.0f}"]
    if job[
        "smoke"
    ]:  # a CPU needs no isolation from crashing candidates, and saves a worker's start
        cmd.append("--no-isolate")
    for k, v in job["static"].items():
        cmd += ["--static", f"{k}={json.dumps(v)}"]
    start = time.perf_counter()
    # stopped past its share of the step, the side by side still times the default (and what
    # the tune stored); its own process group, so that its device worker ends with it and the
    # device (a TPU's one process) is free for the checks after it
    rc, lines, errors = stream(cmd, timeout_s, lambda _: None)
    tail = (
        (lines + errors.splitlines())[-3:]
        if rc is not None
        else [f"stopped after {timeout_s:.0f} s"]
    )
    wall = time.perf_counter() - start
    print(f"  tune rc {rc}  {wall:6.1f} s  {' | '.join(tail)[:160]}")
    return {
        "rc": rc,
        "tune_wall_s": round(wall, 1),
        "tune_output": tail,
        "tune_limit_s": round(search_s, 1),
    }


def side_by_side(job: dict[str, Any]) -> dict[str, Any]:
    """The default, tuned and vendor calls timed interleaved with one timer; the tuned config
    checked against the reference at this shape and timed twice more for its repeat spread."""
    import jax
    import numpy as np

    from autotune import registry
    from autotune.db import TuningDB
    from autotune.device import current_device
    from autotune.measure.compiling import compile_config
    from autotune.measure.timing import (
        TimingPolicy,
        cache_bytes,
        interleaved,
        rotation_sets,
        time_compiled,
    )
    from autotune.measure.verify import compare

    device = current_device()
    spec = registry.resolve(job["kernel"]).spec
    static = job["static"]
    args = inputs(job["kernel"], job["shapes"], job["dtype"])
    sig = spec.signature(args, static, device)
    key = spec.key(sig, device)
    with TuningDB(job["db"]) as handle:
        entry = handle.best(key)
        trials = handle.trials(**key.as_dict())
    default = spec.default_config(sig)
    tuned = entry.config if entry else None
    vendor_name, vendor, native = _vendor(job, args)
    # one list of inputs for every call, the kernel's then the vendor's where they differ, so
    # that the calls interleave and rotate through the same copies
    n = len(args)
    every = args + native if native is not args else args
    off = n if native is not args else 0

    def kernel_call(config: dict[str, Any]) -> Callable:
        exe = compile_config(spec, config, args, static).executable
        return lambda *a: exe(*a[:n])

    vendor_exe = jax.jit(vendor).lower(*native).compile()
    calls = {"default": kernel_call(default)}
    if tuned is not None:
        calls["tuned"] = kernel_call(tuned)
    calls["vendor"] = lambda *a: vendor_exe(*a[off : off + len(native)])
    policy = TimingPolicy(max_time_s=0.05 if job["smoke"] else 0.5)
    sets = [every, *rotation_sets(every, cache_bytes(device))]
    samples, timer = interleaved(
        list(calls.values()), sets, rounds=5, reps=3 if job["smoke"] else 10, policy=policy
    )
    median = {name: _median(s) for name, s in zip(calls, samples)}
    vendor_kernels = cupti_kernels(calls["vendor"], every)
    row: dict[str, Any] = {
        "timer": timer,
        "default_config": default,
        "tuned_config": tuned,
        "vendor": vendor_name,
        "vendor_counted": COUNTED[timer],
        "vendor_kernels": vendor_kernels,
        **{f"{name}_s": t for name, t in median.items()},
        "trials": len(trials),
        "trials_ok": sum(t.status == "ok" for t in trials),
        "trials_rejected": sum(t.status == "rejected" for t in trials),
        "trial_timers": sorted({t.timer for t in trials if t.timer}),
        # the first error of each kind of failed trial: a rejection's or a crash's reason
        "trial_errors": {
            t.status: short_error(t.error) for t in reversed(trials) if t.status != "ok"
        },
    }
    if tuned is not None:
        out = jax.block_until_ready(calls["tuned"](*every))
        ref = jax.tree_util.tree_map(
            lambda r, o: np.asarray(r).astype(o.dtype), spec.reference(*args, **static), out
        )
        verdict = compare(out, ref, static.get("precision"))
        again = [time_compiled(calls["tuned"], every, policy, sets[1:]) for _ in range(2)]
        row.update(
            tuned_ok=verdict.ok,
            tuned_max_error=verdict.max_error,
            repeat_spread=abs(again[0].median_s / again[1].median_s - 1.0),
            repeat_timer=again[0].timer,
            tuned_over_vendor=_ratio(median["vendor"], median["tuned"]),
            tuned_speedup=_ratio(median["default"], median["tuned"]),
        )
    flops, nbytes = work(job["kernel"], job["dtype"], static, job["shapes"])
    best = median.get("tuned") or median["default"]
    row["tflops"] = flops / best / 1e12 if flops and best else None
    row["tb_per_s"] = nbytes / best / 1e12 if best else None
    print(
        f"  {timer:5}  default {ms(median['default'])}  tuned {ms(median.get('tuned'))}  "
        f"vendor {ms(median['vendor'])}"
    )
    return row


def cupti_kernels(call: Callable, args: list) -> list[tuple[str, float]] | None:
    """The kernels one call launches and each one's milliseconds, from CUPTI without summing
    them; None where CUPTI is not here (off a GPU)."""
    import jax

    from autotune.measure.timing import cupti_extension

    ext = cupti_extension()
    if ext is None:
        return None
    jax.block_until_ready(call(*args))
    try:
        ext._cupti_init()
    except RuntimeError:  # CUPTI refused here (profiling restricted): the timer fell back too
        return None
    try:
        jax.block_until_ready(call(*args))
    finally:
        timings = ext._cupti_get_timings(False)
    return [(name[:80], round(ms, 4)) for name, ms in timings]


# What a timer's figure for the vendor's call counts.
COUNTED = {
    "cupti": "its kernels' durations, summed (CUPTI), on its native layout: no transposes",
    "trace": "its kernels' durations, summed (profiler trace), on its native layout",
    "wall": "the host's clock around each synchronised call",
}


def short_error(text: str | None) -> str:
    """A trial's error for the report: its start, and what the device worker logged meanwhile
    (the device's own words: see autotune.tuning.worker.parent) in full."""
    head, logged, tail = (text or "").partition("; stderr: ")
    return head[:300] + (f" ... stderr: {tail[-1600:]}" if logged else "")


def _vendor(job: dict[str, Any], args: list) -> tuple[str, Callable, list]:
    """The vendor's operation for the call, and its inputs: `args`, or their views on its
    native layout (attention: cuDNN where it runs for these inputs, else XLA's; float32 at the
    kernel's own precision, "highest")."""
    import jax

    from autotune.kernels.precision import dot_precision

    name, op = vendor_op(job["kernel"], job["dtype"], job["static"])
    if op is not None:
        return name, op, args
    gpu = job["platform"] == "gpu" and not job["smoke"]
    for implementation in (["cudnn"] if gpu else []) + ["xla"]:
        op, to_native = attention_ops(
            job["static"].get("causal", False),
            implementation,
            dot_precision(None, job["dtype"]),
            backward=job["kernel"] != "flash_attention",
        )
        native = to_native(args)
        try:
            jax.block_until_ready(jax.jit(op)(*native))
        except Exception as e:  # cuDNN refuses some shapes, dtypes and GPUs
            print(f"  attention through {implementation}: {type(e).__name__}: {str(e)[:120]}")
            continue
        return f"{name} ({implementation})", op, native
    raise RuntimeError("no attention implementation runs here")


def _median(samples: list[float]) -> float | None:
    """The median, or None where there are no samples (never NaN: a report shows '-')."""
    import statistics

    return statistics.median(samples) if samples else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.4f} ms"


README_EXAMPLE = "### JAX's own Hopper matmul, tuned without editing it"


# The scripts of hardware_check's extras (besides the README's example), at the sizes an
# accelerator run gives them: the calls (bf16 4096^3 matmul, 4x16x2048x128 causal
# attention) for the groups, each member tuned into the check's database ({db}: what the cases
# tuned warm-starts them, and the export ships their choices too); a transformer block at batch
# 1, 1024 tokens, d_model 1024, 8 heads for the step. Each fits its searches to its --budget-s
# (the step's time limit less the script's own start, SCRIPT_START_S), each search at most
# --time-limit; the step's process is capped by the plan.
EXTRA_SCRIPTS = {
    "groups_matmul": ["variant_groups.py", "--group", "matmul_variants", "--trials", "16",
                      "--time-limit", "6", "--db", "{db}", "--budget-s", "{budget}"],
    "groups_attention": ["variant_groups.py", "--group", "attention_variants", "--trials", "16",
                         "--time-limit", "6", "--db", "{db}", "--budget-s", "{budget}"],
    "train_step": ["train_step.py", "--batch", "1", "--seq", "1024", "--d-model", "1024",
                   "--heads", "8", "--trials", "3", "--time-limit", "3", "--budget-s", "{budget}"],
}  # fmt: skip
SCRIPT_START_S = 5.0  # a script's interpreter and imports, before its own clock starts
OUTPUT_KEPT = 40  # an extra's last lines of output, in the report


def readme_code() -> str:
    """The README's example that tunes JAX's own Mosaic GPU matmul, as a user would paste it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(README_EXAMPLE) :]
    return section[
        section.index("```python\n") + 10 : section.index("\n```", section.index("```python"))
    ]


def extra_command(extra: str, db: str, timeout_s: float) -> list[str]:
    """The process an extra runs, stopped after `timeout_s`."""
    if extra == "readme":
        return [sys.executable, "-c", readme_code()]
    script, *args = EXTRA_SCRIPTS[extra]
    budget = f"{max(1.0, timeout_s - SCRIPT_START_S):.0f}"
    args = [a.format(db=db, budget=budget) for a in args]
    return [sys.executable, str(ROOT / "benchmarks" / script), *args]


def stream(
    command: list[str], timeout_s: float, on_line: Callable[[list[str]], None]
) -> tuple[int | None, list[str], str]:
    """Run `command`, passing its stdout's lines so far to `on_line` as each comes; stopped
    with everything it started after `timeout_s` (exit code None). Returns the exit code, the
    lines and the end of its stderr."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # its lines as they are printed
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, text=True, env=env,
            start_new_session=True,
        )  # fmt: skip
        lines: list[str] = []

        def read() -> None:
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                on_line(lines)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
        reader.join(timeout=5)
        errors.seek(0)
        tail = errors.read().decode(errors="replace").strip().splitlines()[-10:]
    return rc, lines, "\n".join(tail)


def run_extra(
    extra: str, timeout_s: float, db: str, save: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """One of hardware_check's extras, its output printed and saved (`save`) line by line:
    stopped at its time limit, it still shows where it was. Its exit code, time and last lines
    (a table, for the scripts), with its stderr's end when it failed."""
    start = time.perf_counter()

    def on_line(lines: list[str]) -> None:
        print(f"  | {lines[-1]}", flush=True)
        save({"rc": None, "wall_s": round(time.perf_counter() - start, 1),
              "output": lines[-OUTPUT_KEPT:]})  # fmt: skip

    rc, lines, errors = stream(extra_command(extra, db, timeout_s), timeout_s, on_line)
    output = lines[-OUTPUT_KEPT:]
    if rc is None:
        output.append(f"stopped at its time limit, {timeout_s:.0f} s")
    elif rc != 0:
        output += errors.splitlines()
    wall = time.perf_counter() - start
    print(f"  {extra}: rc {rc}, {wall:.1f} s")
    return {"rc": rc, "wall_s": round(wall, 1), "output": output}


# ------------------------------------------------------------------------------- main


def main(job_path: str, result_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    result: dict[str, Any] = {"stage": "start-up"}

    def save(stage: str) -> None:  # after each section: a case cut short keeps what it has
        result["stage"] = stage
        # whole or not at all: the parent may kill this process at any moment
        partial = Path(f"{result_path}.tmp")
        partial.write_text(json.dumps(result, indent=1, default=str))
        partial.replace(result_path)

    if job.get("extra"):

        def partial(extra: dict[str, Any]) -> None:
            result["extra"] = extra
            save(job["extra"])

        save(job["extra"])
        result["extra"] = run_extra(job["extra"], job["timeout_s"], job["db"], partial)
        save("done")
        return 0
    import autotune.kernels  # noqa: F401  (registers the shipped kernels; no device touched)

    # the tune first, its processes ended before this one touches the device: a TPU admits
    # one process, and the tune's device worker is another
    if job["shapes"] is not None:  # None: correctness only (a smoke run of a simulated kernel)
        save("tuning")
        result.update(tune(job))
    save("correctness")
    if job["check_dtypes"]:
        result["correctness"] = correctness(
            job["kernel"], job["check_dtypes"], job["check_shapes"], job["check_static"]
        )
    if job["shapes"] is None:
        save("done")
        return 0
    save("side by side")
    result.update(side_by_side(job))
    save("done")
    return 0


if __name__ == "__main__":
    code = main(*sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # the result is written: the interpreter's teardown (jax's, the compile threads') takes
    # seconds on a busy host and is no part of the step; the parent's time limit counts it
    os._exit(code)
