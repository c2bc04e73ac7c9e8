"""Shared fixtures: the repository's recipes and the shipped compat matrix."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


@pytest.fixture(scope="session")
def matrix():
    from imgfab.compat import load_matrix

    return load_matrix()


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


# The planted-bug harness and the fuzz campaign take minutes: they run only when the -m
# expression names them (`-m mutation`, `-m fuzz`); otherwise they are deselected, and pytest's
# summary counts them as deselected, not as passed.
_HEAVY = ("mutation", "fuzz")


def pytest_collection_modifyitems(config, items):
    expression = config.getoption("markexpr") or ""
    kept, dropped = [], []
    for item in items:
        heavy = [name for name in _HEAVY if item.get_closest_marker(name)]
        (dropped if heavy and not any(name in expression for name in heavy) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
