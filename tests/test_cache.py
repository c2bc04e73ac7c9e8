"""One cache root for every cache imgfab writes (issue 31): ``$IMGFAB_CACHE_DIR``, else
``$XDG_CACHE_HOME/imgfab``, else ``~/.cache/imgfab``. The template cache honoured
IMGFAB_CACHE_DIR; the verify results, the wheel members and the pip-source key did not."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest


@pytest.fixture
def roots(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(IMGFAB_CACHE_DIR, XDG_CACHE_HOME), both set, neither made yet."""
    chosen, xdg = tmp_path / "chosen", tmp_path / "xdg"
    monkeypatch.setenv("IMGFAB_CACHE_DIR", str(chosen))
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    return chosen, xdg


def _written(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_compiled_templates_go_under_imgfab_cache_dir(tmp_path, roots):
    from imgfab.render.templating import environment

    chosen, xdg = roots
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "t.j2").write_text("{{ x }}\n", encoding="utf-8")
    assert environment(tmp_path / "templates", {}).get_template("t.j2").render(x=1) == "1\n"
    assert [p.split("/")[0][:6] for p in _written(chosen)] == ["jinja-"]
    assert not xdg.exists()


def test_verify_results_go_under_imgfab_cache_dir(roots):
    from imgfab.docker import verify

    chosen, xdg = roots
    verify._store_layer("layer-key", {"findings": []})
    assert _written(chosen) == ["verify/layer-key.json"]
    assert verify._load_layer("layer-key") == {"findings": []}
    assert not xdg.exists()


class _Response:
    def __init__(self, content: bytes):
        self.status_code, self.content, self.headers = 200, content, {}


class _WholeBody:
    """A server that ignores Range and answers every GET with the whole wheel."""

    def __init__(self, data: bytes):
        self.data = data

    def get(self, url, headers=None, timeout=None):
        return _Response(self.data)


def test_wheel_members_go_under_imgfab_cache_dir(roots):
    from imgfab.matrix import wheelzip

    chosen, xdg = roots
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        wheel.writestr("a.py", b"")
        wheel.writestr("a-1.dist-info/RECORD", b"a.py,,\n")
    found = wheelzip.read_members("http://127.0.0.1/a-1-py3-none-any.whl", "e" * 64,
                                  session=_WholeBody(buffer.getvalue()))
    assert found == {".dist-info/RECORD": "a.py,,\n"}
    assert _written(chosen) == ["wheels/" + "e" * 64 + ".json"]
    assert not xdg.exists()


def test_the_pip_source_key_goes_under_imgfab_cache_dir(roots):
    from imgfab.docker.build import PIP_SOURCE_KEY_BYTES, pip_source_key

    chosen, xdg = roots
    key = pip_source_key()
    assert _written(chosen) == ["pip-source.key"]
    assert (chosen / "pip-source.key").read_bytes() == key and len(key) == PIP_SOURCE_KEY_BYTES
    assert not xdg.exists()


def test_without_imgfab_cache_dir_the_root_is_xdg_cache_home_then_home(tmp_path, monkeypatch):
    from imgfab.docker.build import pip_source_key

    monkeypatch.delenv("IMGFAB_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    pip_source_key()
    assert _written(tmp_path / "xdg") == ["imgfab/pip-source.key"]
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    pip_source_key()
    assert _written(tmp_path / "home") == [".cache/imgfab/pip-source.key"]
