"""Every CLI failure is one printable line (issue 12): no terminal escape from a user value or a
registry reaches the terminal, click's usage errors included."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _imgfab(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from imgfab.cli import main; main()", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def _clean(text: str) -> bool:
    return not any(ord(ch) < 32 and ch != "\n" or 0x7f <= ord(ch) <= 0x9f for ch in text)


def test_a_file_name_with_terminal_escapes_is_printed_without_them(tmp_path):
    result = _imgfab("resolve", "evil\x1b]0;owned\x07\x1b[2J.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and _clean(result.stderr), repr(result.stderr)


@pytest.mark.parametrize("args", [("render", "--bogus", "x"), ("nosuch",), ("push",),
                                  ("matrix", "--gpu", "H100"), ("select", "--registry")])
def test_click_usage_errors_are_one_line_exit_2(tmp_path, args):
    result = _imgfab(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("imgfab: "), result.stderr
    assert "--help" in result.stderr
