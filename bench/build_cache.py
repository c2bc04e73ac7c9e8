"""A cold machine with a registry build cache vs the same cold machine without one (issue 37).

    source .stack/env && python bench/build_cache.py --payload light|real
        [--recipe recipes/qwen2-7b-h100.yaml] [--repository imgfab-bench/...]

One run, three builds of one recipe, each from an empty local build cache (the engine's
BuildKit cache pruned, this run's images removed): what a fresh CI runner has.

1. ``seed``: an earlier build that exports its cache to the local registry
   (``--cache-to type=registry,ref=…,mode=max``), as the previous CI job did;
2. ``without``: the build with no cache to read;
3. ``with``: the build reading that registry cache (``--cache-from``).

For 2 and 3 it prints the wall time and the bytes pulled: from the registry (base images, cache
blobs: the registry's access log, GET blob answers), from the package index (the light
payload's nginx access log; the real payload's PyPI traffic is not logged here: n/a), side by
side, and the ratio with ÷ without (goal <= 0.2). WARNING: prunes the engine's whole build cache.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

from _payload import REPO, add_payload_arguments, bench_recipe, docker, options_for, prune_build_cache

LOGS = REPO / ".stack" / "logs"
# combined log format: "GET /v2/<repo>/blobs/sha256:<hex> HTTP/1.1" 200 <bytes>
_BLOB_GET = re.compile(r'"GET /v2/\S+/blobs/sha256:[0-9a-f]{64} HTTP/[0-9.]+" (?:200|206) (\d+)')
_INDEX_GET = re.compile(r'"GET \S+ HTTP/[0-9.]+" (?:200|206) (\d+)')


def _log_size(name: str) -> int:
    path = LOGS / name
    return path.stat().st_size if path.exists() else 0


def _bytes_since(name: str, offset: int, pattern: re.Pattern[str]) -> int:
    path = LOGS / name
    if not path.exists():
        return 0
    with open(path, encoding="utf-8", errors="replace") as log:
        log.seek(offset)
        return sum(int(m.group(1)) for line in log for m in [pattern.search(line)] if m)


def _cold(tags: list[str]) -> None:
    for ref in tags:
        docker("image", "rm", "-f", ref)
    prune_build_cache()


def _timed(recipe: Path, options, context: Path) -> tuple[float, int, int, list[str], int]:
    from imgfab.docker.build import build_recipe

    registry_at, index_at = _log_size("registry.log"), _log_size("index-access.log")
    started = time.monotonic()
    built = build_recipe(str(recipe), options, context_dir=context)
    seconds = time.monotonic() - started
    return (seconds, _bytes_since("registry.log", registry_at, _BLOB_GET),
            _bytes_since("index-access.log", index_at, _INDEX_GET), built.tags,
            sum(c for c, _ in built.cached_by_stage.values()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_payload_arguments(parser)
    args = parser.parse_args()
    repository = args.repository if args.repository is not None else \
        f"imgfab-bench/cache-{args.payload}"
    registry = os.environ.get("IMGFAB_REGISTRY", "127.0.0.1:5000")
    cache = f"{registry}/imgfab-bench/buildcache-{uuid.uuid4().hex[:8]}:{{recipe}}"
    with tempfile.TemporaryDirectory() as scratch, options_for(args.payload, args.recipe) as options:
        root = Path(scratch)
        recipe = bench_recipe(args.recipe, root, repository)
        seed = replace(options, cache_to=(f"type=registry,ref={cache},mode=max",))
        prune_build_cache()
        seeded = _timed(recipe, seed, root / "seed")
        _cold(seeded[3])
        without = _timed(recipe, options, root / "without")
        _cold(without[3])
        with_cache = _timed(recipe, replace(options, cache_from=(f"type=registry,ref={cache}",)),
                            root / "with")
        _cold(with_cache[3])
    index = "n/a" if args.payload == "real" else None
    print(f"recipe {args.recipe.name}, payload {args.payload}, cache {cache}")
    print(f"seed (exports the cache): {seeded[0]:.1f} s")
    print(f"{'':24}{'wall s':>10}{'registry MB':>14}{'index MB':>10}{'cached steps':>14}")
    for name, (seconds, reg, idx, _, cached) in (("without the cache", without),
                                                 ("with the registry cache", with_cache)):
        print(f"{name:24}{seconds:10.1f}{reg / 1e6:14.1f}{index or f'{idx / 1e6:.1f}':>10}{cached:14d}")
    print(f"with / without (wall): {with_cache[0] / without[0]:.2f} (goal <= 0.2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
