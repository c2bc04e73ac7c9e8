"""Cold-process time of `imgfab render` for every example recipe vs `python -c pass`.

Each round runs `python -c pass` and the command under test back to back, so both see the
same machine load (the 2-core CI machine is shared); the figure printed is the median over
the rounds of each pair's ratio, and the medians of both times. Also `imgfab --help` (the
CLI's import cost alone). A recipe whose lock records a refusal renders with --unlocked (the
same work; its context does not build). No figure is asserted in the tests: see
tests/test_startup.py for what each command may import.

    python bench/render_startup.py [--runs 7]
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

REPO = Path(__file__).resolve().parent.parent


# As users run an installed imgfab: with its bytecode cached. PYTHONDONTWRITEBYTECODE (set in
# some CI shells) would compile every imgfab module in every process; the cache goes to a
# scratch prefix, never into the tree.
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_ENV)
    return time.perf_counter() - start


def paired(argv: list[str], runs: int) -> tuple[float, float, float]:
    """(median ratio, median seconds of ``argv``, median seconds of `python -c pass`)."""
    baseline = [sys.executable, "-c", "pass"]
    ratios, times, bases = [], [], []
    _once(argv)  # warm: the bytecode cache and the page cache
    for _ in range(runs):
        base = _once(baseline)
        took = _once(argv)
        bases.append(base)
        times.append(took)
        ratios.append(took / base)
    return statistics.median(ratios), statistics.median(times), statistics.median(bases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    _ENV["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="imgfab-bench-pyc-")
    cli = [sys.executable, "-m", "imgfab.cli"]
    ratio, took, base = paired([*cli, "--help"], args.runs)
    print(f"imgfab --help: {took * 1000:.1f} ms, python -c pass {base * 1000:.1f} ms, "
          f"ratio {ratio:.1f}x (median of {args.runs} pairs)")
    # The floor any render pays: importing the libraries the design keeps (click, pydantic v2,
    # jinja2, pyyaml), before imgfab runs a line of its own.
    floor = [sys.executable, "-c", "import click, pydantic, jinja2, yaml"]
    ratio, took, base = paired(floor, args.runs)
    print(f"import click, pydantic, jinja2, yaml: {took * 1000:.1f} ms, python -c pass "
          f"{base * 1000:.1f} ms, ratio {ratio:.1f}x (the floor of a render)")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in sorted((REPO / "recipes").glob("*.yaml")):
            lock = recipe.with_suffix(".lock")
            unlocked = ["--unlocked"] if not lock.exists() or "# refused:" in lock.read_text() else []
            argv = [*cli, "render", str(recipe), "--output", str(Path(tmp) / recipe.stem),
                    "--force", *unlocked]
            ratio, took, base = paired(argv, args.runs)
            ratios.append(ratio)
            print(f"imgfab render {recipe.name}{' --unlocked' if unlocked else ''}: "
                  f"{took * 1000:.1f} ms, python -c pass {base * 1000:.1f} ms, ratio {ratio:.1f}x")
    print(f"render, median ratio to python -c pass over {len(ratios)} recipes: "
          f"{statistics.median(ratios):.1f}x (goal ≤ 3x)")


if __name__ == "__main__":
    main()
