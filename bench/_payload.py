"""Shared by the bench scripts: the light (fake wheels on a local index) or real payload."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
import fake_payload  # noqa: E402  (tests/fixtures, on the path from here)
DOCKER = os.environ.get("IMGFAB_DOCKER_CLI", "/usr/bin/docker")


def docker(*args: str) -> str:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=True).stdout


def stack_of(recipe: Path):
    from imgfab.matrix.compat import load_matrix
    from imgfab.recipe import load_recipe
    from imgfab.render.context import render_context
    from imgfab.stack.resolve import resolve

    parsed = load_recipe(recipe)
    matrix = load_matrix()
    stack = resolve(parsed, matrix).stack
    return parsed, stack, render_context(parsed, stack, matrix)


# the local stack's bookworm stand-in bases: their Python (kept in fake_payload) and glibc
STAND_IN_PYTHON = (fake_payload.STAND_IN_PYTHON, "x86_64-manylinux_2_36")


def stand_in_lock(recipe: Path, output: Path, *, pins: dict[str, str] | None = None) -> Path:
    """``recipe`` locked from PyPI for the stand-in bases' interpreter (Python 3.11, glibc
    2.36); ``pins`` replaces top-level pins (e.g. another vLLM patch release)."""
    from imgfab.payload.lock import lock_recipe

    lock_recipe(str(recipe), output=output, upgrade=True, python=STAND_IN_PYTHON[0],
                platform=STAND_IN_PYTHON[1], extra_pins=pins or None)
    return output


@contextlib.contextmanager
def options_for(payload: str, recipe: Path) -> Iterator:
    """BuildOptions for ``payload``: light (fake wheels on 127.0.0.1, locked against that
    index) or real (PyPI through the host CA bundle, locked for the stand-in bases)."""
    from imgfab.docker.build import BuildOptions

    ca = os.environ.get("IMGFAB_CA_CERT")
    base = dict(mirror=os.environ.get("IMGFAB_MIRROR"), network="host",
                ca_cert=Path(ca) if ca else None)
    with tempfile.TemporaryDirectory() as root:
        if payload == "real":
            yield BuildOptions(lock=stand_in_lock(recipe, Path(root) / f"{recipe.stem}.lock"), **base)
            return
        from fake_payload import INDEX_BUILD_ENV, locked_index

        for name, value in INDEX_BUILD_ENV.items():
            os.environ.setdefault(name, value)
        with locked_index(recipe, Path(root)) as (url, lock):
            yield BuildOptions(pip_index_url=url, lock=lock, **base)


def bench_recipe(recipe: Path, directory: Path, repository: str | None, text: str | None = None) -> Path:
    """A copy of ``recipe`` (or of ``text``) in ``directory`` whose ``image.repository`` is
    ``repository``, so a bench build never moves the tag an operator's or a test's image has
    (the repository is in no layer above the serving layers: the measured builds are the same).
    ``repository=None`` keeps the recipe's own."""
    import re

    text = recipe.read_text() if text is None else text
    if repository:
        text, count = re.subn(r"(?m)^(\s+repository:\s*)\S+", lambda m: m.group(1) + repository,
                              text, count=1)
        assert count == 1, f"no image.repository in {recipe}"
    copy = directory / recipe.name
    copy.write_text(text)
    return copy


def free_bytes() -> int:
    """Free bytes on the engine's data disk (this stack's dockerd is local)."""
    import json
    import shutil

    root = json.loads(docker("info", "--format", "{{json .DockerRootDir}}"))
    return shutil.disk_usage(root).free


def prune_build_cache() -> None:
    """Empties the engine's whole BuildKit cache (every project's): a cold build."""
    docker("builder", "prune", "-af")


def add_payload_arguments(parser) -> None:
    """The options both bench scripts share: payload, recipe, repository of the bench builds."""
    parser.add_argument("--payload", choices=("light", "real"), default="light")
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "qwen2-7b-h100.yaml")
    parser.add_argument("--repository", default=None,
                        help="image.repository for the bench builds (default imgfab-bench/"
                             "<recipe repository's last part>-<payload>; '' keeps the recipe's)")
