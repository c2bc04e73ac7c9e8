"""Registry answers are bounded (issue 21): every body has a size cap, every request an overall
deadline, a bad token answer is one RegistryError line, and a long list a registry supplies is
capped in what is printed.

Each hostile registry is a raw loopback TCP server, so it can trickle bytes, announce sizes it
does not send, or answer a token request with HTML.
"""

from __future__ import annotations

import hashlib
import json
import os
import socketserver
import subprocess
import sys
import threading
import time

import pytest

from imgfab.docker import registry, registry_http
from imgfab.docker.registry import Credentials, image_config, list_tags
from imgfab.errors import RegistryError


class _Raw(socketserver.BaseRequestHandler):
    def handle(self):
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.request.recv(65536)
            if not chunk:
                return
            head += chunk
        line, _, rest = head.decode("latin-1").partition("\r\n")
        headers = dict(h.split(": ", 1) for h in rest.split("\r\n") if ": " in h)
        self.server.seen.append(line)
        try:
            self.server.behave(self, line.split(" ")[0], line.split(" ")[1], headers)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def answer(self, status: int, body: bytes = b"", headers: dict | None = None, *,
               length: int | None = None):
        head = [f"HTTP/1.1 {status} X", "Connection: close",
                f"Content-Length: {len(body) if length is None else length}"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.request.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def serve():
    started = []

    def start(behave):
        server = _Server(("127.0.0.1", 0), _Raw)
        server.seen, server.behave = [], behave
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return f"127.0.0.1:{server.server_address[1]}"

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def _sha(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


# --- size caps --------------------------------------------------------------------------------

def test_a_manifest_over_the_cap_is_refused(serve):
    body = b" " * (5 << 20) + b'{"schemaVersion": 2}'  # 5 MiB: over the 4 MiB the spec allows
    host = serve(lambda h, method, path, headers: h.answer(200, body))
    with pytest.raises(RegistryError, match="larger than imgfab accepts"):
        image_config(f"{host}/team/app:v1", Credentials(host))


def test_an_announced_size_over_the_cap_is_refused_before_reading(serve):
    # 2 GiB announced, ten bytes sent: the announcement alone is enough to refuse.
    host = serve(lambda h, method, path, headers: h.answer(200, b"{" * 10, length=2 << 30))
    with pytest.raises(RegistryError, match="2147483648 bytes announced"):
        image_config(f"{host}/team/app:v1", Credentials(host))


def test_a_config_blob_over_the_cap_is_refused_while_reading(serve):
    blob = b" " * (17 << 20) + b"{}"
    manifest = json.dumps({"schemaVersion": 2, "config": {"digest": _sha(blob)}}).encode()

    def behave(h, method, path, headers):
        if "/manifests/" in path:
            return h.answer(200, manifest)
        # No Content-Length: the size is only seen while reading.
        h.request.sendall(b"HTTP/1.1 200 X\r\nConnection: close\r\n\r\n")
        for start in range(0, len(blob), 1 << 20):
            h.request.sendall(blob[start:start + (1 << 20)])
    host = serve(behave)
    with pytest.raises(RegistryError, match="larger than imgfab accepts"):
        image_config(f"{host}/team/app:v1", Credentials(host))


def test_error_text_is_read_only_up_to_its_cap(serve):
    body = b'{"errors": [' + b" " * (1 << 20) + b'{"code": "HIDDEN_PAST_THE_CAP"}]}'
    host = serve(lambda h, method, path, headers: h.answer(500, body))
    with pytest.raises(RegistryError) as caught:
        list_tags(f"{host}/team/app", Credentials(host))
    assert "HIDDEN_PAST_THE_CAP" not in caught.value.one_line()


def test_json_nested_past_the_parsers_recursion_is_one_registry_error(serve):
    host = serve(lambda h, method, path, headers: h.answer(200, b"[" * 200_000))
    with pytest.raises(RegistryError, match="not a JSON object"):
        image_config(f"{host}/team/app:v1", Credentials(host))


# --- the overall deadline ---------------------------------------------------------------------

def _trickle(sock, data: bytes, pause: float = 0.2):
    for byte in data:
        sock.sendall(bytes([byte]))
        time.sleep(pause)


def test_a_body_trickled_under_the_read_timeout_still_meets_the_deadline(serve, monkeypatch):
    monkeypatch.setattr(registry_http, "DEADLINE_S", 1.0, raising=False)
    body = b" " * 25 + b'{"tags": ["a"]}'

    finished = []

    def behave(h, method, path, headers):
        h.request.sendall(f"HTTP/1.1 200 X\r\nConnection: close\r\nContent-Length: {len(body)}"
                          "\r\n\r\n".encode())
        _trickle(h.request, body[:25])  # 5 s at one byte per 0.2 s, each read well in time
        finished.append(True)
        h.request.sendall(body[25:])
    host = serve(behave)
    with pytest.raises(RegistryError, match="did not answer within 1 s"):
        list_tags(f"{host}/team/app", Credentials(host))
    assert not finished, "the client waited for the trickle to end instead of cutting it off"


def test_headers_trickled_under_the_read_timeout_still_meet_the_deadline(serve, monkeypatch):
    monkeypatch.setattr(registry_http, "DEADLINE_S", 1.0, raising=False)
    body = b'{"tags": ["a"]}'
    finished = []

    def behave(h, method, path, headers):
        h.request.sendall(b"HTTP/1.1 200 X\r\n")
        _trickle(h.request, b"X-Slow: " + b"a" * 20 + b"\r\n")
        finished.append(True)
        h.request.sendall(f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    host = serve(behave)
    with pytest.raises(RegistryError, match="did not answer within 1 s"):
        list_tags(f"{host}/team/app", Credentials(host))
    assert not finished, "the client waited for the trickle to end instead of cutting it off"


# --- token answers ----------------------------------------------------------------------------

def _bearer(token_answer):
    """A Bearer registry whose token endpoint answers ``token_answer(handler)``."""
    def behave(h, method, path, headers):
        port = h.server.server_address[1]
        if path.startswith("/token"):
            return token_answer(h)
        if not headers.get("Authorization", "").startswith("Bearer "):
            return h.answer(401, b"", {"WWW-Authenticate":
                                       f'Bearer realm="http://127.0.0.1:{port}/token",service="s"'})
        return h.answer(200, b'{"tags": ["v1"]}', {"Content-Type": "application/json"})
    return behave


@pytest.mark.parametrize("answer, why", [
    (b"<html><body>Sign in</body></html>", "not a JSON object"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"token": 5}', "not a printable string"),
    (b'{"token": "a\\nInjected: header"}', "not a printable string"),
    (b'{"token": "' + b"t" * (300 << 10) + b'"}', "larger than imgfab accepts"),
], ids=["html", "list", "number", "newline", "huge"])
def test_a_bad_token_answer_is_one_registry_error(serve, answer, why):
    host = serve(_bearer(lambda h: h.answer(200, answer, {"Content-Type": "text/html"})))
    with pytest.raises(RegistryError, match=why) as caught:
        list_tags(f"{host}/team/app", Credentials(host))
    assert "token" in caught.value.one_line()


def test_select_with_an_html_token_server_is_one_line_not_an_internal_error(serve, tmp_path):
    host = serve(_bearer(lambda h: h.answer(200, b"<html>login</html>", {"Content-Type": "text/html"})))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMGFAB_", "DOCKER_"))}
    env["DOCKER_CONFIG"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", "from imgfab.cli import main; main()", "select", "--registry",
         f"{host}/team/app", "--driver", "999.1.1", "--gpu", "H100-SXM"],
        capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "internal error" not in lines[0] and "not a JSON object" in lines[0], lines


# --- long lists -------------------------------------------------------------------------------

def test_a_manifest_list_of_many_platforms_prints_a_few_and_a_count(serve):
    entries = [{"digest": "sha256:" + "a" * 64, "platform": {"os": "linux", "architecture": f"a{i}"}}
               for i in range(25_000)]
    index = json.dumps({"mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": entries}).encode()
    host = serve(lambda h, method, path, headers: h.answer(200, index))
    with pytest.raises(RegistryError, match="and 24995 more") as caught:
        image_config(f"{host}/team/app:v1", Credentials(host))
    assert len(caught.value.one_line()) < 1000


def test_few():
    assert registry_http.few(["a", "b"]) == "a, b"
    assert registry_http.few([str(i) for i in range(9)], 3) == "0, 1, 2 … and 6 more"
    assert registry.printable is registry_http.printable
