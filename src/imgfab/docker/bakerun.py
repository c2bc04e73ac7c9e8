"""``imgfab bake --build``: ``docker buildx bake`` on the file bake wrote (issue 37), on the
engine's own builder or on a buildx builder by name (:mod:`imgfab.docker.buildcache`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from imgfab.docker import engine
from imgfab.docker.buildcache import builder_driver, check_engine_builder
from imgfab.docker.toolenv import tool_env
from imgfab.errors import EngineError
from imgfab.render.bake import SECRETS


def run_bake(path: Path, *, builder: str | None = None, targets: list[str] | None = None) -> None:
    """``docker buildx bake -f PATH [--builder NAME] [TARGET…]`` from the current directory (where
    the file's relative paths point), its progress on stderr; the build secrets
    (:data:`imgfab.render.bake.SECRETS`) from this process's environment, nothing else secret. EngineError (exit
    1) when buildx fails, naming its last lines."""
    cli = engine.docker_cli(buildx=True)
    env = tool_env("docker", {"DOCKER_BUILDKIT": "1", **{var: os.environ[var] for _, var in SECRETS
                                                         if var in os.environ}})
    argv = [cli, "buildx", "bake", "--progress=plain", "-f", str(path)]
    if builder:
        # an unknown builder, or another context's engine: one line, exit 1
        check_engine_builder(cli, builder, builder_driver(cli, builder, env), env)
        argv += ["--builder", builder]
    argv += list(targets or [])
    tail: list[str] = []
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace", bufsize=1, start_new_session=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stderr.write(line)
            tail = (tail + [line.rstrip("\n")])[-3:]
        code = process.wait()
    except BaseException:  # a signal: the bake must not go on
        engine.stop_process_group(process)
        raise
    if code != 0:
        raise EngineError(f"docker buildx bake failed (exit {code}): {' | '.join(tail)}",
                          field="bake", fix="see the log above")
