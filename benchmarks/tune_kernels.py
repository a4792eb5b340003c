"""Tune the registered kernels on this machine's platform and print what the tuning cost.

    PYTHONPATH=. python benchmarks/tune_kernels.py [--trials 12] [--no-isolate] [--out FILE]

Per kernel and shape: trials, rejected, crashed (crashed or timeout), the best configuration,
its median and the default's (both from the interleaved finalist re-measurement, side by side),
the speedup, the tuning wall time (with the device worker's start-up and the oracle's share),
and the harness overhead: the share of the wall time spent neither compiling nor running the
kernel (candidates, finalists, and the interpret-mode oracle count as compiling and running;
search, bookkeeping, worker start-up and storing are overhead). Nothing here is served: each run writes to a throw-away database.

The kernels are the registry's: each that declares an example, at its example's shapes, dtypes
and static arguments (on a CPU none whose backend's interpret mode simulates a GPU: Mosaic
GPU's); on an accelerator the prepared shapes of PREPARED first, at --dtype.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

# (kernel, argument shapes) of realistic size, tuned on an accelerator at --dtype, before the
# registered kernels' examples
PREPARED = [
    ("vector_add", [(1 << 24,), (1 << 24,)]),
    ("matmul", [(2048, 2048), (2048, 2048)]),
    ("matmul", [(4096, 1024), (1024, 4096)]),
]


def cases(on_cpu: bool, dtype: str) -> list[tuple[str, list, dict]]:
    """(kernel, its arguments as jax.ShapeDtypeStruct, its static arguments), in order."""
    import jax

    from autotune import backends, registry

    out = (
        []
        if on_cpu
        else [(k, [jax.ShapeDtypeStruct(s, dtype) for s in shapes], {}) for k, shapes in PREPARED]
    )
    for name, kernel in registry.registered().items():
        example = kernel.spec.example
        if example is None or (on_cpu and backends.get(kernel.spec.backend).slow_interpret):
            continue
        out.append((name, example.arrays(), dict(example.static)))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--no-isolate", dest="isolate", action="store_false")
    p.add_argument("--dtype", default="float32", help="the prepared cases' (accelerator only)")
    p.add_argument("--out", help="also write the table to this file")
    args = p.parse_args()

    on_cpu = _on_cpu(os.environ.get("JAX_PLATFORMS", ""))
    worker_platforms = None
    if args.isolate:  # as the CLI does: the device is the worker's, this process keeps to the CPU
        worker_platforms = os.environ.get("JAX_PLATFORMS", "")
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    from autotune.signature import ArgSpec, dtype_name, format_args
    from autotune.tuning.task import task_of_call
    from autotune.tuning.tune import tune
    from autotune.tuning.worker import DeviceWorker

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "bench.db")
        platform = None
        # one worker for every task, as a job would run them: one start-up, reported on the first
        worker = None
        start_s = total_wall = total_measured = 0.0
        for kernel, inputs, static in cases(on_cpu, args.dtype):
            if args.isolate and worker is None:
                started = time.perf_counter()
                worker = DeviceWorker(task_of_call(kernel, []), [], platforms=worker_platforms)
                start_s = time.perf_counter() - started
            r = tune(
                kernel,
                inputs,
                kwargs=static,
                n_trials=args.trials,
                db=db,
                seed=0,
                worker=worker,
            )
            platform = f"{r.key.platform} / {r.key.device_kind} / {r.key.backend}"
            measured = sum((t.compile_s or 0.0) + (t.run_s or 0.0) for t in r.trials)
            measured += r.finalists_s + r.oracle_s  # the oracle: the default, interpreted
            total_wall += r.wall_s
            total_measured += measured
            rows.append(
                {
                    "kernel": kernel,
                    "arguments": format_args(
                        tuple(ArgSpec(tuple(a.shape), dtype_name(a.dtype)) for a in inputs)
                    ),
                    "trials": len(r.trials),
                    "rejected": r.n_rejected,
                    "crashed": r.n_crashed,
                    "best config": " ".join(f"{k}={v}" for k, v in sorted(r.best_config.items())),
                    "best ms": f"{r.best_time_s * 1e3:.4f}",
                    "default ms": f"{r.default_time_s * 1e3:.4f}" if r.default_time_s else "failed",
                    "speedup": f"{r.speedup:.2f}x" if r.speedup else "n/a",
                    "wall s": f"{r.wall_s:.2f}",
                    "set-up s": f"{r.worker_start_s:.2f}",
                    "oracle s": f"{r.oracle_s:.2f}",
                    "overhead": f"{100 * (r.wall_s - measured) / r.wall_s:.1f}%",
                }
            )
        if worker is not None:
            worker.close()
    mode = "device worker" if args.isolate else "in process"
    total = total_wall + start_s
    text = (
        f"platform {platform}; {mode}; {args.trials} trials; jax {jax.__version__}\n"
        + _table(rows)
        + f"\nall tasks: {total:.2f} s wall, the worker's one start-up ({start_s:.2f} s) included; "
        f"harness overhead {100 * (total - total_measured) / total:.1f}%"
    )
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


def _on_cpu(platforms: str) -> bool:
    """Whether candidates will run on the CPU, decided without touching any device: JAX_PLATFORMS
    says so, or no accelerator plugin that jax would load is installed."""
    import importlib.util

    if platforms.strip().lower() == "cpu":
        return True
    plugins = ("libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin")
    return not any(importlib.util.find_spec(m) for m in plugins)


def _table(rows: list[dict]) -> str:
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


if __name__ == "__main__":
    sys.exit(main())
