"""The pip-source key (issue 21): written whole or not at all (temporary file, fsync, link into
place), and a short or empty key file is refused with one line naming it and the fix."""

from __future__ import annotations

import stat

import pytest

from imgfab.docker import build as build_module
from imgfab.docker.build import pip_source_key
from imgfab.errors import HostError


def test_first_use_makes_a_private_32_byte_key_and_keeps_it(tmp_path):
    key = pip_source_key(tmp_path / "imgfab")
    path = tmp_path / "imgfab" / "pip-source.key"
    assert len(key) == 32 and path.read_bytes() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert pip_source_key(tmp_path / "imgfab") == key
    assert [p.name for p in path.parent.iterdir()] == ["pip-source.key"], "no staging file left"


@pytest.mark.parametrize("content", [b"", b"\0" * 31], ids=["empty", "short"])
def test_a_cut_short_key_file_is_refused(tmp_path, content):
    path = tmp_path / "pip-source.key"
    path.write_bytes(content)
    with pytest.raises(HostError) as caught:
        pip_source_key(tmp_path)
    line = caught.value.one_line()
    assert caught.value.exit_code == 1
    assert str(path) in line and f"fix: delete {path}" in line and "\n" not in line
    assert path.read_bytes() == content, "the file is the user's to delete, not rewritten"


def test_a_kill_between_create_and_write_leaves_no_key_file(tmp_path, monkeypatch):
    """Before issue 21 the key file was created first and written after: a kill (here: the
    random source failing) in between left an empty key that every later build used."""
    def killed(n):
        raise KeyboardInterrupt

    monkeypatch.setattr(build_module.random_secrets, "token_bytes", killed)
    with pytest.raises(KeyboardInterrupt):
        pip_source_key(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_key_another_build_made_first_wins(tmp_path, monkeypatch):
    """Two first builds at once: the one that links second reads the first one's key."""
    theirs = b"k" * 32
    real_link = build_module.os.link

    def link_after_them(source, target):
        (tmp_path / "pip-source.key").write_bytes(theirs)
        real_link(source, target)

    monkeypatch.setattr(build_module.os, "link", link_after_them)
    assert pip_source_key(tmp_path) == theirs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pip-source.key"]


def test_a_cache_that_cannot_hold_the_key_is_one_line(tmp_path):
    (tmp_path / "not-a-dir").write_text("")
    with pytest.raises(HostError) as caught:
        pip_source_key(tmp_path / "not-a-dir" / "imgfab")
    assert "cannot make or read" in caught.value.one_line()
    assert caught.value.exit_code == 1
