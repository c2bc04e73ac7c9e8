"""imgfab.docker.registry without the local stack: references, credentials sources, and the HTTP API
against a fake registry that speaks Bearer token auth (the local stack's only does Basic)."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from imgfab.errors import RegistryError
from imgfab.docker.registry import (Credentials, ImageRef, image_config, is_transient, list_tags,
                                    resolve_digest, retarget)
from imgfab.docker.registry_http import _scheme


@pytest.mark.parametrize("ref, expected", [
    ("nvidia/cuda:12.8.1-devel-ubuntu24.04",
     ("docker.io", "nvidia/cuda", "12.8.1-devel-ubuntu24.04", None)),
    ("busybox", ("docker.io", "library/busybox", None, None)),
    ("127.0.0.1:5000/mirror/nvidia/cuda:1", ("127.0.0.1:5000", "mirror/nvidia/cuda", "1", None)),
    ("localhost/a/b", ("localhost", "a/b", None, None)),
    ("ghcr.io/o/r@sha256:" + "a" * 64, ("ghcr.io", "o/r", None, "sha256:" + "a" * 64)),
])
def test_image_ref_parse(ref, expected):
    parsed = ImageRef.parse(ref)
    assert (parsed.host, parsed.repository, parsed.tag, parsed.digest) == expected


@pytest.mark.parametrize("ref", ["", "Upper/Case:1", "a b", "x@sha256:short"])
def test_bad_refs_are_registry_errors(ref):
    with pytest.raises(RegistryError):
        ImageRef.parse(ref)


def test_scheme_http_only_on_loopback():
    assert _scheme("127.0.0.1:5000") == _scheme("127.9.9.9") == _scheme("localhost:5000") == "http"
    assert _scheme("[::1]:5000") == "http"
    assert _scheme("ghcr.io") == _scheme("10.0.0.1:5000") == "https"


def test_retarget():
    assert retarget("llm/qwen:v1", "r:5") == "r:5/llm/qwen:v1"
    assert retarget("busybox", "r:5") == "r:5/busybox:latest"


@pytest.mark.parametrize("message, transient", [
    ('Get "http://h/v2/": read: connection reset by peer', True),
    ("dial tcp 127.0.0.1:5000: connect: connection refused", True),
    ("received unexpected HTTP status: 503 Service Unavailable", True),
    ("net/http: TLS handshake timeout", True),
    ("unauthorized: authentication required", False),
    ("denied: requested access to the resource is denied", False),
    ("registry h refused the credentials for user u (401)", False),
    ("manifest invalid", False),
])
def test_is_transient(message, transient):
    assert is_transient(message) is transient


# --- credentials ------------------------------------------------------------------------------

@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in ("IMGFAB_REGISTRY", "IMGFAB_REGISTRY_USER", "IMGFAB_REGISTRY_PASSWORD",
                 "IMGFAB_REGISTRY_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    (tmp_path / "docker").mkdir()
    return tmp_path


def _config(tmp_path, data):
    (tmp_path / "docker" / "config.json").write_text(json.dumps(data))


def test_explicit_password_wins_and_repr_masks(clean_env):
    creds = Credentials.load("r.example", "alice", "s3cret-value")
    assert (creds.username, creds.password, creds.source) == ("alice", "s3cret-value", "explicit")
    assert "s3cret-value" not in repr(creds) and "s3cret-value" not in f"{creds}"
    assert creds.auth_config() == {"username": "alice", "password": "s3cret-value",
                                   "serveraddress": "r.example"}


def test_password_env_then_file(clean_env, monkeypatch):
    secret = clean_env / "pw"
    secret.write_text("from-file\n")
    monkeypatch.setenv("IMGFAB_REGISTRY_PASSWORD_FILE", str(secret))
    assert Credentials.load("r.example", "bob").password == "from-file"
    monkeypatch.setenv("IMGFAB_REGISTRY_PASSWORD", "from-env")
    assert Credentials.load("r.example", "bob").password == "from-env"


def test_stack_user_applies_only_to_the_stack_registry(clean_env, monkeypatch):
    monkeypatch.setenv("IMGFAB_REGISTRY", "127.0.0.1:5000")
    monkeypatch.setenv("IMGFAB_REGISTRY_USER", "imgfab")
    monkeypatch.setenv("IMGFAB_REGISTRY_PASSWORD", "pw")
    assert Credentials.load("127.0.0.1:5000").username == "imgfab"
    assert Credentials.load("other.example").anonymous


def test_docker_config_auths(clean_env):
    _config(clean_env, {"auths": {"r.example": {
        "auth": base64.b64encode(b"carol:pa:ss").decode()}}})
    creds = Credentials.load("r.example")
    assert (creds.username, creds.password) == ("carol", "pa:ss")
    assert Credentials.load("elsewhere.example").anonymous


def test_user_without_password_is_one_error(clean_env):
    with pytest.raises(RegistryError, match="no password for user dave at registry r.example"):
        Credentials.load("r.example", "dave")


def _helper(tmp_path, monkeypatch, name, body):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / f"docker-credential-{name}"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")


def test_cred_helper_and_creds_store(clean_env, monkeypatch):
    _helper(clean_env, monkeypatch, "fake",
            'read server; printf \'{"ServerURL":"%s","Username":"erin","Secret":"hx"}\' "$server"\n')
    _config(clean_env, {"credHelpers": {"r.example": "fake"}})
    creds = Credentials.load("r.example")
    assert (creds.username, creds.password, creds.source) == ("erin", "hx",
                                                              "docker-credential-fake")
    _config(clean_env, {"credsStore": "fake"})
    assert Credentials.load("other.example").username == "erin"


def test_cred_helper_token_and_not_found(clean_env, monkeypatch):
    _helper(clean_env, monkeypatch, "tok", 'echo \'{"Username":"<token>","Secret":"refresh"}\'\n')
    _config(clean_env, {"credHelpers": {"r.example": "tok"}})
    creds = Credentials.load("r.example")
    assert creds.identity_token == "refresh" and "refresh" not in repr(creds)
    assert creds.auth_config() == {"identitytoken": "refresh", "serveraddress": "r.example"}
    _helper(clean_env, monkeypatch, "none",
            "echo 'credentials not found in native keychain'; exit 1\n")
    _config(clean_env, {"credsStore": "none"})
    assert Credentials.load("r.example").anonymous


def test_missing_cred_helper_is_one_error(clean_env, monkeypatch):
    monkeypatch.setenv("PATH", str(clean_env))
    _config(clean_env, {"credsStore": "nosuch"})
    with pytest.raises(RegistryError, match="docker-credential-nosuch is not on PATH"):
        Credentials.load("r.example")


# --- a fake registry with a token server ------------------------------------------------------

CONFIG = json.dumps({"os": "linux", "architecture": "amd64",
                     "config": {"Labels": {"org.imgfab.fake": "yes"}}}).encode()
CONFIG_DIGEST = "sha256:" + hashlib.sha256(CONFIG).hexdigest()
MANIFEST = json.dumps({"schemaVersion": 2,
                       "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                  "digest": CONFIG_DIGEST, "size": len(CONFIG)},
                       "layers": []}).encode()
MANIFEST_DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()
INDEX = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                    "manifests": [
                        {"digest": "sha256:" + "b" * 64, "size": 1,
                         "mediaType": "application/vnd.oci.image.manifest.v1+json",
                         "platform": {"os": "linux", "architecture": "arm64"}},
                        {"digest": MANIFEST_DIGEST, "size": len(MANIFEST),
                         "mediaType": "application/vnd.oci.image.manifest.v1+json",
                         "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
INDEX_DIGEST = "sha256:" + hashlib.sha256(INDEX).hexdigest()
TAGS = ["a", "b", "c", "d", "e"]


class _Fake(BaseHTTPRequestHandler):
    token_requests: list[dict] = []
    accepts: list[str] = []

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, status, body=b"", headers=None):
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _challenge(self, scope):
        realm = f"http://127.0.0.1:{self.server.server_port}/token"
        self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {
            "WWW-Authenticate": f'Bearer realm="{realm}",service="fake",scope="{scope}"'})

    def do_GET(self):  # noqa: N802
        url = urlparse(self.path)
        if url.path == "/token":
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            type(self).token_requests.append(query)
            if self.headers.get("Authorization") != "Basic " + base64.b64encode(b"u:pw").decode():
                return self._send(401)
            return self._send(200, json.dumps({"token": "tok-" + query["scope"]}).encode())
        parts = url.path.split("/")
        repo = "/".join(parts[2:-2])
        scope = f"repository:{repo}:pull"
        if self.headers.get("Authorization") != f"Bearer tok-{scope}":
            return self._challenge(scope)
        if parts[-2] == "tags":
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            n, last = int(query.get("n", 100)), query.get("last")
            rest = [t for t in TAGS if last is None or t > last]
            page, more = rest[:n], len(rest) > n
            headers = {"Content-Type": "application/json"}
            if more:
                headers["Link"] = f'</v2/{repo}/tags/list?n={n}&last={page[-1]}>; rel="next"'
            return self._send(200, json.dumps({"name": repo, "tags": page}).encode(), headers)
        if parts[-2] == "manifests":
            type(self).accepts.append(self.headers.get("Accept", ""))
            body = {"v1": INDEX, INDEX_DIGEST: INDEX, MANIFEST_DIGEST: MANIFEST}.get(parts[-1])
            if body is None:
                return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
            media = json.loads(body)["mediaType"]
            digest = "sha256:" + hashlib.sha256(body).hexdigest()
            return self._send(200, body, {"Content-Type": media, "Docker-Content-Digest": digest})
        if parts[-2] == "blobs" and parts[-1] == CONFIG_DIGEST:
            return self._send(200, CONFIG)
        return self._send(404)

    do_HEAD = do_GET


@pytest.fixture(scope="module")
def fake():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()


def test_bearer_resolve_digest_with_accept_headers(fake):
    creds = Credentials(fake, "u", "pw")
    assert resolve_digest(f"{fake}/team/app:v1", creds) == f"{fake}/team/app:v1@{INDEX_DIGEST}"
    accept = _Fake.accepts[-1]
    for media in ("application/vnd.oci.image.index.v1+json",
                  "application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.list.v2+json",
                  "application/vnd.docker.distribution.manifest.v2+json"):
        assert media in accept
    assert _Fake.token_requests[-1] == {"service": "fake", "scope": "repository:team/app:pull"}


def test_bearer_list_tags_paginates(fake):
    assert list_tags(f"{fake}/team/app", Credentials(fake, "u", "pw"), page_size=2) == TAGS


def test_image_config_picks_linux_amd64_from_an_index(fake):
    config = image_config(f"{fake}/team/app:v1", Credentials(fake, "u", "pw"))
    assert config["config"]["Labels"] == {"org.imgfab.fake": "yes"}


def test_bearer_wrong_password_is_refused(fake):
    with pytest.raises(RegistryError) as caught:
        list_tags(f"{fake}/team/app", Credentials(fake, "u", "bad"))
    assert caught.value.one_line() == (f"registry {fake} refused the credentials for user u "
                                       "(401); fix: check --registry-user / the password")


def test_unknown_tag_is_one_error(fake):
    with pytest.raises(RegistryError, match="is not in registry"):
        resolve_digest(f"{fake}/team/app:nope", Credentials(fake, "u", "pw"))


def test_other_hosts_credentials_are_not_sent(fake, clean_env):
    with pytest.raises(RegistryError, match="refused anonymous access"):
        list_tags(f"{fake}/team/app", Credentials("elsewhere:1", "u", "pw"))
