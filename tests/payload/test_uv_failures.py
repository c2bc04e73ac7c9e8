"""uv's failures are classified by whose they are (issue 21): a cache uv cannot use is this
machine's (HostError, exit 1), not a payload that does not resolve (exit 2)."""

from __future__ import annotations

import pytest

from imgfab.errors import CompatibilityError, HostError
from imgfab.payload import lock as lockmod
from imgfab.payload.lock import PayloadRequest

REQUEST = PayloadRequest(recipe="r", stack_line="s", pins=("six==1.16.0",), python="3.12",
                         platform="x86_64-manylinux_2_39", cuda_major="13", indexes=(),
                         default_index="http://127.0.0.1:9/simple")


def test_a_cache_that_is_a_file_is_an_environment_failure(tmp_path, monkeypatch):
    """The real uv, its cache pointed at a file: `Failed to initialize cache at …`."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("UV_CACHE_DIR", str(blocker))
    with pytest.raises(HostError) as caught:
        lockmod.resolve_packages(REQUEST)
    line = caught.value.one_line()
    assert caught.value.exit_code == 1
    assert "Failed to initialize cache" in line and "fix: make UV_CACHE_DIR" in line


FAKE_UV = """#!/bin/sh
echo 'error: {first}' >&2
echo '  cause: {cause}' >&2
exit 2
"""


@pytest.mark.parametrize("first, cause, error", [
    ("Failed to write to the client cache", "No space left on device (os error 28)", HostError),
    ("Failed to create temporary file", "Permission denied (os error 13)", HostError),
    ("No solution found when resolving dependencies:",
     "Because there is no version of six==9.9 and you require six==9.9, we can conclude that "
     "your requirements are unsatisfiable.", CompatibilityError),
])
def test_uv_messages_are_classified(tmp_path, first, cause, error):
    uv = tmp_path / "uv"
    uv.write_text(FAKE_UV.format(first=first, cause=cause))
    uv.chmod(0o755)
    with pytest.raises(error) as caught:
        lockmod.resolve_packages(REQUEST, uv=str(uv))
    assert caught.value.exit_code == (1 if error is HostError else 2)


def test_a_missing_uv_is_an_environment_failure(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_uv(name, *args, **kwargs):
        if name == "uv":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uv)
    with pytest.raises(HostError, match="uv is not installed"):
        lockmod.uv_binary()


def test_imgfab_lock_exits_1_with_one_line_when_uv_cannot_use_its_cache(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import REPO

    blocker = tmp_path / "cache-file"
    blocker.write_text("")
    env = dict(os.environ, UV_CACHE_DIR=str(blocker), PYTHONPATH=str(REPO / "src"))
    result = subprocess.run([sys.executable, "-m", "imgfab.cli", "lock",
                             str(REPO / "recipes" / "qwen2-7b-h100.yaml"),
                             "--index-url", "http://127.0.0.1:9/simple",
                             "--output", str(tmp_path / "x.lock"), "-q"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("imgfab: lock: uv failed on this machine")
    assert not (tmp_path / "x.lock").exists()
