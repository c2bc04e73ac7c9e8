"""engine.push_image against a stand-in SDK client (the Docker edge): a first push into a new
repository may be quiet for minutes, so the read timeout is long, and a timeout that still
happens is one EngineError line, not an internal error."""

from __future__ import annotations

import pytest
from urllib3.exceptions import ReadTimeoutError

from imgfab.docker import engine
from imgfab.errors import EngineError


class _Api:
    timeout = 60

    def tag(self, *args, **kwargs):
        return True

    def push(self, repository, **kwargs):
        self.timeout_during_push = self.timeout
        yield {"status": "Waiting", "id": "abc"}
        raise ReadTimeoutError(None, None, "Read timed out.")


class _Client:
    def __init__(self):
        self.api = _Api()


def test_push_timeout_is_long_and_a_stall_is_one_engine_error(monkeypatch):
    client = _Client()
    monkeypatch.setattr(engine, "_client", lambda: client)
    with pytest.raises(EngineError) as caught:
        engine.push_image("a:b", "127.0.0.1:5000/imgfab-test/x", "t")
    assert client.api.timeout_during_push >= 600
    assert "dropped the push" in caught.value.one_line()


class _Api26(_Api):
    """Docker 26 with the containerd image store: no aux record, only the closing line."""

    def __init__(self, lines):
        self.lines = lines

    def push(self, repository, **kwargs):
        yield {"status": f"The push refers to repository [{repository}]"}
        yield {"status": "Pushed", "id": "c5e564ae562b", "progressDetail": {}}
        yield from self.lines


@pytest.mark.parametrize("lines, expected", [
    ([{"status": "t: digest: sha256:" + "5" * 64 + " size: 406"}], "sha256:" + "5" * 64),
    # aux (the classic store) wins; another tag's closing line is not this push's digest
    ([{"status": "t: digest: sha256:" + "5" * 64 + " size: 406"},
      {"aux": {"Tag": "t", "Digest": "sha256:" + "6" * 64, "Size": 406}}], "sha256:" + "6" * 64),
])
def test_the_digest_comes_from_aux_or_the_closing_line(monkeypatch, lines, expected):
    client = _Client()
    client.api = _Api26(lines)
    monkeypatch.setattr(engine, "_client", lambda: client)
    assert engine.push_image("a:b", "127.0.0.1:5000/imgfab-test/x", "t") == expected


def test_a_closing_line_for_another_tag_is_no_digest(monkeypatch):
    from imgfab.errors import RegistryError

    client = _Client()
    client.api = _Api26([{"status": "other: digest: sha256:" + "5" * 64 + " size: 406"}])
    monkeypatch.setattr(engine, "_client", lambda: client)
    with pytest.raises(RegistryError):
        engine.push_image("a:b", "127.0.0.1:5000/imgfab-test/x", "t")
