"""`imgfab render -o DIR` never deletes what the user owns (issue 12): only a directory that
carries a previous render's marker (or an empty one) is replaced, unless --force; the swap is
atomic for concurrent readers and writers and leaves nothing behind; modes ignore the umask."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from imgfab.errors import RecipeError
from imgfab.render.context import write_context

RENDER_MARKER = ".imgfab-render"  # imgfab.render.context.RENDER_MARKER, spelt out: the on-disk contract

from conftest import RECIPES

RECIPE = next(p for p in RECIPES if p.name == "qwen2-7b-h100.yaml")


def _imgfab(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from imgfab.cli import main; main()", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_render_refuses_a_directory_that_is_not_a_render(tmp_path):
    user_dir = tmp_path / "mine"
    user_dir.mkdir()
    recipe = user_dir / "recipe.yaml"
    shutil.copy(RECIPE, recipe)
    shutil.copy(RECIPE.with_suffix(".lock"), user_dir / "qwen2-7b-h100.lock")  # render needs it
    result = _imgfab("render", str(recipe), "-o", str(user_dir), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "--force" in result.stderr
    assert recipe.read_text() == RECIPE.read_text(), "the user's file is still there"


def test_render_force_replaces_and_a_render_replaces_its_own_output(tmp_path):
    user_dir = tmp_path / "mine"
    user_dir.mkdir()
    (user_dir / "notes.txt").write_text("mine\n")
    result = _imgfab("render", str(RECIPE), "-o", str(user_dir), "--force", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (user_dir / "notes.txt").exists() and (user_dir / RENDER_MARKER).is_file()
    again = _imgfab("render", str(RECIPE), "-o", str(user_dir), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"], "nothing left behind"


@pytest.mark.parametrize("make", ["file", "symlink", "cwd"])
def test_odd_output_targets_are_one_line_errors(tmp_path, make):
    if make == "file":
        target = tmp_path / "f"
        target.write_text("x")
    elif make == "symlink":
        (tmp_path / "real").mkdir()
        target = tmp_path / "link"
        target.symlink_to(tmp_path / "real")
    else:
        target = tmp_path
    result = _imgfab("render", str(RECIPE), "-o", str(target), "--force", cwd=tmp_path)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_unwritable_output_is_one_line_exit_1(tmp_path):
    result = _imgfab("render", str(RECIPE), "-o", "/proc/imgfab-cannot/x", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "internal error" not in result.stderr


def test_write_context_refuses_without_force(tmp_path):
    target = tmp_path / "ctx"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    with pytest.raises(RecipeError):
        write_context({"a.txt": "x"}, target)
    assert (target / "keep.txt").read_text() == "keep"
    write_context({"a.txt": "x"}, target, force=True)
    assert sorted(p.name for p in target.iterdir()) == [RENDER_MARKER, "a.txt"]


def test_modes_ignore_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        out = write_context({"run.sh": "#!/bin/sh\n", "sub/deep/f.txt": "x"}, tmp_path / "ctx")
    finally:
        os.umask(old)
    assert (out.stat().st_mode & 0o777) == 0o755
    assert ((out / "sub").stat().st_mode & 0o777) == 0o755
    assert ((out / "sub/deep").stat().st_mode & 0o777) == 0o755
    assert ((out / "sub/deep/f.txt").stat().st_mode & 0o777) == 0o644
    assert ((out / "run.sh").stat().st_mode & 0o777) == 0o755


def test_swap_is_atomic_for_readers_and_concurrent_writers(tmp_path):
    target = tmp_path / "ctx"
    write_context({"Dockerfile": "FROM a\n"}, target)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(150):
                write_context({"Dockerfile": f"FROM w{n}-{i}\n", "x/y.txt": "y"}, target)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(2)]
    for thread in writers:
        thread.start()
    misses = reads = 0
    while any(t.is_alive() for t in writers):
        reads += 1
        try:
            (target / "Dockerfile").read_text()
        except FileNotFoundError:
            misses += 1
    for thread in writers:
        thread.join()
    stop.set()
    assert errors == []
    assert misses == 0, f"{misses} of {reads} reads found no render"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctx"], "nothing left behind"
