"""The locked, layered payload, measured side by side in one run (issue 9's table).

    source .stack/env && python bench/payload.py --payload light
    source .stack/env && python bench/payload.py --payload real --only registry,serving,largest

Measurements (``--only`` picks some; all by default):

- ``install``  cold install of one lock, empty caches: ``uv pip install`` ÷ ``pip install``
               (both ``--require-hashes --no-deps``, into fresh venvs of the host's python3, the
               interpreter the stand-in bases' lock targets; goal ≤ 0.4)
- ``push``     push time of the image with the payload in content-grouped layers ÷ the same
               payload in one layer (goal ≤ 0.5). Each side must upload blobs the registry has
               never seen: the light payload gets them from a salt in its fake wheels; for the
               real payload, start from a registry without earlier bench pushes (the line says
               NOT COMPARABLE when either side uploaded under 90 % of its size)
- ``registry`` registry bytes for the two example vLLM recipes (same stack) ÷ the sum of their
               image sizes (compressed, from the manifests; goal ≤ 0.6)
- ``serving``  bytes uploaded by the re-push after a serving change ÷ image size (goal ≤ 0.01)
- ``bump``     bytes uploaded by the re-push after a vLLM patch bump on the same torch
               ÷ image size (goal ≤ 0.15); ``--bump-vllm`` names the release (light: fake)
- ``largest``  the largest layer, uncompressed and compressed (goal ≤ 2 GB)
- ``repro``    two cold builds of one recipe and lock (``--no-cache``, the whole BuildKit cache
               pruned before each, so uv's and apt's cache mounts start empty too): the same
               installed distributions, the same payload layer digests, how many of all the
               image's layers are equal, and the cold CI rebuild after no change: bytes the
               second build's push re-sends ÷ image size (issue 19: goal ≤ 0.001; the
               integration test covers the light payload on every run)

Images go to ``imgfab-bench/*`` repositories (never an example recipe's), each run under a
fresh repository name so "bytes uploaded" counts what this run uploads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _payload import REPO, STAND_IN_PYTHON, bench_recipe, docker, prune_build_cache, stand_in_lock

QWEN = REPO / "recipes" / "qwen2-7b-h100.yaml"
LLAMA = REPO / "recipes" / "llama31-8b-l4.yaml"
ALL = ("install", "push", "registry", "serving", "bump", "largest", "repro")


def _registry():
    from imgfab.docker import registry

    host = os.environ.get("IMGFAB_REGISTRY", "127.0.0.1:5000")
    return host, registry.Credentials.load(host)


def push_measured(local_ref: str, repository: str, tag: str, *, retag: bool = False) -> dict:
    """Push; returns seconds, bytes uploaded (layers the daemon reported ``Pushed``) and the
    image's compressed size and layers (manifest)."""
    from imgfab.docker import registry

    host, credentials = _registry()
    lines: list[str] = []
    started = time.monotonic()
    registry.push(local_ref, f"{host}/{repository}:{tag}", credentials=credentials, on_line=lines.append,
                  retag=retag)
    seconds = time.monotonic() - started
    pushed = {line.split()[0] for line in lines if line.endswith(" Pushed")}
    ref = registry.ImageRef(host, repository, tag)
    _, manifest = registry._manifest(registry._client_for(ref, credentials), ref, tag)
    diff_ids = json.loads(docker("image", "inspect", local_ref))[0]["RootFS"]["Layers"]
    layers = manifest["layers"]
    assert len(layers) == len(diff_ids), "manifest and image disagree"

    def sent(layer: dict, diff: str) -> bool:
        # The push stream names a layer by its diff ID (classic store) or by its compressed
        # blob's digest (containerd store), 12 hex digits either way.
        return diff[7:19] in pushed or layer["digest"][7:19] in pushed

    uploaded = sum(layer["size"] for layer, diff in zip(layers, diff_ids) if sent(layer, diff))
    return {"seconds": seconds, "uploaded": uploaded, "size": sum(layer["size"] for layer in layers),
            "sent": {diff: layer["size"] for layer, diff in zip(layers, diff_ids) if sent(layer, diff)},
            "layers": [(layer["digest"], layer["size"]) for layer in layers]}


@contextlib.contextmanager
def payload_options(payload: str, recipe: Path, scratch: Path, *, salt: str = "",
                    pins: dict[str, str] | None = None):
    from imgfab.docker.build import BuildOptions

    ca = os.environ.get("IMGFAB_CA_CERT")
    base = dict(mirror=os.environ.get("IMGFAB_MIRROR"), network="host", ca_cert=Path(ca) if ca else None)
    scratch.mkdir(parents=True, exist_ok=True)
    if payload == "real":
        yield BuildOptions(lock=stand_in_lock(recipe, scratch / f"{recipe.stem}.lock", pins=pins), **base)
        return
    from fake_payload import INDEX_BUILD_ENV, locked_index

    for name, value in INDEX_BUILD_ENV.items():
        os.environ.setdefault(name, value)
    with locked_index(recipe, scratch, pins=pins, salt=salt) as (url, lock):
        yield BuildOptions(pip_index_url=url, lock=lock, **base)


PRUNE_AFTER_BUILD = False  # --payload real: each builder stage holds ~11 GB of venv in the cache


def build(recipe: Path, options, directory: Path, repository: str, text: str | None = None, *,
          prune: bool = False):
    from imgfab.docker.build import build_recipe

    directory.mkdir(parents=True, exist_ok=True)
    copy = bench_recipe(recipe, directory, repository, text)
    built = build_recipe(str(copy), options, context_dir=directory / "ctx")
    if prune and PRUNE_AFTER_BUILD:
        # push and repro only: the image keeps its layers. The fleet's builds keep the cache, as
        # an operator's builder does: the runtime's OS layer (apt writes dates) is not
        # reproducible, so a cold rebuild would re-send it (~109 MB compressed).
        prune_build_cache()
    return built


def one_layer(lock: Path, out: Path) -> Path:
    """The same lock with its layer groups removed: imgfab-stage puts it all in one group."""
    out.write_text("".join(line + "\n" for line in lock.read_text().splitlines()
                           if not line.startswith("# layer ")))
    return out


def bench_install(payload: str, scratch: Path, results: dict) -> None:
    with payload_options(payload, QWEN, scratch / "install-lock", salt=uuid.uuid4().hex) as options:
        index = options.pip_index_url or "https://pypi.org/simple"
        env = dict(os.environ, UV_LINK_MODE="copy", PIP_CONFIG_FILE=os.devnull,
                   SSL_CERT_FILE=os.environ.get("IMGFAB_CA_CERT") or "/etc/ssl/certs/ca-certificates.crt")
        from imgfab.payload.lock import uv_binary

        times = {}
        for tool in ("uv", "pip"):
            venv, cache = scratch / f"venv-{tool}", scratch / f"cache-{tool}"
            subprocess.run([sys.executable if tool == "uv" else "python3", "-m", "venv", str(venv)], check=True)
            common = ["--require-hashes", "--no-deps", "--index-url", index, "-r", str(options.lock)]
            argv = ([uv_binary(), "pip", "install", "--python", str(venv / "bin" / "python"),
                     "--cache-dir", str(cache), *common] if tool == "uv" else
                    [str(venv / "bin" / "pip"), "install", "--isolated", "--cache-dir", str(cache), *common])
            started = time.monotonic()
            subprocess.run(argv, check=True, env=env, capture_output=True)
            times[tool] = time.monotonic() - started
            shutil.rmtree(venv)
            shutil.rmtree(cache, ignore_errors=True)
    results["install"] = (f"cold install uv {times['uv']:.1f} s, pip {times['pip']:.1f} s: "
                          f"uv/pip {times['uv'] / times['pip']:.3f} (goal <= 0.4)")


def bench_push(payload: str, scratch: Path, results: dict, run: str) -> None:
    from imgfab.docker import engine

    with payload_options(payload, QWEN, scratch / "push-lock", salt=uuid.uuid4().hex) as options:
        layered = build(QWEN, options, scratch / "push-layered", f"imgfab-bench/push-layered-{run}", prune=True)
        options.lock = one_layer(Path(options.lock), scratch / "one-layer.lock")
        single = build(QWEN, options, scratch / "push-one", f"imgfab-bench/push-one-{run}", prune=True)
    tag = layered.tags[0].rsplit(":", 1)[1]
    a = push_measured(layered.tags[0], f"imgfab-bench/push-layered-{run}", tag)
    b = push_measured(single.tags[0], f"imgfab-bench/push-one-{run}", tag)
    results["push"] = (f"push layered {a['seconds']:.1f} s ({len(a['layers'])} layers, {a['uploaded'] / 1e6:.1f} MB up), "
                       f"one-layer {b['seconds']:.1f} s ({len(b['layers'])} layers, {b['uploaded'] / 1e6:.1f} MB up): "
                       f"layered/one-layer {a['seconds'] / b['seconds']:.3f} (goal <= 0.5)")
    if min(a["uploaded"] / a["size"], b["uploaded"] / b["size"]) < 0.9:
        results["push"] += " [NOT COMPARABLE: the registry already held most of one side's blobs]"
    for ref in single.tags:
        engine.remove_image(ref, force=True)


def bench_fleet(payload: str, scratch: Path, results: dict, run: str, only: set[str], bump_vllm: str) -> None:
    """registry, serving, bump and largest share the first image."""
    qwen_repo, llama_repo = f"imgfab-bench/qwen2-{payload}-{run}", f"imgfab-bench/llama31-{payload}-{run}"
    salt = uuid.uuid4().hex  # one for the fleet: the bump's torch must be the first image's torch
    with payload_options(payload, QWEN, scratch / "fleet-lock", salt=salt) as options:
        first = build(QWEN, options, scratch / "qwen", qwen_repo)
        tag = first.tags[0].rsplit(":", 1)[1]
        pushed = push_measured(first.tags[0], qwen_repo, tag)
        if "largest" in only:
            sizes = [int(s) for s in docker("history", "--no-trunc", "--format", "{{.Size}}", "--human=false",
                                             first.tags[0]).split()]
            results["largest"] = (f"largest layer {max(sizes) / 1e9:.2f} GB uncompressed, "
                                  f"{max(s for _, s in pushed['layers']) / 1e9:.2f} GB compressed; "
                                  f"image {first.size_bytes / 1e9:.2f} GB on disk, {pushed['size'] / 1e9:.2f} GB "
                                  f"compressed, {len(pushed['layers'])} layers (goal <= 2 GB)")
        if "registry" in only:
            other = build(LLAMA, options, scratch / "llama", llama_repo)
            second = push_measured(other.tags[0], llama_repo, other.tags[0].rsplit(":", 1)[1])
            unique = dict(pushed["layers"]) | dict(second["layers"])
            total = pushed["size"] + second["size"]
            results["registry"] = (f"registry bytes for qwen2-7b-h100 + llama31-8b-l4 {sum(unique.values()) / 1e9:.3f} GB, "
                                   f"sum of image sizes {total / 1e9:.3f} GB: ratio {sum(unique.values()) / total:.3f} "
                                   f"(goal <= 0.6)")
        if "serving" in only:
            text = QWEN.read_text().replace("port: 8000", "port: 8011")
            changed = build(QWEN, options, scratch / "qwen-serving", qwen_repo, text=text)
            again = push_measured(changed.tags[0], qwen_repo, tag)
            results["serving"] = (f"re-push after a serving change uploaded {again['uploaded'] / 1e3:.1f} KB of "
                                  f"{again['size'] / 1e9:.3f} GB: ratio {again['uploaded'] / again['size']:.5f} (goal <= 0.01)")
    if "bump" in only:
        with payload_options(payload, QWEN, scratch / "bump-lock", salt=salt,
                             pins={"vllm": bump_vllm}) as options:
            bumped = build(QWEN, options, scratch / "qwen-bump", qwen_repo)
            again = push_measured(bumped.tags[0], qwen_repo, f"{tag}-bump")
            from imgfab.payload.lock import Lock

            groups = Lock.parse(Path(options.lock).read_text()).layers()
            names = {diff: group for group, diff in _payload_layers(bumped, groups).items()}
            sent = ", ".join(f"{names.get(diff, 'other')} {size / 1e6:.1f} MB" for diff, size in again["sent"].items())
        results["bump"] = (f"re-push after vllm {bump_vllm} -> 0.19.1's lock uploaded {again['uploaded'] / 1e6:.1f} MB of "
                           f"{again['size'] / 1e9:.3f} GB: ratio {again['uploaded'] / again['size']:.4f} (goal <= 0.15); "
                           f"sent: {sent}")


def _payload_layers(built, groups: list[str]) -> dict[str, str]:
    """``{group: diff id}``: the runtime's payload COPYs follow its base's layers and its OS
    layer, one per lock group in order (as tests/integration/test_payload_layers.py reads them)."""
    from imgfab.docker import registry

    layers = json.loads(docker("image", "inspect", built.tags[0]))[0]["RootFS"]["Layers"]
    base = built.base_images["RUNTIME_IMAGE"]
    base_layers = registry.image_config(base, registry.Credentials.load(registry.ImageRef.parse(base).host)
                                        )["rootfs"]["diff_ids"]
    assert layers[:len(base_layers)] == base_layers, "the image does not start with its base's layers"
    first = len(base_layers) + 1
    return dict(zip(groups, layers[first:first + len(groups)]))


def _installed(ref: str) -> list[str]:
    """The distributions in the image's venv, ``name==version``, from their dist-info names."""
    out = docker("run", "--rm", "--entrypoint", "sh", ref, "-c",
                 "ls -d /opt/venv/lib/python3*/site-packages/*.dist-info")
    return sorted(Path(line).name.removesuffix(".dist-info").replace("-", "==", 1) for line in out.split())


def _hashes(ref: str, root: str = "/opt/venv") -> dict[str, str]:
    """``{path: sha256 or link target, then mtime and owner}`` of every file and link under
    ``root`` in ``ref`` (its own file system only)."""
    out = docker("run", "--rm", "--entrypoint", "sh", ref, "-c",
                 f"cd {root} && find . -xdev -type f -print0 | sort -z | xargs -0 sha256sum; "
                 "find . -xdev -type l -printf '%l  %p\\n'; "
                 "find . -xdev -printf '%T@:%U:%G:%m  %p.meta\\n'")
    return {line.split("  ", 1)[1]: line.split("  ", 1)[0] for line in out.splitlines() if "  " in line}


def bench_repro(payload: str, scratch: Path, results: dict, run: str) -> None:
    from imgfab.docker import engine
    from imgfab.payload.lock import Lock

    runs = []
    repository = f"imgfab-bench/repro-{run}"  # one recipe, one repository: a CI rebuild
    with payload_options(payload, QWEN, scratch / "repro-lock", salt=uuid.uuid4().hex) as options:
        options.no_cache = True
        groups = Lock.parse(Path(options.lock).read_text()).layers()
        for attempt in ("a", "b"):
            prune_build_cache()  # cold: no step and no uv/apt download cache survives
            started = time.monotonic()
            built = build(QWEN, options, scratch / f"repro-{attempt}", repository, prune=True)
            seconds = time.monotonic() - started
            layers = json.loads(docker("image", "inspect", built.tags[0]))[0]["RootFS"]["Layers"]
            kept = f"imgfab-bench/repro-kept-{run}:{attempt}"  # the next build moves the tag
            docker("tag", built.tags[0], kept)
            pushed = push_measured(built.tags[0], repository, f"repro-{run}", retag=True)
            runs.append((built, seconds, _payload_layers(built, groups), _installed(built.tags[0]),
                         layers, kept, pushed))
    (a, sa, la, ia, fa, ka, pa), (b, sb, lb, ib, fb, kb, pb) = runs
    same = [g for g in groups if la[g] == lb[g]]
    equal = sum(1 for x, y in zip(fa, fb) if x == y) if len(fa) == len(fb) else 0
    if equal < len(fa):  # which files: hash both images' files
        ha, hb = _hashes(ka, "/"), _hashes(kb, "/")
        differ = sorted(path for path in set(ha) | set(hb) if ha.get(path) != hb.get(path))
        print(f"repro: {len(differ)} files differ between the two builds:", flush=True)
        for path in differ[:40]:
            print(f"  {path}: {ha.get(path, '-')[:12]} {hb.get(path, '-')[:12]}", flush=True)
    results["repro"] = (f"two cold builds ({sa:.0f} s, {sb:.0f} s, build cache pruned before each): "
                        f"{len(ia)} and {len(ib)} distributions, {'the same' if ia == ib else 'DIFFERENT'} set; "
                        f"payload layers identical {len(same)}/{len(groups)}"
                        + ("" if len(same) == len(groups) else
                           f" (differ: {' '.join(g for g in groups if g not in same)})")
                        + f"; all layers identical {equal}/{len(fa)}; image ID "
                        + ("the same" if a.image_id == b.image_id else "DIFFERENT")
                        + f"; cold CI rebuild after no change: re-sent {pb['uploaded']} B ÷ image "
                          f"{pb['size']} B = {pb['uploaded'] / pb['size']:.6f} (goal ≤ 0.001)"
                        + "; " + " ".join(f"{g}={la[g][7:19]}" for g in groups))
    for ref in {*a.tags, *b.tags, ka, kb}:
        engine.remove_image(ref, force=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payload", choices=("light", "real"), default="light")
    parser.add_argument("--only", default=",".join(ALL), help=f"comma-separated subset of {','.join(ALL)}")
    parser.add_argument("--bump-vllm", default="0.19.0", help="the other vLLM patch release for 'bump'")
    args = parser.parse_args()
    only = set(args.only.split(","))
    unknown = only - set(ALL)
    if unknown:
        parser.error(f"unknown measurement(s): {', '.join(sorted(unknown))}")
    global PRUNE_AFTER_BUILD
    PRUNE_AFTER_BUILD = args.payload == "real"
    run = uuid.uuid4().hex[:8]
    results: dict[str, str] = {}
    print(f"payload {args.payload}, run {run}" + (f" (locked for the stand-in bases' Python {STAND_IN_PYTHON[0]}, "
                                                  f"{STAND_IN_PYTHON[1]})" if args.payload == "real" else ""), flush=True)
    with tempfile.TemporaryDirectory(prefix="imgfab-bench-") as scratch:
        if "install" in only:
            bench_install(args.payload, Path(scratch), results)
            print(results["install"], flush=True)
        if "push" in only:
            bench_push(args.payload, Path(scratch), results, run)
            print(results["push"], flush=True)
        if "repro" in only:
            bench_repro(args.payload, Path(scratch), results, run)
            print(results["repro"], flush=True)
        if only & {"registry", "serving", "bump", "largest"}:
            bench_fleet(args.payload, Path(scratch), results, run, only, args.bump_vllm)
    print("--")
    for key in ALL:
        if key in results:
            print(results[key])
    return 0


if __name__ == "__main__":
    sys.exit(main())
