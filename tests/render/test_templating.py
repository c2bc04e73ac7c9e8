"""The Jinja2 bytecode cache (render/templating.py): it is used, it never serves code compiled
under other options, and a cache that cannot be written is not an error."""

from __future__ import annotations

import os

import pytest

from imgfab.render import templating


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("IMGFAB_CACHE_DIR", str(root))
    return root


def _templates(tmp_path):
    directory = tmp_path / "templates"
    directory.mkdir()
    # trim_blocks decides whether the newline after the block tag is kept.
    (directory / "t.j2").write_text("{% if x %}\nyes\n{% endif %}\n", encoding="utf-8")
    return directory


def test_a_second_environment_loads_the_compiled_template_from_the_cache(tmp_path, cache):
    templates = _templates(tmp_path)
    assert templating.environment(templates, {}).get_template("t.j2").render(x=True) == "yes\n"
    cached = list(cache.glob("jinja-*/*.cache"))
    assert len(cached) == 1
    before = cached[0].stat().st_mtime_ns
    assert templating.environment(templates, {}).get_template("t.j2").render(x=True) == "yes\n"
    assert cached[0].stat().st_mtime_ns == before, "the second process compiled the template again"


def test_code_compiled_under_other_options_is_never_used(tmp_path, cache, monkeypatch):
    templates = _templates(tmp_path)
    assert templating.environment(templates, {}).get_template("t.j2").render(x=True) == "yes\n"
    monkeypatch.setitem(templating.OPTIONS, "trim_blocks", False)
    assert templating.environment(templates, {}).get_template("t.j2").render(x=True) == "\nyes\n\n"
    assert len(list(cache.glob("jinja-*"))) == 2


def test_an_edited_template_is_compiled_again(tmp_path, cache):
    templates = _templates(tmp_path)
    templating.environment(templates, {}).get_template("t.j2").render(x=True)
    (templates / "t.j2").write_text("{% if x %}\nno\n{% endif %}\n", encoding="utf-8")
    assert templating.environment(templates, {}).get_template("t.j2").render(x=True) == "no\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a read-only mode")
def test_a_cache_that_cannot_be_written_is_not_an_error(tmp_path, cache):
    cache.mkdir()
    cache.chmod(0o500)
    try:
        env = templating.environment(_templates(tmp_path), {})
        assert env.bytecode_cache is None
        assert env.get_template("t.j2").render(x=True) == "yes\n"
    finally:
        cache.chmod(0o700)


def test_a_cache_path_that_is_a_file_is_not_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setenv("IMGFAB_CACHE_DIR", str(blocker))
    env = templating.environment(_templates(tmp_path), {})
    assert env.bytecode_cache is None
    assert env.get_template("t.j2").render(x=True) == "yes\n"
