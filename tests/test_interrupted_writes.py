"""Files imgfab replaces by a rename (the lock, the bake file) leave nothing beside them when
a signal (issue 21: SIGTERM arrives as imgfab.interrupts.Interrupted) lands before the rename:
the old file stays whole and no temporary file is left."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from imgfab.interrupts import Interrupted

from conftest import RECIPES


def _rename_interrupted(monkeypatch):
    def interrupted(*args, **kwargs):
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(os, "replace", interrupted)
    monkeypatch.setattr(Path, "replace", interrupted)


def test_an_interrupted_lock_write_leaves_the_old_lock_and_no_temporary(tmp_path, monkeypatch):
    from imgfab.payload import lock as lockmod

    path = tmp_path / "r.lock"
    path.write_text("old\n")
    _rename_interrupted(monkeypatch)
    with pytest.raises(Interrupted):
        lockmod._write(path, "new\n")
    assert [p.name for p in tmp_path.iterdir()] == ["r.lock"] and path.read_text() == "old\n"


def test_an_interrupted_bake_write_leaves_no_partial_file(tmp_path, monkeypatch):
    from imgfab.render.bake import write_bake

    path = tmp_path / "docker-bake.json"
    path.write_text("{}\n")
    recipe = next(p for p in RECIPES if p.name == "qwen2-7b-h100.yaml")
    _rename_interrupted(monkeypatch)
    with pytest.raises(Interrupted):
        write_bake([str(recipe)], path)
    assert not list(tmp_path.glob(".*")) and path.read_text() == "{}\n"
