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


# Recorded from Docker 26.1.5 (containerd image store) pushing and pulling one 20 MB layer to
# the local stack's registry, 2026-12-03.
_PUSH_STREAM = [
    {"status": "The push refers to repository [127.0.0.1:5000/imgfab-test/progress]"},
    {"status": "Pushing", "progressDetail": {"current": 10485760, "total": 20006309},
     "progress": "[==========================>                        ]  10.49MB/20.01MB", "id": "cafe09e0393e"},
    {"status": "Pushed", "progressDetail": {}, "id": "cafe09e0393e"},
    {"status": "t: digest: sha256:1100ceaf5e7e37a4d79beb8d67ecd4adc58796f116c2e531fcc79c46625ae8af size: 406"},
]
_PULL_STREAM = [
    {"status": "Pulling from imgfab-test/progress", "id": "t"},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": "cafe09e0393e"},
    {"status": "Downloading", "progressDetail": {"current": 13631488, "total": 20006309},
     "progress": "[==================================>                ]  13.63MB/20.01MB", "id": "cafe09e0393e"},
    {"status": "Download complete", "progressDetail": {"hidecounts": True}, "id": "cafe09e0393e"},
    {"status": "Digest: sha256:1100ceaf5e7e37a4d79beb8d67ecd4adc58796f116c2e531fcc79c46625ae8af"},
    {"status": "Status: Downloaded newer image for 127.0.0.1:5000/imgfab-test/progress:t"},
]


class _Recorded(_Api):
    def __init__(self, stream):
        self.stream = stream

    def push(self, repository, **kwargs):
        yield from self.stream

    def pull(self, ref, **kwargs):
        self.pulled = ref
        yield from self.stream


def _plain():
    import io

    from imgfab.progress import Progress

    out = io.StringIO()
    return out, Progress("plain", stream=out, interval_s=0)


def test_push_reports_the_bytes_sent(monkeypatch):
    client = _Client()
    client.api = _Recorded(_PUSH_STREAM)
    monkeypatch.setattr(engine, "_client", lambda: client)
    out, progress = _plain()
    engine.push_image("a:b", "127.0.0.1:5000/imgfab-test/progress", "t", progress=progress)
    tails = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert tails == ["push 127.0.0.1:5000/imgfab-test/progress:t: 10.5 MB of 20.0 MB sent",
                     "push 127.0.0.1:5000/imgfab-test/progress:t: 20.0 MB of 20.0 MB sent"]


def test_registry_push_hands_its_progress_to_the_engine(monkeypatch):
    from imgfab.docker import registry

    seen = {}

    def fake_push_image(local_ref, name, tag, *, auth_config, on_line, progress):
        seen["progress"] = progress
        return "sha256:" + "1" * 64

    monkeypatch.setattr(engine, "push_image", fake_push_image)
    monkeypatch.setattr(registry, "_manifest_digest", lambda client, ref: "sha256:" + "1" * 64)
    monkeypatch.setattr(registry._Client, "request", lambda self, *a, **k: None)
    monkeypatch.setattr(registry, "refuse_moving_tag", lambda *a, **k: None)
    marker = object()
    creds = registry.Credentials("127.0.0.1:5000", None, None, source="anonymous")
    registry._push_once("a:b", registry.ImageRef.parse("127.0.0.1:5000/x/y:t"), "t", creds, None,
                        local_id="sha256:" + "2" * 64, retag=False, progress=marker)
    assert seen["progress"] is marker


def test_pull_reports_the_bytes_read(monkeypatch):
    client = _Client()
    client.api = _Recorded(_PULL_STREAM)
    monkeypatch.setattr(engine, "_client", lambda: client)
    out, progress = _plain()
    engine.pull_image("127.0.0.1:5000/imgfab-test/progress:t", progress=progress)
    tails = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert tails == ["pulling 127.0.0.1:5000/imgfab-test/progress:t",
                     "pull 127.0.0.1:5000/imgfab-test/progress:t: 13.6 MB of 20.0 MB read",
                     "pull 127.0.0.1:5000/imgfab-test/progress:t: 20.0 MB of 20.0 MB read"]


def test_a_pull_error_in_the_stream_is_one_registry_error(monkeypatch):
    from imgfab.errors import RegistryError

    client = _Client()
    client.api = _Recorded([{"error": "manifest unknown:\n manifest unknown"}])
    monkeypatch.setattr(engine, "_client", lambda: client)
    with pytest.raises(RegistryError) as caught:
        engine.pull_image("127.0.0.1:5000/x:absent")
    assert caught.value.one_line().count("\n") == 0 and "manifest unknown" in caught.value.one_line()
