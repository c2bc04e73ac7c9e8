"""Shared fixtures: the repository's recipes, the shipped compat matrix and the frozen one.

Logic tests (resolver, matrix, fit) read ``frozen_matrix``: tests/fixtures/compat_frozen, hand-picked
rows that are never refreshed, so every expected answer can be written out from those rows by hand;
they build their recipes from FROZEN_RECIPES, frozen copies of the examples.
``matrix`` is the shipped compat/, for what must follow it (goldens of the example recipes, their
locks, end-to-end runs of the CLI on them)."""

from __future__ import annotations

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
