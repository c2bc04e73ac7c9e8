"""Cold-process time of `imgfab render` for every example recipe vs `python -c pass`.

Prints, per recipe and in total, the median wall time of a fresh process over N runs and the
ratio to an empty interpreter start measured in the same run, so the figure does not depend on
the machine's speed. Also prints `imgfab --help` (the CLI's import cost alone).

    python bench/render_startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _time(argv: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    python = sys.executable
    baseline = _time([python, "-c", "pass"], args.runs)
    print(f"python -c pass: {baseline * 1000:.1f} ms (median of {args.runs})")
    help_time = _time([python, "-m", "imgfab.cli", "--help"], args.runs)
    print(f"imgfab --help: {help_time * 1000:.1f} ms, ratio {help_time / baseline:.1f}x")
    total = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in sorted((REPO / "recipes").glob("*.yaml")):
            out = Path(tmp) / recipe.stem
            elapsed = _time([python, "-m", "imgfab.cli", "render", str(recipe), "--output", str(out)], args.runs)
            total += elapsed
            print(f"imgfab render {recipe.name}: {elapsed * 1000:.1f} ms, ratio {elapsed / baseline:.1f}x")
    count = len(list((REPO / "recipes").glob("*.yaml")))
    print(f"mean render: {total / count * 1000:.1f} ms, ratio to python -c pass: {total / count / baseline:.1f}x")


if __name__ == "__main__":
    main()
