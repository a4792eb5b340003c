"""Do the shipped variant groups pick the same winner on a loaded host, from Python and the CLI?

    PYTHONPATH=. python benchmarks/noisy_winners.py [--runs 3] [--loops 3] [--no-cli]

Starts `--loops` busy loops (`sh -c 'while :; do :; done'`, stopped at the end whatever
happens), then tunes `matmul_variants` at f32 256^3 and `attention_variants` at f32 1x2x128x64
causal `--runs` times each from Python (`autotune.tune(group, args, n_trials=2)`, each run into
a fresh throw-away database, so that no run warm-starts the next) and once each with
`autotune tune GROUP ... --trials 2` (a device worker, as the CLI measures). Prints one row per
run: the winner, each member's first-pass and side-by-side figures (the median of its rounds'
fastest calls, autotune.measure.finalists), the rounds taken and whether the choice was within the
noise. On a CPU the xla members run compiled and the Pallas members interpreted: xla should win
every run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = [  # (group, argument shapes, static arguments, the CLI's flags for them)
    ("matmul_variants", [(256, 256), (256, 256)], {}, ["--shape", "256x256,256x256"]),
    (
        "attention_variants",
        [(1, 2, 128, 64)] * 3,
        {"causal": True},
        ["--shape", "1x2x128x64,1x2x128x64,1x2x128x64", "--static", "causal=true"],
    ),
]
HEADER = [
    "| group | from | winner | members: first pass / side by side ms | rounds | within noise |"
    " wall s |",
    "|---|---|---|---|---|---|---|",
]


def python_row(group: str, shapes: list, static: dict, db: str) -> str:
    import jax

    import autotune

    args = [jax.ShapeDtypeStruct(s, "float32") for s in shapes]
    start = time.perf_counter()
    r = autotune.tune(group, args, kwargs=static, n_trials=2, db=db)
    wall = time.perf_counter() - start
    members = ", ".join(
        f"{f.config['variant']} {f.first_s * 1e3:.3f} / {f.time_s * 1e3:.3f}" for f in r.finalists
    )
    rounds = len(r.finalists[0].rounds) if r.finalists else 0
    noise = "yes" if r.within_noise else "no"
    return f"| {group} | python | {r.winner} | {members} | {rounds} | {noise} | {wall:.1f} |"


def cli_row(group: str, flags: list[str], db: str) -> str:
    start = time.perf_counter()
    argv = [sys.executable, "-m", "autotune.cli", "tune", group, *flags, "--trials", "2"]
    done = subprocess.run([*argv, "--db", db], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        return f"| {group} | cli | failed: {done.stderr.strip().splitlines()[-1]} | | | | |"
    best = re.search(r"best\s+variant=(\S+)", done.stdout)
    members = re.findall(r"member\s+(\S+)\s+([0-9.]+) ms", done.stdout)
    side = ", ".join(f"{name} - / {ms}" for name, ms in members)
    noise = "yes" if "noise:" in done.stdout else "no"
    winner = best.group(1) if best else "?"
    return f"| {group} | cli | {winner} | {side} | | {noise} | {wall:.1f} |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="Python runs per group")
    p.add_argument("--loops", type=int, default=3, help="busy loops loading the host")
    p.add_argument("--no-cli", action="store_true", help="leave out the CLI's runs")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    loops = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(args.loops)]
    try:
        print(f"{args.loops} busy loops running; load average {os.getloadavg()[0]:.1f}")
        print("\n".join(HEADER), flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            for group, shapes, static, flags in CASES:
                for run in range(args.runs):
                    db = os.path.join(tmp, f"{group}-{run}.db")
                    print(python_row(group, shapes, static, db), flush=True)
                if not args.no_cli:
                    print(cli_row(group, flags, os.path.join(tmp, f"{group}-cli.db")), flush=True)
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
