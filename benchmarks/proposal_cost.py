"""What does a `gp` proposal cost? Times whole searches, one BLAS thread, each in its own process.

Two cases: a replay of a recorded landscape (default clblast_gemm_RTX_3090, 17,956 listed
configurations), and run_search on a space of 10^6 configurations (six parameters of ten values,
a constraint that admits 55%) that is never listed. The figure is the search's wall time over
its trials (proposal, bookkeeping and the looked-up measurement), median over seeds, in wall
time and in the process's CPU time: on a shared machine the wall time measures the load as much
as the code, while the CPU time of a one-thread process is close to its wall time on an idle one.

    python benchmarks/proposal_cost.py [--trials 200] [--seeds 0,1,2] [--against DIR]

`--against DIR` also replays the landscape with the code of another checkout of the project
(e.g. `git worktree add /tmp/before HEAD~3`), alternating with this one seed by seed so that both
see the same load on a shared machine. The 10^6 case runs with this checkout's code only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANDSCAPE = ROOT.parent / "shared" / "landscapes" / "clblast_gemm_RTX_3090.csv.gz"


def one(case: str, seed: int, trials: int, landscape: str) -> dict:
    """One search, in this process, with whichever `autotune` is first on sys.path."""
    from autotune.search.landscapes import load_landscape, replay
    from autotune.search.loop import run_search
    from autotune.signature import ArgSpec, Signature
    from autotune.space import Param, Space
    from autotune.trial import Evaluation

    if case == "landscape":
        land = load_landscape(landscape)
        start, cpu = time.perf_counter(), time.process_time()
        found = [f["time_ms"] for f in replay(land, trials, seed, "gp")]
        best = land.best_ms
    else:
        params = tuple(Param(n, tuple(range(10))) for n in "abcdef")
        space = Space(params, (lambda c, sig: c["a"] + c["b"] <= 9,))

        def time_of(c: dict) -> float:
            decisive = (c["a"] - 2) ** 2 + (c["c"] - 7) ** 2 + (c["e"] - 4) ** 2
            return 1.0 + decisive / 10 + (c["b"] + c["d"] + c["f"]) / 100

        sig = Signature((ArgSpec((64,), "float32"),))
        start, cpu = time.perf_counter(), time.process_time()
        found = run_search(
            space,
            sig,
            lambda c: Evaluation.of(c, time_of(c)),
            n_trials=trials,
            strategy="gp",
            seed=seed,
        )
        found, best = [ev.value for ev in found], 1.0
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    reached = best / min(t for t in found if t is not None)
    return {"ms": 1e3 * wall / len(found), "cpu_ms": 1e3 * cpu / len(found), "reached": reached}


def run_child(code: Path, case: str, seed: int, args: argparse.Namespace) -> dict:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--child", str(code), case, str(seed)]
    cmd += ["--trials", str(args.trials), "--landscape", str(args.landscape)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--landscape", type=Path, default=LANDSCAPE)
    ap.add_argument("--against", type=Path, help="another checkout of the project")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        code, case, seed = args.child
        sys.path.insert(0, code)
        print(json.dumps(one(case, int(seed), args.trials, str(args.landscape))))
        return 0
    if not args.landscape.is_file():
        print(f"no landscape {args.landscape}: pass --landscape FILE", file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split(",")]
    rows: dict[str, list[dict]] = {}
    for seed in seeds:
        runs = [("this checkout", ROOT)]
        if args.against:
            runs.insert(0, (f"{args.against}", args.against))
        for name, code in runs:
            rows.setdefault(f"{args.landscape.name}, {name}", []).append(
                run_child(code, "landscape", seed, args)
            )
        rows.setdefault("10^6 configurations, never listed", []).append(
            run_child(ROOT, "million", seed, args)
        )
    print(f"{args.trials} trials, seeds {args.seeds}, one BLAS thread\n")
    print(
        "| search | CPU ms per trial, median (each seed) | wall ms (each seed) | best / optimum |"
    )
    print("|---|---|---|---|")
    for name, runs in rows.items():
        cpu = sorted(r["cpu_ms"] for r in runs)[len(runs) // 2]
        each_cpu = " / ".join(f"{r['cpu_ms']:.1f}" for r in runs)
        each_wall = " / ".join(f"{r['ms']:.1f}" for r in runs)
        reached = " / ".join(f"{r['reached']:.3f}" for r in runs)
        print(f"| {name} | {cpu:.1f} ({each_cpu}) | {each_wall} | {reached} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
