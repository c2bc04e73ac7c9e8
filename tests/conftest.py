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


def pytest_collection_modifyitems(config, items):
    """`docker buildx bake` runs the fleet's builds concurrently with shared steps: the pattern
    under which Docker 20.10's BuildKit can panic ("failed to get edge", moby/moby#42414) and
    take the engine down. It runs last, so such a crash cannot fail the other tests with it."""
    last = [item for item in items if item.get_closest_marker("engine_crash_risk")]
    items[:] = [item for item in items if item not in last] + last
