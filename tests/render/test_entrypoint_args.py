"""Container arguments reach the command they name, never bash's ``exec`` (issue 21).

``exec "$@"`` takes a first argument that starts with ``-`` as one of exec's own options:
``-c`` (clear the environment), ``-a NAME`` (run the next word as the command, renamed),
``--version``. The rendered entrypoint says ``exec -- "$@"``; here it runs with commands
named ``-c``, ``-a`` and ``--version`` on PATH that record how they were called."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

RECORDER = """#!/bin/sh
printf '%s\\n' "$(basename -- "$0")" "$@" > "$ARGS_LOG"
"""


@pytest.fixture(scope="module")
def entrypoint(tmp_path_factory, matrix) -> Path:
    from imgfab.recipe import load_recipe
    from imgfab.render.context import render_context, write_context
    from imgfab.stack.resolve import resolve

    recipe = load_recipe(REPO / "recipes" / "qwen2-7b-h100.yaml")
    files = render_context(recipe, resolve(recipe, matrix).stack, matrix)
    return write_context(files, tmp_path_factory.mktemp("ctx") / "ctx") / "entrypoint.sh"


@pytest.mark.parametrize("args", [["-c", "echo pwned"], ["-a", "evil", "echo", "pwned"],
                                  ["--version"]], ids=lambda a: a[0])
def test_arguments_starting_with_a_dash_are_the_commands(entrypoint, tmp_path, args):
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / args[0]).write_text(RECORDER)
    (stubs / args[0]).chmod(0o755)
    log = tmp_path / "args.log"
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", ARGS_LOG=str(log),
               IMGFAB_SKIP_PROBE="1")
    result = subprocess.run(["bash", str(entrypoint), *args], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "pwned" not in result.stdout
    assert log.read_text().splitlines() == args
