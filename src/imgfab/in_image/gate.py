"""The API-key gate: one check in front of every route a vLLM server serves.

vLLM's own ``--api-key`` / ``VLLM_API_KEY`` guards ``/v1/*`` only: ``/invocations``,
``/tokenize``, ``/detokenize``, ``/pooling``, ``/score``, ``/rerank``, ``/metrics``, the OpenAPI
pages and, on newer releases, ``/inference/v1/generate`` answer anyone. :class:`ApiKeyGate` is an
ASGI middleware that refuses every request without ``Authorization: Bearer KEY`` (HTTP 401 with a
JSON body; a WebSocket is closed with code 1008 before it is accepted), except ``GET /health``,
which the container's health checks and Kubernetes' probes call without a key.
:class:`ApiKeyGateOpenMetrics` also leaves ``GET /metrics`` open (the recipe's
``serve.metrics_unauthenticated``, for a Prometheus scrape without the key).

vLLM loads it with its own extension point: ``vllm serve ... --middleware
imgfab.in_image.gate.ApiKeyGate`` imports the class and adds it with ``app.add_middleware(cls)``
(vllm-project/vllm:vllm/entrypoints/openai/api_server.py, ``build_app``: ``for middleware in
args.middleware``, a class added as it is, a coroutine function as an ``http`` middleware; the same
loop in the 0.4-era server and in the current one). It is added after vLLM's own middlewares, so it
is the outer one and decides first. Starlette builds it as ``cls(app=app)`` (``cls(app)`` in newer
releases) when the server takes its first ASGI event.

The key is the content of the file the entrypoint reads (``IMGFAB_API_KEY_FILE``, default
:data:`API_KEY_FILE`), trailing newlines removed as the shell's ``$(cat FILE)`` removes them; it
is read once, when the server builds its middleware stack. Fail closed: an empty or unreadable
file, or no file at all, raises :class:`GateError` there, so nothing is served; only
``IMGFAB_ALLOW_UNAUTHENTICATED=1`` with no file lets every request through (said on stderr).
The comparison takes the same time whatever the key sent (sha256 digests, ``hmac.compare_digest``).

Standard library only: it runs inside the image, in the server's own Python.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

# Where every run shape mounts the API key file (a Docker secret's path, a k8s Secret's subPath).
API_KEY_FILE = "/run/secrets/imgfab-api-key"
KEY_FILE_ENV = "IMGFAB_API_KEY_FILE"
ALLOW_ENV = "IMGFAB_ALLOW_UNAUTHENTICATED"
HEALTH = ("GET", "/health")
METRICS = ("GET", "/metrics")
# RFC 6455 "policy violation": the close code a WebSocket without the key gets.
WS_POLICY_VIOLATION = 1008

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_REFUSAL = json.dumps({"error": {
    "message": "this server needs an API key on every route but GET /health: send "
               "Authorization: Bearer KEY",
    "type": "authentication_error", "code": 401}}).encode()


class GateError(RuntimeError):
    """The gate cannot know the key: the server must not serve."""


def load_key(environ: Mapping[str, str]) -> bytes | None:
    """The API key from the file ``environ[IMGFAB_API_KEY_FILE]`` (default :data:`API_KEY_FILE`),
    or None when there is no file and ``environ[IMGFAB_ALLOW_UNAUTHENTICATED]`` is ``1``.
    Raises :class:`GateError` for an empty or unreadable file, or no file without the opt-out."""
    path = environ.get(KEY_FILE_ENV) or API_KEY_FILE
    try:
        with open(path, "rb") as handle:
            key = handle.read().rstrip(b"\n")
    except FileNotFoundError:
        if environ.get(ALLOW_ENV) == "1":
            return None
        raise GateError(f"imgfab gate: no API key file at {path}: mount the key there, or set "
                        f"{ALLOW_ENV}=1 to serve every route without one") from None
    except OSError as exc:
        raise GateError(f"imgfab gate: cannot read the API key file {path}: {exc.strerror}; "
                        f"make it readable by the server's user") from None
    if not key:
        raise GateError(f"imgfab gate: the API key file {path} is empty; write the key into it")
    return key


class ApiKeyGate:
    """ASGI middleware: every HTTP request and WebSocket needs ``Authorization: Bearer KEY``
    but those in :attr:`open_routes` ((method, path) pairs, the path exact)."""

    open_routes: frozenset[tuple[str, str]] = frozenset({HEALTH})

    def __init__(self, app: App, environ: Mapping[str, str] | None = None) -> None:
        self.app = app
        key = load_key(os.environ if environ is None else environ)
        self.expected = None if key is None else hashlib.sha256(b"Bearer " + key).digest()
        if key is None:
            print(f"imgfab gate: no API key and {ALLOW_ENV}=1: every route answers anyone",
                  file=sys.stderr, flush=True)

    def admits(self, scope: Scope) -> bool:
        """Whether the request may reach the server: an open route, or exactly one
        Authorization header that is ``Bearer KEY``."""
        method = scope.get("method", "GET") if scope["type"] == "http" else "WEBSOCKET"
        if (method, scope.get("path")) in self.open_routes:
            return True
        sent = [value for name, value in scope.get("headers") or () if name.lower() == b"authorization"]
        if len(sent) != 1 or self.expected is None:
            return False
        return hmac.compare_digest(hashlib.sha256(sent[0]).digest(), self.expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if self.expected is None or kind not in ("http", "websocket") or self.admits(scope):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": WS_POLICY_VIOLATION})
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(_REFUSAL)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": _REFUSAL})


class ApiKeyGateOpenMetrics(ApiKeyGate):
    """:class:`ApiKeyGate` that also answers ``GET /metrics`` without the key (the recipe's
    ``serve.metrics_unauthenticated``): vLLM's Prometheus metrics, for a scraper."""

    open_routes = ApiKeyGate.open_routes | {METRICS}
