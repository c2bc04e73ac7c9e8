"""The registry client against hostile registries (issue 12): credentials stay with the
registry they were issued for, pagination cannot loop, a Bearer realm must be https (except on
loopback), and registry text is stripped of terminal escapes before it is printed.

Each hostile registry is a local HTTP server; a second server on another port plays "another
host" and records every Authorization header it is sent.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import pytest

from imgfab.docker import registry
from imgfab.errors import RegistryError
from imgfab.docker.registry import Credentials, list_tags

BASIC = "Basic " + base64.b64encode(b"u:s3cret-pw").decode()


class _Handler(BaseHTTPRequestHandler):
    """Behaviour set per server through ``server.behave(handler)``."""

    def log_message(self, *args):
        pass

    def send(self, status, body=b"", headers=None):
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self.server.seen.append((self.path, self.headers.get("Authorization")))
        self.server.behave(self)

    do_HEAD = do_GET


def _serve(behave, host="127.0.0.1"):
    server = ThreadingHTTPServer((host, 0), _Handler)
    server.seen = []
    server.behave = behave
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers():
    started = []

    def start(behave, host="127.0.0.1"):
        server = _serve(behave, host)
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def _basic_registry(link_for):
    """A registry with Basic auth whose tag pages carry ``link_for(handler)`` as Link."""
    def behave(handler):
        if handler.headers.get("Authorization") != BASIC:
            return handler.send(401, b"", {"WWW-Authenticate": 'Basic realm="r"'})
        link = link_for(handler)
        headers = {"Content-Type": "application/json"}
        if link:
            headers["Link"] = f'<{link}>; rel="next"'
        handler.send(200, json.dumps({"tags": ["t" + str(len(handler.server.seen))]}).encode(),
                     headers)
    return behave


def test_pagination_link_to_another_host_gets_no_credentials(servers):
    evil = servers(lambda h: h.send(200, b'{"tags": ["stolen"]}',
                                    {"Content-Type": "application/json"}))
    evil_url = f"http://127.0.0.1:{evil.server_port}/v2/x/tags/list"
    good = servers(_basic_registry(lambda h: evil_url if "n=" in h.path else None))
    host = f"127.0.0.1:{good.server_port}"
    with pytest.raises(RegistryError, match="another server"):
        list_tags(f"{host}/team/app", Credentials(host, "u", "s3cret-pw"))
    assert [auth for _, auth in evil.seen if auth] == []
    assert "s3cret-pw" not in json.dumps(evil.seen)


@pytest.mark.parametrize("link", ["https://{host}/v2/team/app/tags/list?n=1&last=a",
                                  "//127.0.0.2:{port}/v2/team/app/tags/list?last=a"])
def test_pagination_link_with_other_scheme_or_host_is_refused(servers, link):
    good = servers(_basic_registry(lambda h: link.format(host=f"127.0.0.1:{h.server.server_port}",
                                                         port=h.server.server_port)
                                   if "last" not in h.path else None))
    host = f"127.0.0.1:{good.server_port}"
    with pytest.raises(RegistryError, match="another server"):
        list_tags(f"{host}/team/app", Credentials(host, "u", "s3cret-pw"))


def test_relative_pagination_is_followed_on_the_same_registry(servers):
    good = servers(_basic_registry(lambda h: "list?n=1&last=b" if "last" not in h.path
                                   else None))
    host = f"127.0.0.1:{good.server_port}"
    tags = list_tags(f"{host}/team/app", Credentials(host, "u", "s3cret-pw"))
    assert len(tags) == 2
    assert urlparse(good.seen[-1][0]).path == "/v2/team/app/tags/list"


def test_pagination_loop_back_to_the_same_page_stops(servers):
    def behave(handler):
        if handler.server.seen and len(handler.server.seen) > 200:  # a bound for today's code
            return handler.send(200, b'{"tags": []}', {"Content-Type": "application/json"})
        return _basic_registry(lambda h: h.path)(handler)
    good = servers(behave)
    host = f"127.0.0.1:{good.server_port}"
    with pytest.raises(RegistryError, match="in a loop"):
        list_tags(f"{host}/team/app", Credentials(host, "u", "s3cret-pw"))
    assert len(good.seen) < 10


def test_pagination_has_a_page_cap(servers, monkeypatch):
    monkeypatch.setattr(registry, "MAX_PAGES", 5)
    good = servers(_basic_registry(lambda h: f"/v2/team/app/tags/list?page={len(h.server.seen)}"
                                   if len(h.server.seen) < 100 else None))
    host = f"127.0.0.1:{good.server_port}"
    with pytest.raises(RegistryError, match="past 5 pages"):
        list_tags(f"{host}/team/app", Credentials(host, "u", "s3cret-pw"))


def _non_loopback_ipv4() -> str | None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # UDP connect sends nothing; it picks a source address
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def test_plain_http_realm_on_another_host_gets_no_basic_credentials(servers):
    address = _non_loopback_ipv4()
    if address is None:
        pytest.fail("this test needs a non-loopback IPv4 address to play the token server")
    token = servers(lambda h: h.send(200, b'{"token": "t"}', {"Content-Type": "application/json"}),
                    host="0.0.0.0")
    realm = f"http://{address}:{token.server_port}/token"

    def behave(handler):
        handler.send(401, b"", {"WWW-Authenticate": f'Bearer realm="{realm}",service="s"'})
    good = servers(behave)
    host = f"127.0.0.1:{good.server_port}"
    with pytest.raises(RegistryError, match="not https"):
        list_tags(f"{host}/team/app", Credentials(host, "u", "s3cret-pw"))
    assert token.seen == []


def test_registry_text_is_stripped_of_terminal_escapes(servers):
    body = json.dumps({"errors": [{"code": "DENIED", "message":
                                   "\x1b]0;pwned\x07\x1b[2J\nfake: line\r"}]}).encode()
    good = servers(lambda h: h.send(500, body, {"Content-Type": "application/json"}))
    host = f"127.0.0.1:{good.server_port}"
    with pytest.raises(RegistryError) as caught:
        list_tags(f"{host}/team/app", Credentials(host, "u", "s3cret-pw"))
    line = caught.value.one_line()
    assert "DENIED" in line
    assert not any(ord(ch) < 32 or 0x7f <= ord(ch) <= 0x9f for ch in line), repr(line)


def test_tag_list_that_is_not_a_list_is_one_registry_error(servers):
    good = servers(lambda h: h.send(200, b'{"tags": {"a": 1}}', {"Content-Type": "application/json"}))
    host = f"127.0.0.1:{good.server_port}"
    with pytest.raises(RegistryError, match="not a list of tags"):
        list_tags(f"{host}/team/app", Credentials(host, "u", "s3cret-pw"))


def test_printable_strips_controls_and_bounds_length():
    assert registry.printable("a\x1b[31mb\nc\x07d\x9b") == "a [31mb c d"
    assert len(registry.printable("x" * 10000)) <= 301
