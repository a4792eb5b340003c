"""What an eager @autotuned call costs over calling the same jitted kernel by hand.

Run: python benchmarks/lookup_overhead.py [--calls N]

For each case a tuned entry is stored in a fresh SQLite file, so the decorated call is a
database hit. Three functions are timed, interleaved (each round in a rotating order): a direct
call of `jax.jit(kernel with that config)`; the decorated kernel (one jitted entry per kernel,
into jit's C++ dispatch); and the former eager path, reproduced here as it was before that
change (a dict lookup keyed by the arguments' shapes and dtypes, then the jitted executable of
the config). Two timings: each call to completion (block_until_ready), and dispatch (batches
of calls, then one block: what a loop of eager calls costs per call while the device keeps up).
Medians, with each path's ratio to the direct call. Then the jaxpr of the decorated call under
jax.jit is compared with the hand-configured one, and the import times of `jax` and `autotune`
are measured in fresh processes.
"""

from __future__ import annotations

import argparse
import operator
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import autotune  # noqa: E402
from autotune import BestEntry, TuningDB  # noqa: E402
from autotune.device import current_device  # noqa: E402
from autotune.kernels import flash_attention, matmul, vector_add  # noqa: E402

CASES = [  # (name, kernel, argument shapes, tuned config)
    ("vector_add f32 128 (tiny: worst case)", vector_add, [(128,), (128,)], {"block": 128}),
    ("vector_add f32 4096", vector_add, [(4096,), (4096,)], {"block": 1024}),
    ("matmul f32 64x128 @ 128x64", matmul, [(64, 128), (128, 64)],
     {"block_m": 64, "block_n": 64, "block_k": 128}),
    ("matmul f32 256x256 @ 256x256", matmul, [(256, 256), (256, 256)],
     {"block_m": 128, "block_n": 128, "block_k": 128}),
    # sm_scale: float | None = None, an option: its calls too enter jit directly
    ("flash_attention f32 1x2x128x64", flash_attention,
     [(1, 2, 128, 64)] * 3, {}),
]  # fmt: skip
BATCH = 50  # calls per dispatch timing; --calls N makes N // 10 such timings


def store(db_path: str, kernel, args, config) -> None:
    device = current_device()
    key = kernel.spec.key(kernel.spec.signature(args, {}, device), device)
    with TuningDB(db_path) as db:
        db.put_best(
            key, BestEntry(config, time_s=1e-3, n_trials=1, run_id="bench", strategy="grid")
        )


def platform_config(kernel, args, config: dict) -> dict:
    """The case's config where it is valid on this platform, else the kernel's defaults
    (e.g. on a GPU, whose space adds num_warps and num_stages; or where the case gives none)."""
    device = current_device()
    sig = kernel.spec.signature(args, {}, device)
    space = kernel.spec.space(device.platform)
    if space.check_stored(config) is None and space.is_valid(config, sig):
        return config
    return kernel.spec.default_config(sig)


_shape_dtype = operator.attrgetter("shape", "dtype")


class FormerPath:
    """The eager call path as it was before the jitted entry, for comparison: positional
    arrays keyed by (shape, dtype) in a process-wide dict, whose hit holds the executable."""

    def __init__(self, kernel, config: dict, args) -> None:
        self.kernel = kernel
        executable = jax.jit(kernel.spec.bound_function(config, interpret=True))
        self.memo = {(self, *map(_shape_dtype, args)): (config, executable)}

    def __call__(self, *args, **kwargs):  # the former AutotunedKernel.__call__, line for line
        if not kwargs:
            try:
                hit = self.memo.get((self, *map(_shape_dtype, args)))
            except (AttributeError, TypeError):
                hit = None
            if hit is not None:
                return hit[1](*args)
        raise AssertionError("the benchmark only makes memo hits")


def completion(fn, args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def dispatch(fn, args) -> float:
    start = time.perf_counter()
    for _ in range(BATCH):
        out = fn(*args)
    elapsed = time.perf_counter() - start
    jax.block_until_ready(out)
    return elapsed / BATCH


def interleaved(fns: dict, args, timer, rounds: int) -> dict[str, float]:
    """Median seconds per call of each function, timed round-robin in a rotating order."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            times[name].append(timer(fns[name], args))
    return {name: statistics.median(t) for name, t in times.items()}


def eager_rows(calls: int, db_path: str) -> list[list[str]]:
    rows = []
    for name, kernel, shapes, config in CASES:
        args = [jax.random.normal(jax.random.key(i), s, jnp.float32) for i, s in enumerate(shapes)]
        config = platform_config(kernel, args, config)
        store(db_path, kernel, args, config)
        autotune.configure(db=db_path)
        assert kernel.explain(*args)["source"] == "db"
        fns = {
            # what a user would write by hand: the kernel with this config, jitted (in
            # interpret mode only where the platform needs it, as the decorator does)
            "direct": jax.jit(kernel.spec.bound_function(config, interpret=True)),
            "before": FormerPath(kernel, config, args),
            "after": kernel,
        }
        for _ in range(20):  # compile all and warm up
            for fn in fns.values():
                completion(fn, args)
        for mode, timer, rounds in (
            ("to completion", completion, calls),
            ("dispatch", dispatch, max(calls // 10, 20)),
        ):
            t = interleaved(fns, args, timer, rounds)
            rows.append(
                [name, mode, f"{t['direct'] * 1e6:.2f}"]
                + [
                    f"{t[path] * 1e6:.2f} ({t[path] / t['direct']:.3f})"
                    for path in ("before", "after")
                ]
            )
    return rows


def jaxpr_check() -> str:
    x, y = jnp.ones((128, 256)), jnp.ones((256, 128))
    config = matmul.explain(x, y)["config"]
    hand = jax.jit(matmul.spec.bound_function(config, interpret=True))
    same = str(jax.make_jaxpr(lambda a, b: matmul(a, b))(x, y)) == str(
        jax.make_jaxpr(lambda a, b: hand(a, b))(x, y)
    )
    return "identical" if same else "DIFFERENT"


def import_time(module: str, runs: int = 5) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    times = [
        float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout)
        for _ in range(runs)
    ]  # fmt: skip
    return statistics.median(times)


def optuna_loaded() -> bool:
    code = "import sys, autotune; print('optuna' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return out.stdout.strip() == "True"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000, help="timed calls of each function")
    args = p.parse_args()
    device = current_device()
    mode = "Pallas interpret mode" if device.interpret else "compiled"
    print(f"jax {jax.__version__} on {device.device_kind} ({mode}), {args.calls} interleaved "
          f"calls each to completion, {args.calls // 10} batches of {BATCH} for dispatch, "
          "medians\n")  # fmt: skip
    header = ["kernel (db hit)", "timing", "direct jit µs", "before µs (ratio)", "after µs (ratio)"]
    # one throw-away database for both, open until the last lookup (a database deleted under
    # a process that uses it is refused, with a warning)
    with tempfile.TemporaryDirectory() as d:
        print(table(header, eager_rows(args.calls, os.path.join(d, "bench.db"))))
        print(f"\njaxpr under jax.jit, decorated vs hand-configured: {jaxpr_check()}")
    jax_s, autotune_s = import_time("jax"), import_time("autotune")
    print()
    print(table(["import", "median of 5 fresh processes"],
                [["import jax", f"{jax_s * 1e3:.0f} ms"],
                 ["import autotune", f"{autotune_s * 1e3:.0f} ms"]]))  # fmt: skip
    print(f"\n`import autotune` loads optuna: {'yes' if optuna_loaded() else 'no'}")


if __name__ == "__main__":
    main()
