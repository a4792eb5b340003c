"""How the tuning database's costs grow with its size: 1k, 10k and 100k softmax entries.

    PYTHONPATH=. python benchmarks/db_scale.py [--sizes 1000,10000,100000]

Per size: an export document of N softmax entries (distinct shapes, one kernel version, this
host's device kind) is imported into a fresh SQLite file by `autotune db import`, merged from
there into another fresh file by `autotune db merge` and exported by `autotune db export`, each
a process as a user runs it (its start, about 1-2 s here, included). Then, in a fresh process
serving that database, the first call of softmax at a stored shape, the first call at a shape
stored nowhere (the nearest-shape fallback, which runs while jit traces the call) and a second
call at another such shape are timed, each to completion (tracing, compiling and the
interpret-mode run included). Each figure is wall seconds, then in brackets the CPU seconds
of the process (user and system): on a host shared with other work, the CPU time is the one
that does not move with the load. One run per figure; the rows are printed as each size is done.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORED = (8, 128)  # entry 0's shape
NEAREST = [(12, 200), (20, 300)]  # stored nowhere: served the nearest entry's config
HEADER = [
    "| entries | db import s | db merge s | db export s | first call, stored shape s "
    "| first call, nearest shape s | next call, nearest shape s |",
    "|---|---|---|---|---|---|---|",
]


def shape(i: int) -> tuple[int, int]:
    """Entry i's shape: 500 row counts by 200 row lengths, all distinct."""
    return 8 * (i % 500 + 1), 128 * (i // 500 + 1)


def export_doc(n: int) -> dict:
    """N softmax entries as `autotune db export` writes them, keyed for this host's device."""
    import jax.numpy as jnp

    from autotune.db.export import EXPORT_FORMAT
    from autotune.db.schema import SCHEMA_VERSION
    from autotune.device import current_device
    from autotune.kernels import softmax

    device = current_device()
    x = jnp.zeros(STORED, jnp.float32)
    key = softmax.spec.key(softmax.spec.signature([x], {}, device), device).as_dict()
    entries = []
    for i in range(n):
        rows, cols = shape(i)
        entries.append(
            {
                **key,
                "signature": f"f32[{rows},{cols}]",
                "config": {"block_rows": 8},
                "time_s": 1e-3 * (1 + i % 7),
                "n_trials": 8,
                "n_rejected": 0,
                "run_id": f"bench{i % 97}",
                "strategy": "gp",
                "timer": "wall",
                "jax_version": "0.10.2",
                "jaxlib_version": "0.10.2",
                "host": "bench",
                "tuned_at": "2026-12-05T00:00:00+00:00",
            }
        )
    return {"format": EXPORT_FORMAT, "schema": SCHEMA_VERSION, "entries": entries}


def cli(*args: str) -> tuple[float, float]:
    """Wall and CPU seconds one `autotune ...` process took, from start to exit."""
    start, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run([sys.executable, "-m", "autotune.cli", *args], capture_output=True)
    if done.returncode:
        raise SystemExit(f"autotune {' '.join(args)} failed: {done.stderr.decode()[-2000:]}")
    return time.perf_counter() - start, _children_cpu() - cpu


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def calls(db: str) -> None:
    """(In a fresh process) the first softmax calls against `db`: JSON [wall, CPU] seconds."""
    import jax
    import jax.numpy as jnp

    import autotune
    from autotune.kernels import softmax

    autotune.configure(db=db)
    out = []
    for rows, cols in [STORED, *NEAREST]:
        x = jnp.ones((rows, cols), jnp.float32)
        start, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(softmax(x))
        out.append([time.perf_counter() - start, time.process_time() - cpu])
    print(json.dumps(out))


def size_row(n: int, folder: Path) -> str:
    doc = folder / f"export-{n}.json"
    doc.write_text(json.dumps(export_doc(n)))
    db, merged = folder / f"db-{n}.sqlite", folder / f"merged-{n}.sqlite"
    imported = cli("db", "import", str(doc), "--db", str(db))
    merge = cli("db", "merge", str(db), "--db", str(merged))
    export = cli("db", "export", "--db", str(db), "--out", str(folder / f"out-{n}.json"))
    child = subprocess.run(
        [sys.executable, __file__, "--calls", str(db)], check=True, capture_output=True, text=True
    )
    stored, nearest, again = json.loads(child.stdout.splitlines()[-1])
    figures = [imported, merge, export, stored, nearest, again]
    return f"| {n:,} | " + " | ".join(f"{wall:.2f} ({cpu:.2f})" for wall, cpu in figures) + " |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,10000,100000", help="entry counts, comma-separated")
    p.add_argument("--calls", metavar="DB", help=argparse.SUPPRESS)  # the child's part
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    if args.calls:
        calls(args.calls)
        return 0
    print("\n".join(HEADER), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            print(size_row(n, Path(tmp)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
