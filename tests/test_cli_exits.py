"""Honest exit codes (issue 23): a command that produced something unusable is not exit 0."""

from __future__ import annotations

import re
import shlex
import os
import shutil
import subprocess
import sys

import click

from conftest import RECIPES, REPO

LOCKED = REPO / "recipes/qwen2-7b-h100.yaml"
REFUSED = sorted(r for r in RECIPES if "# refused:" in r.with_suffix(".lock").read_text())


def imgfab(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def test_render_without_a_lock_is_exit_2_and_writes_nothing(tmp_path):
    recipe = tmp_path / LOCKED.name
    shutil.copy(LOCKED, recipe)
    result = imgfab("render", str(recipe), "-o", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("imgfab: lock: ") and "is missing" in line
    assert "`imgfab lock" in line and "--unlocked" in line, line
    assert not (tmp_path / "out").exists() and result.stdout == ""


def test_render_unlocked_writes_a_context_that_says_so(tmp_path):
    recipe = tmp_path / LOCKED.name
    shutil.copy(LOCKED, recipe)
    result = imgfab("render", str(recipe), "-o", str(tmp_path / "out"), "--unlocked")
    assert result.returncode == 0, result.stderr
    assert "not locked" in result.stderr and "does not build" in result.stderr
    assert (tmp_path / "out/requirements.lock").read_text().startswith("# not locked")


def test_render_with_the_committed_lock_is_exit_0(tmp_path):
    # no registry from the environment either (the local stack's env sets IMGFAB_REGISTRY)
    env = {k: v for k, v in os.environ.items() if k != "IMGFAB_REGISTRY"}
    result = imgfab("render", str(LOCKED), "-o", str(tmp_path / "out"), env=env)
    assert result.returncode == 0, result.stderr
    # the one note: no registry was given (issue 34: k8s.yaml names REGISTRY.invalid)
    [note] = result.stderr.splitlines()
    assert note.startswith("imgfab: note: no registry given: ")
    assert not (tmp_path / "out/requirements.lock").read_text().startswith("# not locked")


def test_render_of_a_stale_lock_is_exit_2(tmp_path):
    recipe = tmp_path / LOCKED.name
    shutil.copy(LOCKED, recipe)
    lock = LOCKED.with_suffix(".lock").read_text()
    (tmp_path / LOCKED.with_suffix(".lock").name).write_text(lock.replace("==", "==0", 1))
    result = imgfab("render", str(recipe), "-o", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert "stale" in result.stderr and not (tmp_path / "out").exists()


def test_render_of_a_refused_recipe_is_exit_2_naming_the_refusal(tmp_path):
    assert REFUSED, "the TensorRT-LLM recipes' locks record a refusal"
    result = imgfab("render", str(REFUSED[0]), "-o", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "incompatible" in line and "fix:" in line and "--unlocked" in line
    assert not (tmp_path / "out").exists()


def test_lock_check_refusal_is_exit_2_unless_allowed():
    result = imgfab("lock", "--check", str(REFUSED[0]), str(LOCKED))
    assert result.returncode == 2, result.stderr
    assert REFUSED[0].stem in result.stderr and "--allow-refused" in result.stderr
    assert "qwen2-7b-h100: lock current" in result.stdout
    allowed = imgfab("lock", "--check", "--allow-refused", str(REFUSED[0]), str(LOCKED))
    assert allowed.returncode == 0, allowed.stderr
    assert f"{REFUSED[0].stem}: lock current; refused:" in allowed.stdout
    fresh = imgfab("lock", "--check", str(LOCKED))
    assert fresh.returncode == 0 and fresh.stderr == ""


def test_allow_refused_is_a_kind_of_check():
    result = imgfab("lock", "--allow-refused", str(LOCKED))
    assert result.returncode == 2 and result.stderr.startswith("imgfab: --allow-refused:")


def test_ci_run_lock_check_is_green_and_explicit():
    """`.ci/run`'s lock line, run as it stands, passes, and accepts refusals by name of flag."""
    (line,) = [ln for ln in (REPO / ".ci/run").read_text().splitlines() if " lock --check" in ln]
    assert "--allow-refused" in line
    words = shlex.split(line.split("||")[0])
    assert words[0].endswith("imgfab")
    paths = [str(p.relative_to(REPO)) for p in RECIPES]
    args = [w for w in words[1:] if w != "recipes/*.yaml"] + paths
    result = imgfab(*args, cwd=REPO)
    assert result.returncode == 0, result.stderr


def _readme_exit_section() -> str:
    text = (REPO / "README.md").read_text()
    return text.split("### Exit codes", 1)[1].split("\n#", 1)[0]


def test_readme_states_exit_codes_for_every_command():
    from imgfab.cli import cli

    section = _readme_exit_section()
    for code in ("0", "1", "2"):
        assert re.search(rf"^\| {code} \| ", section, re.M), code
    names = []
    for name, command in cli.commands.items():
        if isinstance(command, click.Group):
            names += [f"{name} {sub}" for sub in command.commands]
        else:
            names.append(name)
    missing = [n for n in names if f"`{n}`" not in section]
    assert not missing, f"README's exit codes do not name {missing}"
