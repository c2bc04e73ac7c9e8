"""Cold build (BuildKit cache pruned) vs rebuild after a serving-parameter change, same recipe.

    source .stack/env && python bench/rebuild.py --payload light [--recipe recipes/qwen2-7b-h100.yaml]
        [--repository imgfab-bench/qwen2-7b-light]

Prints both wall times and their ratio (goal: rebuild / cold <= 0.05). WARNING: prunes the
engine's whole build cache first.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _payload import add_payload_arguments, bench_recipe, free_bytes, options_for, prune_build_cache


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_payload_arguments(parser)
    args = parser.parse_args()
    from imgfab.docker.build import build_recipe

    repository = args.repository
    if repository is None:
        import yaml

        own = yaml.safe_load(args.recipe.read_text())["image"]["repository"]
        repository = f"imgfab-bench/{own.rsplit('/', 1)[-1]}-{args.payload}"

    text = args.recipe.read_text()
    changed = text.replace("gpu_memory_utilization: 0.9", "gpu_memory_utilization: 0.85")
    if changed == text:
        changed = text.replace("port: 8000", "port: 8011")
    assert changed != text, "no serving parameter to change in the recipe"
    with tempfile.TemporaryDirectory() as scratch, options_for(args.payload, args.recipe) as options:
        (Path(scratch) / "a").mkdir()
        (Path(scratch) / "b").mkdir()
        original = bench_recipe(args.recipe, Path(scratch) / "a", repository)
        copy = bench_recipe(args.recipe, Path(scratch) / "b", repository, text=changed)
        free_start = free_bytes()
        prune_build_cache()
        started = time.monotonic()
        cold = build_recipe(str(original), options, context_dir=Path(scratch) / "cold")
        cold_s = time.monotonic() - started
        started = time.monotonic()
        warm = build_recipe(str(copy), options, context_dir=Path(scratch) / "warm")
        warm_s = time.monotonic() - started
    builder = warm.cached_by_stage.get("builder", [0, 0])
    print(f"payload {args.payload}, recipe {args.recipe.name}")
    print(f"cold build (cache pruned)        {cold_s:8.1f} s  (docker build {cold.duration_s:.1f} s, "
          f"image {cold.size_bytes / 1e6:.0f} MB)")
    print(f"rebuild after serving change     {warm_s:8.1f} s  (docker build {warm.duration_s:.1f} s, "
          f"builder steps cached {builder[0]}/{builder[1]})")
    print(f"ratio rebuild/cold (imgfab build incl. verify) {warm_s / cold_s:.3f}   (goal <= 0.05)")
    print(f"ratio rebuild/cold (docker build only)         {warm.duration_s / cold.duration_s:.3f}")
    print(f"images: cold {cold.image_id} (untagged by the rebuild), rebuild {warm.image_id} "
          f"tagged {', '.join(warm.tags)}")
    print(f"engine disk free: {free_start / 1e9:.1f} GB before the prune, {free_bytes() / 1e9:.1f} GB now")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
