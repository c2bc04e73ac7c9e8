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
