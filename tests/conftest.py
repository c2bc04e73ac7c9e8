"""Shared fixtures: the repository's recipes, the shipped compat matrix and the frozen one.

Logic tests (resolver, matrix, fit) read ``frozen_matrix``: tests/fixtures/compat_frozen, hand-picked
rows that are never refreshed, so every expected answer can be written out from those rows by hand;
they build their recipes from FROZEN_RECIPES, frozen copies of the examples.
``matrix`` is the shipped compat/, for what must follow it (goldens of the example recipes, their
locks, end-to-end runs of the CLI on them)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
FROZEN_COMPAT = REPO / "tests" / "fixtures" / "compat_frozen"
FROZEN_RECIPES = REPO / "tests" / "fixtures" / "recipes_frozen"
# The demo recipe with its vLLM 0.19.1 lock as committed at e4cd16e, before issue 34 moved the
# demo to vLLM 0.33.0: the lock and payload tests about that lock read this pair.
VLLM_0191 = REPO / "tests" / "fixtures" / "locks" / "vllm-0.19.1" / "qwen2-7b-h100.yaml"


@pytest.fixture(scope="session")
def matrix():
    from imgfab.matrix.compat import load_matrix

    return load_matrix()


@pytest.fixture(scope="session")
def frozen_matrix():
    from imgfab.matrix.compat import load_matrix

    return load_matrix(FROZEN_COMPAT)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


# The planted-bug harness and the fuzz campaign take minutes, and the `network` tests need
# PyPI: they run only when the -m expression names them (`-m mutation`, `-m fuzz`,
# `-m network`); otherwise they are deselected, and pytest's summary counts them as
# deselected, not as passed.
_HEAVY = ("mutation", "fuzz", "network")


def pytest_collection_modifyitems(config, items):
    """Deselect the heavy campaigns unless asked for; run `engine_crash_risk` tests last.

    `docker buildx bake` runs the fleet's builds concurrently with shared steps: the pattern
    under which Docker 20.10's BuildKit can panic ("failed to get edge", moby/moby#42414) and
    take the engine down. It runs last, so such a crash cannot fail the other tests with it."""
    expression = config.getoption("markexpr") or ""
    kept, dropped = [], []
    for item in items:
        heavy = [name for name in _HEAVY if item.get_closest_marker(name)]
        (dropped if heavy and not any(name in expression for name in heavy) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    last = [item for item in kept if item.get_closest_marker("engine_crash_risk")]
    items[:] = [item for item in kept if item not in last] + last


def _image_refs(docker: str) -> set[str] | None:
    listed = subprocess.run([docker, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}"],
                            capture_output=True, text=True, check=False, timeout=120)
    return set(listed.stdout.split()) if listed.returncode == 0 else None


@pytest.fixture(scope="module", autouse=True)
def _engine_disk(request):
    """After a module of integration tests, the local engine gives back its disk: the images
    tagged during the module are untagged and BuildKit's cache is emptied (the stand-in bases,
    tagged before, stay). Every integration build installs a payload, the real Triton among
    them, and keeps copies of it in BuildKit's cache and in the image store; CI's fresh
    machine has a small disk (stop 42's run ended in "No space left on device"). Each module
    builds what it needs (module-scoped fixtures); none reads another module's cache."""
    docker = os.environ.get("IMGFAB_DOCKER_CLI")
    integration = any(item.get_closest_marker("integration") for item in request.session.items
                      if item.module is request.module)
    before = _image_refs(docker) if docker and os.environ.get("DOCKER_HOST") and integration else None
    yield
    if before is None:
        return
    after = _image_refs(docker) or set()
    added = sorted(ref for ref in after - before if not ref.endswith(":<none>"))
    if added:
        subprocess.run([docker, "image", "rm", *added], capture_output=True, check=False, timeout=600)
    subprocess.run([docker, "builder", "prune", "-af"], capture_output=True, check=False, timeout=600)


def walk_strings(node, path=()):
    """Every (key path, string) in a parsed workflow."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk_strings(value, (*path, str(key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk_strings(value, (*path, index))
    elif isinstance(node, str):
        yield path, node
