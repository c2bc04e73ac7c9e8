"""A cold host, measured (issue 19): push, then a cold pull until a container starts, for three
variants of one image side by side in one run:

- ``layered-zstd``   imgfab's image as built with ``--compression zstd`` (content-grouped
                     payload layers, zstd, OCI media types);
- ``layered-gzip``   the same build with ``--compression gzip``;
- ``onelayer-gzip``  the same files in one gzip layer (``FROM scratch`` + ``COPY --from`` of the
                     layered image, its config kept), which is what a hand-written Dockerfile
                     like the seeds' (one ``RUN pip install``) gives.

    source .stack/env && python bench/cold_start.py --payload real
    source .stack/env && python bench/cold_start.py --payload light     # the fake payload (fast)

Each variant is pushed into a registry of its own run (a fresh ``docker-registry`` on
127.0.0.1:5055 with an empty root, so no push finds a blob already there). Then, per variant:
every image is removed and the engine's whole build cache and unused images pruned (the
containerd store then holds no blob of the image), the image is pulled, unpacked, and a
container of it started with ``--entrypoint true`` (start reached: the runtime found the entry
point). The lines print seconds and bytes, and the ratios to ``onelayer-gzip``; goals ≤ 0.35.

Two push figures, because the containerd store moved the compression out of the push: ``push``
is ``docker push`` alone (the blobs were compressed when the build exported them, so it only
streams finished bytes), ``ship`` is the build's ``exporting layers`` (BuildKit's own figure
from the ``--progress=plain`` log: computing and compressing every layer's blob) plus that
push, which is what Docker 20.10's push did in one step (a layer's tar compressed on one core
while it was sent) and what a CI job pays between the last build step and a pushed image.

Needs the local stack's engine with the containerd image store (zstd is kept as built only
there); it removes every image of that engine (the stand-ins are re-imported by
``scripts/local-stack.sh up``, which this script runs at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from _payload import REPO, add_payload_arguments, bench_recipe, docker, options_for

BENCH_REGISTRY = "127.0.0.1:5055"
VARIANTS = ("layered-zstd", "layered-gzip", "onelayer-gzip")
# BuildKit's plain progress: "#25 exporting layers 95.3s done" (the export's blob computation)
_EXPORT_LINE = re.compile(r"^#\d+ exporting layers (\d+(?:\.\d+)?)s done$")


class ExportClock:
    """Feeds on a build's ``--progress=plain`` lines; sums the ``exporting layers`` seconds."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.seen = 0

    def feed(self, line: str) -> None:
        match = _EXPORT_LINE.match(line.strip())
        if match:
            self.seconds += float(match.group(1))
            self.seen += 1

    def total(self, variant: str) -> float:
        if not self.seen:
            raise SystemExit(f"{variant}: the build printed no 'exporting layers' line "
                             "(BuildKit's plain progress changed?)")
        return self.seconds


@contextlib.contextmanager
def fresh_registry(root: Path):
    """A docker-registry with an empty root on BENCH_REGISTRY (no auth: loopback only, insecure
    by default for Docker), stopped afterwards."""
    config = root / "config.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
                      f"    rootdirectory: {root}/data\nhttp:\n  addr: {BENCH_REGISTRY}\n")
    binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    process = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://{BENCH_REGISTRY}/v2/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit(f"bench registry on {BENCH_REGISTRY} did not start")
        yield BENCH_REGISTRY
    finally:
        process.terminate()
        process.wait(timeout=30)


def _manifest(ref: str) -> dict:
    host, _, rest = ref.partition("/")
    repository, _, tag = rest.rpartition(":")
    request = urllib.request.Request(f"http://{host}/v2/{repository}/manifests/{tag}", headers={
        "Accept": "application/vnd.oci.image.manifest.v1+json, "
                  "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def build_variants(payload: str, recipe: Path, work: Path) -> tuple[dict[str, str], dict[str, float]]:
    """({variant: local image ref}, {variant: export seconds}): the two layered builds through
    imgfab, the one-layer image from the gzip one."""
    from imgfab.docker.build import build_recipe

    refs: dict[str, str] = {}
    export: dict[str, float] = {}
    # A cold build cache: a cached blob would make the first export's compression free.
    docker("builder", "prune", "-af")
    with options_for(payload, recipe) as options:
        for compression in ("zstd", "gzip"):
            copy = bench_recipe(recipe, work, f"imgfab-bench/cold-{compression}")
            clock = ExportClock()
            started = time.monotonic()
            built = build_recipe(str(copy), dataclasses.replace(options, compression=compression),
                                 on_line=clock.feed, context_dir=work / f"ctx-{compression}")
            export[f"layered-{compression}"] = clock.total(f"layered-{compression}")
            print(f"[build] layered-{compression}: {time.monotonic() - started:.1f} s "
                  f"(exporting layers {export[f'layered-{compression}']:.1f} s), "
                  f"{built.size_bytes / 1e9:.2f} GB", flush=True)
            refs[f"layered-{compression}"] = built.tags[0]
    layered = refs["layered-gzip"]
    config = json.loads(docker("image", "inspect", layered))[0]["Config"]
    one = work / "onelayer"
    one.mkdir()
    lines = [f"FROM {layered} AS layered", "FROM scratch", "COPY --from=layered / /"]
    for key, value in sorted((config.get("Labels") or {}).items()):
        lines.append(f"LABEL {key}={json.dumps(value)}")
    lines += [f"ENV {item.split('=', 1)[0]}={json.dumps(item.split('=', 1)[1])}" for item in config.get("Env") or []]
    lines += [f"USER {config.get('User') or '0'}", f"WORKDIR {config.get('WorkingDir') or '/'}",
              f"ENTRYPOINT {json.dumps(config.get('Entrypoint') or [])}"]
    (one / "Dockerfile").write_text("\n".join(lines) + "\n")
    refs["onelayer-gzip"] = "imgfab-bench/cold-onelayer:latest"
    started = time.monotonic()
    done = subprocess.run([os.environ.get("IMGFAB_DOCKER_CLI", "docker"), "build", "--provenance=false",
                           "--progress=plain", "--output", "type=image,compression=gzip,force-compression=true,oci-mediatypes=true",
                           "--tag", refs["onelayer-gzip"], str(one)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the one-layer build failed: {done.stderr.strip()[-1500:]} (free disk: "
                         f"{shutil.disk_usage(work).free / 1e9:.1f} GB; the real payload needs about "
                         "70 GB for the three variants, their build cache and the bench registry)")
    clock = ExportClock()
    for line in done.stderr.splitlines():
        clock.feed(line)
    export["onelayer-gzip"] = clock.total("onelayer-gzip")
    print(f"[build] onelayer-gzip: {time.monotonic() - started:.1f} s "
          f"(exporting layers {export['onelayer-gzip']:.1f} s)", flush=True)
    return refs, export


def push(ref: str, target: str) -> dict:
    docker("tag", ref, target)
    started = time.monotonic()
    docker("push", target)
    seconds = time.monotonic() - started
    manifest = _manifest(target)
    return {"push_s": seconds, "layers": len(manifest["layers"]),
            "bytes": sum(layer["size"] for layer in manifest["layers"]),
            "media": sorted({layer["mediaType"].rsplit(".", 1)[-1] for layer in manifest["layers"]})}


def clean_engine() -> None:
    """No image and no build cache left: the next pull finds no blob of its image."""
    images = docker("image", "ls", "-aq").split()
    if images:
        subprocess.run([os.environ.get("IMGFAB_DOCKER_CLI", "docker"), "image", "rm", "-f", *sorted(set(images))],
                       capture_output=True)
    docker("builder", "prune", "-af")
    docker("image", "prune", "-af")
    left = docker("image", "ls", "-aq").split()
    assert not left, f"images left after the clean: {left}"


def cold_start(target: str) -> dict:
    clean_engine()
    started = time.monotonic()
    docker("pull", target)
    pulled = time.monotonic() - started
    docker("run", "--rm", "--network", "none", "--entrypoint", "true", target)
    return {"pull_s": pulled, "start_s": time.monotonic() - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_payload_arguments(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="imgfab-cold-") as scratch:
        work = Path(scratch)
        refs, export = build_variants(args.payload, args.recipe, work)
        results: dict[str, dict] = {v: {"export_s": export[v]} for v in VARIANTS}
        run = uuid.uuid4().hex[:8]
        (work / "registry").mkdir()
        with fresh_registry(work / "registry") as host:
            targets = {v: f"{host}/imgfab-bench/cold-{v}-{run}:bench" for v in VARIANTS}
            for variant in VARIANTS:
                results[variant] |= push(refs[variant], targets[variant])
                results[variant]["ship_s"] = results[variant]["export_s"] + results[variant]["push_s"]
                print(f"[push] {variant}: {results[variant]['push_s']:.1f} s, "
                      f"{results[variant]['bytes'] / 1e9:.2f} GB in {results[variant]['layers']} layers "
                      f"({', '.join(results[variant]['media'])})", flush=True)
            for variant in VARIANTS:
                results[variant] |= cold_start(targets[variant])
                print(f"[cold] {variant}: pull {results[variant]['pull_s']:.1f} s, to container start "
                      f"{results[variant]['start_s']:.1f} s", flush=True)
        clean_engine()
    base = results["onelayer-gzip"]
    print(f"\n{args.payload} payload, {args.recipe.name}:")
    print(f"{'variant':15} {'export s':>8} {'push s':>8} {'ship s':>8} {'GB':>6} {'layers':>6} "
          f"{'pull s':>8} {'start s':>8} {'push ÷':>7} {'ship ÷':>7} {'start ÷':>7}")
    for variant in VARIANTS:
        r = results[variant]
        print(f"{variant:15} {r['export_s']:8.1f} {r['push_s']:8.1f} {r['ship_s']:8.1f} "
              f"{r['bytes'] / 1e9:6.2f} {r['layers']:6d} {r['pull_s']:8.1f} {r['start_s']:8.1f} "
              f"{r['push_s'] / base['push_s']:7.2f} {r['ship_s'] / base['ship_s']:7.2f} "
              f"{r['start_s'] / base['start_s']:7.2f}")
    zstd = results["layered-zstd"]
    print(f"push, layered zstd ÷ one-layer gzip: docker push alone {zstd['push_s'] / base['push_s']:.2f}; "
          f"exporting layers + push {zstd['ship_s'] / base['ship_s']:.2f} (goal ≤ 0.35)")
    print(f"cold pull to container start, layered zstd ÷ one-layer gzip: "
          f"{zstd['start_s'] / base['start_s']:.2f} (goal ≤ 0.35)")
    subprocess.run([str(REPO / "scripts" / "local-stack.sh"), "up"], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
