"""What an @autotuned call costs over calling the same jitted kernel by hand.

Run: python benchmarks/lookup_overhead.py [--calls N]

For each case a tuned entry is stored in a fresh SQLite file, so the decorated call is a
database hit; the decorated call and a direct call of `jax.jit(kernel with that config)` are
timed alternately, each to completion (block_until_ready), and the medians are compared. Then
the jaxpr of the decorated call under jax.jit is compared with the hand-configured one, and the
import times of `jax` and `autotune` are measured in fresh processes.
"""

from __future__ import annotations

import argparse
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
from autotune import TuningDB  # noqa: E402
from autotune.device import current_device  # noqa: E402
from kernels import matmul, vector_add  # noqa: E402

CASES = [  # (name, kernel, argument shapes, tuned config)
    ("matmul f32 256x256 @ 256x256", matmul, [(256, 256), (256, 256)],
     {"block_m": 128, "block_n": 128, "block_k": 128}),
    ("matmul f32 64x128 @ 128x64", matmul, [(64, 128), (128, 64)],
     {"block_m": 64, "block_n": 64, "block_k": 128}),
    ("vector_add f32 1024 (tiny: worst case)", vector_add, [(1024,), (1024,)], {"block": 1024}),
]  # fmt: skip


def store(db_path: str, kernel, args, config) -> None:
    device = current_device()
    key = kernel.spec.key(kernel.spec.signature(args, {}, device), device)
    with TuningDB(db_path) as db:
        db.put_best(
            key,
            dict(
                config=config, time_s=1e-3, n_trials=1, n_rejected=0, run_id="bench",
                strategy="grid", timer="wall", jax_version="x", jaxlib_version="x",
            ),
        )  # fmt: skip


def platform_config(kernel, args, config: dict) -> dict:
    """The case's config where it is valid on this platform, else the kernel's defaults
    (e.g. on a GPU, whose space adds num_warps and num_stages)."""
    device = current_device()
    sig = kernel.spec.signature(args, {}, device)
    space = kernel.spec.space(device.platform)
    if space.check_stored(config) is None and space.is_valid(config, sig):
        return config
    return kernel.spec.default_config(sig)


def timed(fn, args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def eager_rows(calls: int) -> list[list[str]]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        db_path = os.path.join(d, "bench.db")
        for name, kernel, shapes, config in CASES:
            args = [
                jax.random.normal(jax.random.key(i), s, jnp.float32) for i, s in enumerate(shapes)
            ]
            config = platform_config(kernel, args, config)
            store(db_path, kernel, args, config)
            autotune.configure(db=db_path)
            assert kernel.explain(*args)["source"] == "db"
            # what a user would write by hand: the kernel with this config, jitted (in
            # interpret mode only where the platform needs it, as the decorator does)
            direct = jax.jit(kernel.bound_function(config, interpret=True))
            for _ in range(20):  # compile both and warm up
                timed(kernel, args), timed(direct, args)
            dec, hand = [], []
            for i in range(calls):  # interleaved, alternating which goes first
                pair = (kernel, direct) if i % 2 == 0 else (direct, kernel)
                for fn in pair:
                    (dec if fn is kernel else hand).append(timed(fn, args))
            md, mh = statistics.median(dec), statistics.median(hand)
            rows.append(
                [
                    name,
                    f"{mh * 1e6:.1f}",
                    f"{md * 1e6:.1f}",
                    f"{(md - mh) * 1e6:+.2f}",
                    f"{md / mh:.3f}",
                ]
            )
    return rows


def jaxpr_check() -> str:
    x, y = jnp.ones((128, 256)), jnp.ones((256, 128))
    config = matmul.explain(x, y)["config"]
    hand = jax.jit(matmul.bound_function(config, interpret=True))
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
    print(f"jax {jax.__version__} on {current_device().device_kind} (Pallas interpret mode), "
          f"{args.calls} interleaved calls each, medians\n")  # fmt: skip
    header = ["kernel (db hit)", "direct jit µs", "@autotuned µs", "added µs/call", "ratio"]
    print(table(header, eager_rows(args.calls)))
    print(f"\njaxpr under jax.jit, decorated vs hand-configured: {jaxpr_check()}")
    jax_s, autotune_s = import_time("jax"), import_time("autotune")
    print()
    print(table(["import", "median of 5 fresh processes"],
                [["import jax", f"{jax_s * 1e3:.0f} ms"],
                 ["import autotune", f"{autotune_s * 1e3:.0f} ms"]]))  # fmt: skip
    print(f"\n`import autotune` loads optuna: {'yes' if optuna_loaded() else 'no'}")


if __name__ == "__main__":
    main()
