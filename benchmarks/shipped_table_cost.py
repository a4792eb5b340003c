"""What a large shipped table (`tuned=`) costs the first call of a kernel that reads it.

Run: python benchmarks/shipped_table_cost.py [--entries 1000 150000] [--layout one per-kind]

Writes a table of `--entries` exported entries (spread over 10 kernels, 6 device kinds and many
shapes, one of them this kernel's call on this machine) into a temporary folder, as one JSON file
or one file per device kind (`--layout`), then, in a fresh process per row (so that nothing is cached and memory starts even),
registers a kernel whose `tuned=` is that folder and measures: the first call the table has an
entry for (its lookup reads the table; the kernel is a one-line jitted function, so the rest is
a few milliseconds of tracing and compiling), the process memory that call added (resident set,
MB), the first lookup of a shape the table lacks (the nearest tuned shape is searched), and a
second lookup of the call. Each row is the median of `--repeat` fresh processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KERNELS = 10
DEVICE_KINDS = ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "TPU v5 lite"]
DEVICE_KINDS += ["TPU v6 lite"]  # and this machine's own kind (added when the table is made)
PLATFORMS = {"NVIDIA": "gpu", "TPU": "tpu"}  # by the device kind's first word
TEMPLATE = {  # the fields `autotune db export` writes for each entry
    "config": {"block_rows": 16},
    "time_s": 1.9e-4,
    "n_trials": 40,
    "run_id": "5f0c2d7e9a4b4c1e8d6f3a2b1c0d9e8f",
    "strategy": "gp",
    "n_rejected": 0,
    "default_time_s": 2.6e-4,
    "speedup": 1.37,
    "timer": "cupti",
    "jax_version": "0.10.2",
    "jaxlib_version": "0.10.2",
    "runtime_version": "cuda 13.0",
    "host": "tuner-1",
    "tuned_at": "2026-12-05T14:40:27.278954+00:00",
}


def scale(x, *, block_rows=8):
    return x * 2.0


def kernel():
    """The kernel measured (registered on first use, reading the table at $TABLE)."""
    import autotune

    return autotune.register(
        scale,
        name="bench_scale",
        space={"block_rows": [8, 16, 32]},
        tuned=os.environ.get("TABLE"),
    )


def write_table(folder: Path, n: int, layout: str) -> float:
    """n entries in one file or a file per device kind; returns their size in MB."""
    import jax.numpy as jnp

    from autotune.device import current_device

    k = kernel()
    device = current_device()
    here = k.spec.key(k.spec.signature([jnp.ones((48, 128))], {}, device), device).as_dict()
    kinds = [*DEVICE_KINDS, here["device_kind"]]
    entries = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        name = "bench_scale" if i % KERNELS == 0 else f"other_kernel_{i % KERNELS}"
        rows = 64 * (1 + (i // (KERNELS * len(kinds))))  # a different shape each round
        key = {**here, "kernel": name, "device_kind": kind, "signature": f"f32[{rows},128]"}
        key["platform"] = PLATFORMS.get(kind.split()[0], here["platform"])
        entries.append({**TEMPLATE, **key})
    entries.append({**TEMPLATE, **here})  # the call measured
    files: dict[str, list] = {}
    for e in entries:
        files.setdefault("table" if layout == "one" else e["device_kind"], []).append(e)
    size = 0
    for i, part in enumerate(files.values()):
        doc = {"format": "pallas-autotune-export", "schema": 3, "entries": part}
        path = folder / f"table{i}.json"
        path.write_text(json.dumps(doc))
        size += path.stat().st_size
    return size / 1e6


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def child() -> None:
    """One fresh process's figures, as JSON on stdout."""
    import jax.numpy as jnp

    import autotune

    autotune.configure(db=os.environ["DB"])
    k = kernel()
    x, other = jnp.ones((48, 128)), jnp.ones((50, 128))
    k(jnp.ones((8, 128))).block_until_ready()  # JAX, jit and the database warmed up
    autotune.db.tables._SHIPPED.clear()  # what is left is the table
    before = rss_mb()
    t0 = time.perf_counter()
    k(x).block_until_ready()
    t1 = time.perf_counter()
    added = rss_mb() - before
    first = k.explain(x)
    t2 = time.perf_counter()
    nearest = k.explain(other)
    t3 = time.perf_counter()
    k.explain(x)
    t4 = time.perf_counter()
    assert first["source"] == "shipped", first
    assert nearest["source"] in ("nearest", "default"), nearest
    figures = {"first_s": t1 - t0, "rss_mb": added, "nearest_s": t3 - t2, "again_s": t4 - t3}
    print(json.dumps(figures))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, nargs="+", default=[1_000, 150_000])
    p.add_argument("--layout", nargs="+", choices=("one", "per-kind"), default=["one", "per-kind"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child()
    print(
        "| entries | layout | MB | first call (s) | memory added (MB) | nearest shape (s) "
        "| again (ms) |"
    )
    print("|---|---|---|---|---|---|---|")
    for n, layout in ((n, layout) for n in args.entries for layout in args.layout):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "tuned"
            folder.mkdir()
            mb = write_table(folder, n, layout)
            env = {**os.environ, "TABLE": str(folder), "DB": str(Path(tmp) / "t.db")}
            runs = []
            for _ in range(args.repeat):
                out = subprocess.run(
                    [sys.executable, __file__, "--child"],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                runs.append(json.loads(out.splitlines()[-1]))
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"| {n} | {layout} | {mb:.1f} | {med['first_s']:.3f} | {med['rss_mb']:.0f} | "
            f"{med['nearest_s']:.3f} | {1e3 * med['again_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
