"""Recipes → one ``docker-bake.json`` for ``docker buildx bake`` (remote BuildKit builders, CI).

Each recipe is resolved and rendered into ``<bake file's folder>/<recipe name>`` (as
``imgfab render`` does), then gets one bake target. Format: the JSON flavour of the Bake file
reference, https://docs.docker.com/build/bake/reference/ (``group``/``target`` blocks).

Paths in the file are relative to the directory :func:`write_bake` ran in, which is where
Bake resolves them: run ``docker buildx bake -f build/docker-bake.json`` from there.

TensorRT engine recipes are rendered for ``--engine-at-start``: Bake cannot run the GPU compile
phase of a two-phase build, whose ``engine/`` would otherwise be missing from the context; the
engine compiles on the serving host's first start into the engine cache volume.

Build secrets come from the environment of the ``bake`` process, by content, so an unset
variable is simply an absent secret (``netenv.sh`` tests ``-s``), never a failed build:
``IMGFAB_CA_CERT_PEM`` (a PEM bundle → secret ``ca-cert``) and ``IMGFAB_PIP_CONF`` (a pip.conf
→ secret ``pip-conf``). E.g. ``IMGFAB_CA_CERT_PEM="$(cat "$IMGFAB_CA_CERT")" docker buildx bake …``.

Build steps run on the builder's default network: an index on the build host must listen on
an address containers reach (the bridge gateway), not loopback. buildx 0.13 reads no
``network`` from a JSON bake file (the field is HCL-only there), so none is written.

A registry build cache (issue 37): ``--cache-from`` / ``--cache-to`` become each target's
``cache-from`` / ``cache-to`` lists, ``{recipe}`` replaced by the recipe's name, so that every
recipe of a fleet reads and writes a cache ref of its own (``mode=max`` keeps the builder
stage's layers too: a CI runner with an empty local cache then pulls the payload install
instead of running it). :func:`imgfab.docker.buildcache.run_bake` runs ``docker buildx bake`` on the file, on the
engine's own builder or on a buildx builder by name (``--builder``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from imgfab.errors import RecipeError

# (secret id the Dockerfile mounts, environment variable holding its content)
SECRETS = (("ca-cert", "IMGFAB_CA_CERT_PEM"), ("pip-conf", "IMGFAB_PIP_CONF"))
BUILD_STAGE = "runtime"


def target_name(recipe_name: str) -> str:
    """A Bake target name (``[a-zA-Z0-9_-]+``) for a recipe: other characters become ``_``."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", recipe_name)


def mirrored(ref: str, mirror: str | None) -> str:
    """``ref`` under the mirror prefix, as scripts/local-stack.sh pushes them:
    ``nvidia/cuda:12.8.1-devel-ubuntu24.04`` → ``<mirror>/nvidia/cuda:12.8.1-devel-ubuntu24.04``."""
    return f"{mirror.rstrip('/')}/{ref}" if mirror else ref


def bake_definition(recipe_paths: list[str], out_dir: Path, *, mirror: str | None = None,
                    registry: str | None = None, compat_dir: Path | None = None,
                    lock_dir: Path | None = None, lock: Path | None = None,
                    progress: Any = None, cache_from: tuple[str, ...] = (),
                    cache_to: tuple[str, ...] = ()) -> dict[str, Any]:
    """Render every recipe into ``out_dir/<name>`` and return the bake definition (a dict);
    ``progress`` (:class:`imgfab.progress.Progress`) hears of each recipe rendered.

    ``cache_from`` / ``cache_to``: BuildKit cache specs (:mod:`imgfab.docker.buildcache`), each
    target's own with ``{recipe}`` replaced by its recipe's name (``cache-from`` / ``cache-to``
    in the target); checked before any recipe is read.

    Each recipe installs its committed, fresh lock; ``lock_dir/<name>.lock`` instead when
    ``lock_dir`` is given, or ``lock`` itself, the lock of the one recipe (``build --lock``).

    Raises :class:`RecipeError` / :class:`CompatibilityError` as ``imgfab render`` does, and
    :class:`RecipeError` when two recipes map to the same target name or ``lock`` is given
    for several recipes.
    """
    from imgfab.matrix.compat import load_matrix  # noqa: PLC0415
    from imgfab.payload.lock import load_for_build  # noqa: PLC0415
    from imgfab.recipe import load_recipe  # noqa: PLC0415
    from imgfab.render.context import context_image, image_output, render_context, write_context  # noqa: PLC0415
    from imgfab.render.source import source_epoch, source_of  # noqa: PLC0415
    from imgfab.stack.resolve import resolve  # noqa: PLC0415

    from imgfab.render.cachespec import check_cache_specs, for_recipe  # noqa: PLC0415

    check_cache_specs(cache_from, cache_to, len(recipe_paths))
    if lock is not None and len(recipe_paths) != 1:
        raise RecipeError("--lock names the lock of one recipe", field="--lock",
                          fix="bake one recipe per --lock, or give --lock-dir")
    matrix = load_matrix(compat_dir)
    targets: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    for index, path in enumerate(recipe_paths, start=1):
        recipe = load_recipe(path)
        stack = resolve(recipe, matrix, None).stack
        strategy = "at-start" if stack.backend_path == "engine" else "two-phase"
        # The payload the builder installs, as `imgfab build` would: the committed fresh lock,
        # or <lock_dir>/<name>.lock or the --lock file as given (locks resolved against a
        # mirror or a test index).
        lock_file = lock or (lock_dir / f"{recipe.name}.lock" if lock_dir else None)
        payload = load_for_build(path, recipe, stack, lock_file, compat_dir)
        args = {"BUILDER_IMAGE": mirrored(stack.builder_image, mirror),
                "RUNTIME_IMAGE": mirrored(stack.runtime_image, mirror)}
        target_registry = registry or recipe.image.registry  # as imgfab build: --registry wins
        source = source_of(path)
        files = render_context(recipe, stack, matrix, engine_strategy=strategy, lock=payload,
                               registry=target_registry, bases=args, source=source)
        context = write_context(files, out_dir / recipe.name)
        name = target_name(recipe.name)
        if name in targets:
            raise RecipeError(f"{path} and {sources[name]} both become bake target {name}",
                              field="name", fix="give the recipes distinct names")
        sources[name] = path
        targets[name] = {
            "context": Path(os.path.relpath(context, Path.cwd())).as_posix(),
            "dockerfile": "Dockerfile",
            "target": BUILD_STAGE,
            # As `imgfab build` makes them (imgfab.docker.engine.build_output_args): the config's
            # times from the source, the recipe's layer compression, no BuildKit attestations.
            "args": {**args, "SOURCE_DATE_EPOCH": str(source_epoch(source))},
            "tags": [context_image(files)["ref"]],
            "secret": [f"type=env,id={sid},env={var}" for sid, var in SECRETS],
            "output": [image_output(recipe.image.compression)],
            "attest": ["type=provenance,disabled=true", "type=sbom,disabled=true"],
        }
        if cache_from:
            targets[name]["cache-from"] = for_recipe(cache_from, recipe.name)
        if cache_to:
            targets[name]["cache-to"] = for_recipe(cache_to, recipe.name)
        if progress is not None:  # after the recipe: a bad one is its one error line, alone
            progress.item("bake: rendered", index, len(recipe_paths), Path(path).name)
    return {"group": {"default": {"targets": sorted(targets)}},
            "target": dict(sorted(targets.items()))}


def write_bake(recipe_paths: list[str], path: Path, *, mirror: str | None = None,
               registry: str | None = None, compat_dir: Path | None = None,
               lock_dir: Path | None = None, lock: Path | None = None, progress: Any = None,
               cache_from: tuple[str, ...] = (), cache_to: tuple[str, ...] = ()) -> Path:
    """Render ``recipe_paths`` next to ``path`` and write the bake file there; returns ``path``.

    ``mirror`` prefixes the base images (``BUILDER_IMAGE``/``RUNTIME_IMAGE`` args);
    ``registry`` prefixes the tags; ``compat_dir``, ``lock_dir`` and ``lock`` are
    :func:`bake_definition`'s, as are ``cache_from`` and ``cache_to``. The JSON is deterministic
    (sorted keys, trailing newline).
    """
    path = Path(path)
    definition = bake_definition(recipe_paths, path.parent, mirror=mirror, registry=registry,
                                 compat_dir=compat_dir, lock_dir=lock_dir, lock=lock, progress=progress,
                                 cache_from=cache_from, cache_to=cache_to)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.partial")
    try:
        staging.write_text(json.dumps(definition, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(staging, path)
    except BaseException:  # an interrupt or a full disk: the old file stays, no partial beside it
        staging.unlink(missing_ok=True)
        raise
    return path

