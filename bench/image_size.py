"""Image size: runtime image vs its base + the venv it serves from, and vs a naive image.

    source .stack/env && python bench/image_size.py --payload light [--free-before-naive auto|yes|no]

Prints (runtime image − base image) ÷ installed size of /opt/venv (goal <= 1.05), and the
runtime image size ÷ a naive single-stage image built the way tutorials do (devel base,
everything as root, pip cache kept), same payload, same stand-in bases.

Where the recipe's stack has a confirmed Triton launchers row (compat/triton_launchers.yaml:
the builder compiles Triton's launchers and the runtime carries no C compiler, issue 33), the
same run also builds the runtime the way a stack without the row gets it (the row unconfirmed
in a copy of compat/: gcc, libc6-dev and python3-dev installed as the declared fallback) and
prints both sizes side by side with their ratio. ``--no-toolchain-compare`` skips that build.

Disk: a real payload's venv (10-25 GB) sits in the builder stage's cache, the runtime image and
the naive image at once. ``--free-before-naive`` (``auto``: when the engine's disk has less free
than ~2x the venv) records the runtime figures first, then removes this run's runtime image
tags and prunes the engine's BuildKit cache (the builder stage, its pip cache mount: every
project's cache) before the naive build. Both images come from the same run, measured the same
way; only the order of the naive build and the removal changes. The naive image keeps its tag
(``--naive-tag``) until you remove it.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

from _payload import (add_payload_arguments, bench_recipe, docker, free_bytes, options_for,
                      prune_build_cache, stack_of)

NAIVE = """FROM {builder}
RUN apt-get update && apt-get install -y python3 python3-venv python3-dev gcc
COPY requirements.txt /app/requirements.txt
RUN --mount=type=secret,id=pip-conf --mount=type=secret,id=ca-cert \\
    if [ -s /run/secrets/pip-conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip-conf; fi; \\
    if [ -s /run/secrets/ca-cert ]; then export PIP_CERT=/run/secrets/ca-cert; fi; \\
    python3 -m venv /opt/venv && /opt/venv/bin/pip install -r /app/requirements.txt
CMD ["/opt/venv/bin/vllm", "serve", "/models"]
"""


def _lock_pins(options):
    """The locked packages (name → (version, hashes)) the imgfab image installs."""
    from imgfab.payload.lock import Lock

    return Lock.parse(Path(options.lock).read_text()).packages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_payload_arguments(parser)
    parser.add_argument("--naive-tag", default=None, help="default imgfab-bench/naive:<payload>")
    parser.add_argument("--free-before-naive", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument("--no-toolchain-compare", action="store_true",
                        help="skip the second runtime build with the declared C compiler")
    args = parser.parse_args()
    from imgfab.docker import engine
    from imgfab.docker.build import _pip_conf, base_image_args, build_recipe

    with tempfile.TemporaryDirectory() as scratch, options_for(args.payload, args.recipe) as options:
        repository = args.repository
        if repository is None:
            import yaml

            own = yaml.safe_load(args.recipe.read_text())["image"]["repository"]
            repository = f"imgfab-bench/{own.rsplit('/', 1)[-1]}-{args.payload}"
        recipe = bench_recipe(args.recipe, Path(scratch), repository)
        started = time.monotonic()
        built = build_recipe(str(recipe), options, context_dir=Path(scratch) / "ctx")
        build_s = time.monotonic() - started
        ref = built.tags[0]
        _, stack, files = stack_of(args.recipe)
        bases = base_image_args(stack, options)
        docker("pull", bases["RUNTIME_IMAGE"])
        base_size = int(engine.inspect_image(bases["RUNTIME_IMAGE"])["Size"])
        docker("pull", bases["BUILDER_IMAGE"])
        builder_size = int(engine.inspect_image(bases["BUILDER_IMAGE"])["Size"])
        venv = int(docker("run", "--rm", "--entrypoint", "du", ref, "-sb", "/opt/venv").split()[0])
        print(f"recorded before the naive build: runtime image {built.size_bytes / 1e6:.1f} MB, "
              f"base {base_size / 1e6:.1f} MB, /opt/venv {venv / 1e6:.1f} MB", flush=True)
        fallback = None
        if stack.triton and not args.no_toolchain_compare:
            fallback, toolchain = _fallback_size(recipe, options, Path(scratch))
            print(f"recorded: the same runtime with the declared C compiler {fallback / 1e6:.1f} MB", flush=True)
        # The runtime figures are recorded: from here on the runtime image may go.
        free = free_bytes()
        freed = args.free_before_naive == "yes" or (
            args.free_before_naive == "auto" and free < 2 * venv + 5e9)
        if freed:
            for tag in built.tags:
                engine.remove_image(tag)
            prune_build_cache()
        free_naive = free_bytes()
        naive_dir = Path(scratch) / "naive"
        naive_dir.mkdir()
        (naive_dir / "Dockerfile").write_text(NAIVE.format(builder=bases["BUILDER_IMAGE"]))
        # The naive image installs the top-level pins with pip, resolving at build time.
        (naive_dir / "requirements.txt").write_text("".join(
            f"{name}=={version}\n" for name, (version, _) in sorted(_lock_pins(options).items())))
        secrets = {"ca-cert": options.ca_cert} if options.ca_cert else {}
        if options.pip_index_url:
            secrets["pip-conf"] = _pip_conf(options.pip_index_url, Path(scratch))
        naive_ref = args.naive_tag or f"imgfab-bench/naive:{args.payload}"
        naive = engine.build(naive_dir, tags=[naive_ref], secrets=secrets, network="host")
        naive_size = int(engine.inspect_image(naive_ref)["Size"])
    size = built.size_bytes
    print(f"payload {args.payload}, recipe {args.recipe.name}, runtime image {ref} "
          f"({built.image_id[:19]}), naive {naive_ref}")
    print(f"imgfab build {build_s:.1f} s (docker build {built.duration_s:.1f} s, "
          f"{built.cached_steps}/{built.steps} steps cached); naive docker build "
          f"{naive.duration_s:.1f} s")
    print(f"disk free before the naive build: {free / 1e9:.1f} GB; "
          + (f"runtime image tags removed and BuildKit cache pruned first: {free_naive / 1e9:.1f} GB"
             if freed else "nothing removed first"))
    print(f"runtime image {size / 1e6:9.1f} MB   base {base_size / 1e6:9.1f} MB   "
          f"/opt/venv {venv / 1e6:9.1f} MB   naive single-stage {naive_size / 1e6:9.1f} MB")
    print(f"(runtime - base) / venv = {(size - base_size) / venv:.3f}   (goal <= 1.05)")
    if fallback is not None:
        print(f"runtime without a C compiler {size / 1e6:9.1f} MB   with the declared fallback "
              f"({', '.join(toolchain)}) {fallback / 1e6:9.1f} MB   saved {(fallback - size) / 1e6:.1f} MB   "
              f"ratio {size / fallback:.3f} (Triton {stack.triton}: {stack.triton_launchers} launchers "
              f"compiled by the builder)")
    print(f"runtime / naive         = {size / naive_size:.3f}   (stand-in bases: runtime base "
          f"{base_size / 1e6:.0f} MB, builder base {builder_size / 1e6:.0f} MB, debootstrap root "
          f"filesystems without CUDA: far smaller than real CUDA images (several GB), so real "
          f"ratios differ)")
    return 0


def _fallback_size(recipe: Path, options, scratch: Path) -> tuple[int, list[str]]:
    """Bytes of ``recipe``'s runtime built as a stack without a Triton launchers row gets it
    (compat/ copied with every row of triton_launchers.yaml unconfirmed: the resolver then keeps
    the backend's declared C compiler), and that toolchain as its label names it. Its tags are
    removed afterwards."""
    import yaml

    from imgfab.docker import engine
    from imgfab.docker.build import build_recipe
    from imgfab.matrix.compat import default_compat_dir

    compat = scratch / "compat-fallback"
    shutil.copytree(options.compat_dir or default_compat_dir(), compat)
    launchers = compat / "triton_launchers.yaml"
    data = yaml.safe_load(launchers.read_text())
    for row in data["launchers"]:
        row.update(confirmed=False, note="unconfirmed for bench/image_size.py's comparison")
    launchers.write_text(yaml.safe_dump(data, sort_keys=False))
    built = build_recipe(str(recipe), dataclasses.replace(options, compat_dir=compat),
                         context_dir=scratch / "ctx-fallback")
    # the packages the built image says it carries (org.imgfab.toolchain)
    toolchain = engine.inspect_image(built.tags[0])["Config"]["Labels"]["org.imgfab.toolchain"].split(",")
    for tag in built.tags:
        engine.remove_image(tag)
    return built.size_bytes, toolchain


if __name__ == "__main__":
    raise SystemExit(main())
