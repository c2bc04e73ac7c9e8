"""Bake vs sequential builds of the example fleet, measured side by side in one run.

    source .stack/env && python bench/bake_fleet.py [--runs 1]

Both sides build every example recipe cold (``--no-cache``: no step reused, base images
already in the engine) with the light payload (fake wheels on a local index: TensorRT-LLM's
real wheels live on an index this machine cannot reach), engine recipes for
``--engine-at-start``:

- sequential: ``imgfab build --no-cache`` of each recipe in turn (each also verifies its image);
- bake: ``imgfab bake`` then ``docker buildx bake --no-cache`` of the same fleet (BuildKit runs
  the targets' steps in parallel and dedups the shared ones; nothing is verified).

Prints wall seconds of each and the ratio bake ÷ sequential, and the sequential time with
verify taken out (the build reports' ``duration_s``), so the comparison is like for like.
Images go to ``imgfab-bench/...`` repositories and are removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from fake_payload import INDEX_BUILD_ENV, INDEX_TIMEOUT_S  # noqa: E402
DOCKER = os.environ.get("IMGFAB_DOCKER_CLI", "/usr/bin/docker")
MIRROR = os.environ.get("IMGFAB_MIRROR", "127.0.0.1:5000/mirror")
BUILDX = os.environ.get("IMGFAB_BUILDX", str(REPO / ".stack" / "buildx" / "docker-buildx"))


def bench_copies(recipes: list[Path], directory: Path, label: str) -> list[Path]:
    """Copies of the recipes whose images go to imgfab-bench/<label>-<name>."""
    copies = []
    for path in recipes:
        text = re.sub(r"(?m)^(\s+repository:\s*)\S+",
                      lambda m: m.group(1) + f"imgfab-bench/{label}-{path.stem}", path.read_text(), count=1)
        copy = directory / path.name
        copy.write_text(text)
        copies.append(copy)
    return copies


def lock_fleet(recipes: list[Path], index: str, locks: Path) -> None:
    """Each recipe locked against the fake index (hashes of the fake wheels) into locks/<name>.lock."""
    from imgfab.payload.lock import lock_recipe
    from imgfab.recipe import load_recipe

    locks.mkdir(exist_ok=True)
    for recipe in recipes:
        lock_recipe(str(recipe), index_url=index, output=locks / f"{load_recipe(recipe).name}.lock",
                    upgrade=True)


def sequential(recipes: list[Path], index: str, work: Path) -> tuple[float, float, list[str]]:
    env = dict(os.environ, **INDEX_BUILD_ENV)
    tags, build_seconds = [], 0.0
    started = time.monotonic()
    for recipe in recipes:
        engine = "engine" in recipe.stem
        result = subprocess.run(
            [sys.executable, "-m", "imgfab.cli", "build", str(recipe), "--json", "--no-cache",
             "--pip-index-url", index, "--lock", str(work / "seq-locks" / f"{recipe.stem}.lock"),
             "--network", "host", "--mirror", MIRROR,
             "--output", str(work / f"seq-{recipe.stem}"), *(["--engine-at-start"] if engine else [])],
            capture_output=True, text=True, env=env)
        if result.returncode != 0:
            raise SystemExit(f"imgfab build {recipe.name} failed: {result.stderr[-2000:]}")
        report = json.loads(result.stdout)
        tags += report["tags"]
        build_seconds += float(report["duration_s"])
    return time.monotonic() - started, build_seconds, tags


def bake(recipes: list[Path], index: str, gateway: str, work: Path) -> tuple[float, list[str]]:
    subprocess.run([sys.executable, "-m", "imgfab.cli", "bake", *map(str, recipes), "-o",
                    "bake/docker-bake.json", "--mirror", MIRROR, "--registry", "imgfab-bench/bake",
                    "--lock-dir", str(work / "bake-locks")], check=True, cwd=work, capture_output=True)
    definition = json.loads((work / "bake" / "docker-bake.json").read_text())
    env = dict(os.environ, IMGFAB_PIP_CONF=f"[global]\nindex-url = {index}\ntrusted-host = {gateway}\n"
                                           f"timeout = {INDEX_TIMEOUT_S}\nretries = 0\n")
    started = time.monotonic()
    result = subprocess.run([BUILDX, "bake", "--no-cache", "-f", "bake/docker-bake.json"],
                            cwd=work, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"docker buildx bake failed: {result.stderr[-2000:]}")
    return elapsed, [tag for target in definition["target"].values() for tag in target["tags"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    from fake_payload import fleet_pins, real_wheels, serve_index

    recipes = sorted((REPO / "recipes").glob("*.yaml"))
    gateway = subprocess.run([DOCKER, "network", "inspect", "bridge", "--format",
                              "{{(index .IPAM.Config 0).Gateway}}"], capture_output=True,
                             text=True, check=True).stdout.strip()
    pins = fleet_pins(recipes)
    with tempfile.TemporaryDirectory() as root:
        work = Path(root)
        copies = bench_copies(recipes, work, "seq")
        uv = real_wheels(*recipes)  # the uv installer, and a measured launchers row's Triton
        with serve_index(pins, uv) as index, serve_index(pins, uv, host=gateway) as bridge:
            lock_fleet(copies, index, work / "seq-locks")
            lock_fleet(recipes, bridge, work / "bake-locks")
            for run in range(1, args.runs + 1):
                seq_s, seq_build_s, seq_tags = sequential(copies, index, work)
                bake_s, bake_tags = bake(recipes, bridge, gateway, work)
                print(f"run {run}: fleet of {len(recipes)} recipes, light payload, cold (--no-cache)")
                print(f"  sequential imgfab build: {seq_s:7.1f} s   (docker build alone: {seq_build_s:.1f} s)")
                print(f"  docker buildx bake:      {bake_s:7.1f} s")
                print(f"  bake / sequential:       {bake_s / seq_s:7.3f}")
                if seq_build_s:
                    print(f"  bake / sequential docker build: {bake_s / seq_build_s:.3f}")
                subprocess.run([DOCKER, "image", "rm", *seq_tags, *bake_tags], capture_output=True)


if __name__ == "__main__":
    main()
