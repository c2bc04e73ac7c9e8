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
