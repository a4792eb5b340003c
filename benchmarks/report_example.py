"""An example report from a real tuning run on this host, and a picture of it.

    python benchmarks/report_example.py --out report-example [--trials 12] [--db FILE]
                                        [--screenshot docs/report.png]

Tunes a small training step (train_step.py's attention and MLP block at small sizes, forward
and backward: every call `autotune.calls_in` finds) with `--trials` per call into a throw-away
database (or into --db, kept: a call tuned there already is skipped), writes `autotune report --program report_example:example` of it into --out, and
where Chromium is installed opens the page in it (headless, nothing loaded from the network),
takes a screenshot and checks that it is not blank. It prints a table: each call's source,
default and tuned time; then the step's sums and how long tuning, writing the report and the
screenshot took. It exits 1 if the screenshot is blank. `--screenshot FILE` keeps the picture
(the README's is made so, its colours reduced to keep it small).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import train_step

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def example():
    """The factory `--program report_example:example` names: train_step's block, small."""
    return train_step.program(batch=1, seq=256, d_model=64, heads=2, mlp=True)


def chromium() -> str | None:
    """A headless-capable Chromium on PATH, or None."""
    return next((found for b in BROWSERS if (found := shutil.which(b))), None)


def screenshot(page: Path, png: Path, width: int = 1280, height: int = 1600) -> None:
    """A picture of `page` as a browser window of width x height shows it (Chromium,
    headless, with a fresh profile; nothing fetched but the page)."""
    browser = chromium()
    if browser is None:
        raise RuntimeError("Chromium is not installed (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--hide-scrollbars",
             f"--window-size={width},{height}", f"--screenshot={png.resolve()}",
             page.resolve().as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip


# a browser that starts and fetches nothing of its own, and runs as root (in a container)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync")  # fmt: skip


def blank(png: Path) -> str | None:
    """What makes a screenshot blank (nearly all one colour, or no dark text at its top), or
    None where it looks like a page."""
    import matplotlib.image
    import numpy as np

    pixels = matplotlib.image.imread(png)[..., :3]
    if pixels.dtype != np.uint8:
        pixels = (pixels * 255).round()
    inked = (pixels < 235).any(axis=-1)
    if inked.mean() < 0.03:
        return f"only {inked.mean():.1%} of its pixels are not white"
    if not (pixels[:150] < 80).all(axis=-1).any():
        return "no dark text at its top (where the title is)"
    colours = len(np.unique(pixels.reshape(-1, 3)[::7], axis=0))
    if colours < 16:
        return f"only {colours} colours"
    return None


def small_png(src: Path, dst: Path, colours: int = 64) -> None:
    """The picture with its colours reduced to a palette, for the README (needs Pillow)."""
    from PIL import Image

    with Image.open(src) as im:
        im.convert("RGB").quantize(colours).save(dst, optimize=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the report's directory")
    p.add_argument("--trials", type=int, default=12, help="per call")
    p.add_argument("--screenshot", type=Path, help="keep the picture here (PNG, reduced colours)")
    p.add_argument("--db", help="tune into this SQLite file and keep it (default: throw-away)")
    args = p.parse_args(argv)

    import autotune
    from autotune import report

    fn, call_args = example()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or os.path.join(tmp, "tuning.db")
        autotune.configure(db=url)
        t0 = time.perf_counter()
        outcomes = autotune.tune_program(fn, call_args, db=url, n_trials=args.trials, seed=0)
        tuned_s = time.perf_counter() - t0
        with autotune.TuningDB(url) as db:
            t0 = time.perf_counter()
            index, pngs = report.write(db, args.out, program="report_example:example")
            report_s = time.perf_counter() - t0
            view = report.build(db, program=outcomes).program
    print(f"{'#':>3} {'kernel':20} {'source':8} {'default':>12} {'tuned':>12} {'speedup':>8}")
    for r in view.rows:
        default = f"{r.default_s * 1e3:.4f} ms" if r.default_s else "n/a"
        tuned = f"{r.tuned_s * 1e3:.4f} ms" if r.tuned_s else "n/a"
        speedup = f"{r.speedup:.2f}x" if r.speedup else "n/a"
        print(f"{r.index:>3} {r.kernel:20} {r.source:8} {default:>12} {tuned:>12} {speedup:>8}")
    print(f"step: {len(view.timed)} of {len(view.rows)} calls timed, kernel time "
          f"{view.before_s * 1e3:.3f} ms before, {view.after_s * 1e3:.3f} ms after")  # fmt: skip
    print(f"tuning {tuned_s:.1f} s, report {report_s:.1f} s ({len(pngs)} PNG files): {index}")
    if chromium() is None:
        print("no screenshot: Chromium is not installed (apt-get install chromium)")
        return 0
    shot = Path(args.out) / "screenshot.png"
    t0 = time.perf_counter()
    screenshot(index, shot)
    print(f"screenshot {time.perf_counter() - t0:.1f} s: {shot}")
    problem = blank(shot)
    if problem:
        print(f"the screenshot is blank: {problem}")
        return 1
    if args.screenshot:
        small_png(shot, args.screenshot)
        print(f"kept {args.screenshot} ({args.screenshot.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
