"""A tag names one build: `--push` and `imgfab promote` refuse to move a tag that already
names another image (the real registry: tests/integration/test_supply.py). Here the registry is
a small local HTTP server serving one tag's manifest, and the engine's image inspection is the
Docker edge, stood in for."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from imgfab.docker import registry
from imgfab.docker.credentials import Credentials
from imgfab.errors import RecipeError

CONFIG = "sha256:" + "c" * 64
MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                  "digest": CONFIG, "size": 2}, "layers": []}).encode()
HELD = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()


class _Registry(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):  # noqa: N802
        if self.path in ("/v2/llm/x/manifests/v1", f"/v2/llm/x/manifests/{HELD}"):
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            self.send_header("Docker-Content-Digest", HELD)
            self.send_header("Content-Length", str(len(MANIFEST)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(MANIFEST)
            return
        self.send_response(404 if "/manifests/" in self.path else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET


@pytest.fixture(scope="module")
def host():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_holder_of_a_tag(host):
    assert registry.tag_holder(f"{host}/llm/x:v1") == (HELD, CONFIG)
    assert registry.tag_holder(f"{host}/llm/x:v2") is None


@pytest.mark.parametrize("local_id", [CONFIG, HELD])  # classic store: config; containerd: manifest
def test_the_same_image_may_be_pushed_again(host, local_id):
    registry.refuse_moving_tag(local_id, f"{host}/llm/x:v1")
    registry.refuse_moving_tag("sha256:" + "e" * 64, f"{host}/llm/x:v2")  # a new tag


def test_another_image_under_a_held_tag_is_refused_naming_both(host):
    other = "sha256:" + "e" * 64
    with pytest.raises(RecipeError) as caught:
        registry.refuse_moving_tag(other, f"{host}/llm/x:v1")
    assert HELD in caught.value.message and other in caught.value.message
    assert caught.value.exit_code == 2 and "--retag" in caught.value.fix


def test_push_checks_before_anything_moves(host, monkeypatch):
    from imgfab.docker import engine

    pushed = []
    monkeypatch.setattr(engine, "inspect_image", lambda ref: {"Id": "sha256:" + "e" * 64})
    monkeypatch.setattr(engine, "push_image", lambda *a, **k: pushed.append(a) or HELD)
    credentials = Credentials(host)
    with pytest.raises(RecipeError):
        registry.push("llm/x:v1", f"{host}/llm/x:v1", credentials=credentials)
    assert pushed == []
    lines = []
    registry.push("llm/x:v1", f"{host}/llm/x:v1", credentials=credentials, retag=True,
                  on_line=lines.append)
    assert len(pushed) == 1 and HELD in lines[0]


def test_promote_never_moves_a_held_tag_and_takes_only_digests(host, monkeypatch):
    from imgfab.supply import promote

    copies = []
    monkeypatch.setattr(promote, "oras_copy", lambda *a: copies.append(a))
    source = f"{host}/llm/src@sha256:{'e' * 64}"
    with pytest.raises(RecipeError) as caught:
        promote.promote(source, f"{host}/llm/x:v1")
    assert "already names" in caught.value.message and caught.value.field == "--to"
    with pytest.raises(RecipeError):
        promote.promote(f"{host}/llm/src:v1", f"{host}/llm/x:v9")
    with pytest.raises(RecipeError):
        promote.promote(source, f"{host}/llm/x@{HELD}")
    assert copies == []
