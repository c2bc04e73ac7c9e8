"""The API-key gate (imgfab.in_image.gate) as the ASGI callable vLLM's ``--middleware`` adds:
driven here with hand-written scope, receive and send, in front of an app that records what
reached it. What the gate must refuse and admit is written out by hand, route by route."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from imgfab.in_image import gate


class Recorder:
    """The app behind the gate: answers 200 and records each scope that reached it."""

    def __init__(self) -> None:
        self.reached: list[tuple[str, str]] = []

    async def __call__(self, scope, receive, send) -> None:
        self.reached.append((scope.get("method", scope["type"]), scope.get("path", "")))
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"served"})


def call(app, method: str, path: str, headers: list[tuple[bytes, bytes]] = (),
         kind: str = "http") -> list[dict]:
    scope = {"type": kind, "path": path, "headers": list(headers)}
    if kind == "http":
        scope["method"] = method
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


@pytest.fixture
def key_file(tmp_path) -> Path:
    path = tmp_path / "api-key"
    path.write_bytes(b"k-s3cret\n")  # as `openssl rand ... > api-key` leaves it: a newline
    return path


def gated(key_file: Path, cls=gate.ApiKeyGate) -> tuple[Recorder, object]:
    inner = Recorder()
    return inner, cls(app=inner, environ={"IMGFAB_API_KEY_FILE": str(key_file)})


BEARER = [(b"authorization", b"Bearer k-s3cret")]
# The routes vLLM 0.19-0.33 serves beside /v1 that its own --api-key leaves open (issue 34).
ROUTES = [("POST", "/invocations"), ("POST", "/tokenize"), ("POST", "/detokenize"),
          ("POST", "/pooling"), ("POST", "/score"), ("POST", "/rerank"), ("GET", "/metrics"),
          ("POST", "/inference/v1/generate"), ("GET", "/openapi.json"), ("GET", "/docs"),
          ("GET", "/version"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
          ("HEAD", "/health"), ("POST", "/health"), ("GET", "/health/"), ("GET", "//health")]


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_but_get_health_is_refused_without_the_key(key_file, method, path):
    inner, app = gated(key_file)
    start, body = call(app, method, path)
    assert start["status"] == 401 and inner.reached == []
    assert (b"www-authenticate", b"Bearer") in start["headers"]
    error = json.loads(body["body"])["error"]
    assert error["code"] == 401 and "Authorization: Bearer KEY" in error["message"]
    assert call(app, method, path, BEARER)[0]["status"] == 200
    assert inner.reached == [(method, path)]


def test_get_health_answers_anyone(key_file):
    inner, app = gated(key_file)
    assert call(app, "GET", "/health")[0]["status"] == 200
    assert inner.reached == [("GET", "/health")]


@pytest.mark.parametrize("headers", [
    [(b"authorization", b"Bearer k-wrong")],
    [(b"authorization", b"Bearer k-s3cret\n")],  # the file's newline is not part of the key
    [(b"authorization", b"bearer k-s3cret")],
    [(b"authorization", b"k-s3cret")],
    [(b"authorization", b"Bearer ")],
    [(b"x-api-key", b"k-s3cret")],
    [(b"authorization", b"Bearer k-s3cret"), (b"authorization", b"Bearer k-wrong")],
], ids=["wrong", "newline", "scheme-case", "no-scheme", "empty", "other-header", "two-headers"])
def test_only_the_exact_bearer_key_is_admitted(key_file, headers):
    inner, app = gated(key_file)
    assert call(app, "POST", "/v1/completions", headers)[0]["status"] == 401
    assert inner.reached == []


def test_header_names_are_matched_in_any_case(key_file):
    inner, app = gated(key_file)
    assert call(app, "POST", "/tokenize", [(b"Authorization", b"Bearer k-s3cret")])[0]["status"] == 200


def test_a_websocket_without_the_key_is_closed_before_it_is_accepted(key_file):
    inner, app = gated(key_file)
    assert call(app, "", "/v1/realtime", kind="websocket") == [
        {"type": "websocket.close", "code": 1008}]
    assert call(app, "", "/health", kind="websocket") == [
        {"type": "websocket.close", "code": 1008}], "a WebSocket is never an open GET"
    assert inner.reached == []
    call(app, "", "/v1/realtime", BEARER, kind="websocket")
    assert inner.reached == [("websocket", "/v1/realtime")]


def test_lifespan_events_pass_through(key_file):
    inner, app = gated(key_file)
    assert call(app, "", "", kind="lifespan") == []
    assert inner.reached == [("lifespan", "")]


def test_the_metrics_opt_in_opens_get_metrics_only(key_file):
    inner, app = gated(key_file, gate.ApiKeyGateOpenMetrics)
    assert call(app, "GET", "/metrics")[0]["status"] == 200
    assert call(app, "GET", "/health")[0]["status"] == 200
    for method, path in (("POST", "/metrics"), ("GET", "/metrics/x"), ("POST", "/invocations")):
        assert call(app, method, path)[0]["status"] == 401, (method, path)
    assert inner.reached == [("GET", "/metrics"), ("GET", "/health")]


# --- fail closed: the key the gate cannot know ---------------------------------------------

def test_no_key_file_refuses_to_build_the_gate(tmp_path):
    with pytest.raises(gate.GateError) as caught:
        gate.ApiKeyGate(Recorder(), environ={"IMGFAB_API_KEY_FILE": str(tmp_path / "absent")})
    assert str(caught.value) == (f"imgfab gate: no API key file at {tmp_path / 'absent'}: mount the "
                                 "key there, or set IMGFAB_ALLOW_UNAUTHENTICATED=1 to serve every "
                                 "route without one")


def test_the_default_key_file_is_the_one_every_shape_mounts(monkeypatch):
    from imgfab.render import shapes

    assert gate.API_KEY_FILE == shapes.API_KEY_FILE == "/run/secrets/imgfab-api-key"
    monkeypatch.delenv("IMGFAB_API_KEY_FILE", raising=False)
    monkeypatch.delenv("IMGFAB_ALLOW_UNAUTHENTICATED", raising=False)
    with pytest.raises(gate.GateError, match="/run/secrets/imgfab-api-key"):
        gate.ApiKeyGate(Recorder())  # the process environment, as vLLM builds it


@pytest.mark.parametrize("content", [b"", b"\n\n"], ids=["empty", "newlines"])
def test_an_empty_key_file_refuses_even_with_the_opt_out(tmp_path, content):
    path = tmp_path / "api-key"
    path.write_bytes(content)
    with pytest.raises(gate.GateError, match="is empty; write the key into it"):
        gate.ApiKeyGate(Recorder(), environ={"IMGFAB_API_KEY_FILE": str(path),
                                             "IMGFAB_ALLOW_UNAUTHENTICATED": "1"})


def test_an_unreadable_key_file_refuses(tmp_path):
    with pytest.raises(gate.GateError, match="cannot read the API key file"):
        gate.ApiKeyGate(Recorder(), environ={"IMGFAB_API_KEY_FILE": str(tmp_path)})  # a directory


@pytest.mark.parametrize("value", ["0", "true", "yes", ""])
def test_only_the_value_1_opts_out(tmp_path, value):
    with pytest.raises(gate.GateError):
        gate.ApiKeyGate(Recorder(), environ={"IMGFAB_API_KEY_FILE": str(tmp_path / "absent"),
                                             "IMGFAB_ALLOW_UNAUTHENTICATED": value})


def test_the_opt_out_without_a_key_serves_everyone_and_says_so(tmp_path, capsys):
    inner = Recorder()
    app = gate.ApiKeyGate(inner, environ={"IMGFAB_API_KEY_FILE": str(tmp_path / "absent"),
                                          "IMGFAB_ALLOW_UNAUTHENTICATED": "1"})
    assert "every route answers anyone" in capsys.readouterr().err
    assert call(app, "POST", "/invocations")[0]["status"] == 200


def test_a_mounted_key_wins_over_the_opt_out(key_file):
    inner = Recorder()
    app = gate.ApiKeyGate(inner, environ={"IMGFAB_API_KEY_FILE": str(key_file),
                                          "IMGFAB_ALLOW_UNAUTHENTICATED": "1"})
    assert call(app, "POST", "/invocations")[0]["status"] == 401 and inner.reached == []
