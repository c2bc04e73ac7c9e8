"""select prints exactly the digest of the manifest bytes it judged (issue 21): a registry that
answers HEAD and GET differently, serves bytes that do not hash to the digest asked for, or
announces a Docker-Content-Digest its bytes do not have, cannot get an unfit image chosen.

The registry is a local anonymous HTTP server whose GET and HEAD answers are set per path.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from imgfab.docker import registry
from imgfab.docker.registry import Credentials
from imgfab.errors import RegistryError

from test_select_doctor import _labels

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX = "application/vnd.oci.image.index.v1+json"


def _sha(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _answer(self, routes):
        path = self.path.split("?")[0]
        status, body, headers = routes.get(path, (404, b'{"errors":[{"code":"NOT_FOUND"}]}', {}))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self._answer(self.server.get)

    def do_HEAD(self):  # noqa: N802
        self._answer({**self.server.get, **self.server.head})


class _Fake:
    """A repository ``llm/x``: blobs, manifests by tag and digest, HEAD overrides."""

    def __init__(self):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.get, self.server.head = {}, {}
        self.host = f"127.0.0.1:{self.server.server_port}"
        self.tags: list[str] = []
        self._tags()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _tags(self):
        self.server.get["/v2/llm/x/tags/list"] = (
            200, json.dumps({"tags": self.tags}).encode(), {"Content-Type": "application/json"})

    def image(self, labels: dict) -> bytes:
        """A manifest (its bytes) whose config carries ``labels``; the config blob is served."""
        config = json.dumps({"config": {"Labels": labels}}).encode()
        self.server.get[f"/v2/llm/x/blobs/{_sha(config)}"] = (200, config, {})
        return json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                           "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                                      "digest": _sha(config), "size": len(config)},
                           "layers": []}).encode()

    def manifest(self, reference: str, body: bytes, *, digest_header: str | None = "auto",
                 head_digest: str | None = None, tag: bool = True):
        header = _sha(body) if digest_header == "auto" else digest_header
        headers = {"Content-Type": json.loads(body).get("mediaType", MANIFEST)}
        if header:
            headers["Docker-Content-Digest"] = header
        self.server.get[f"/v2/llm/x/manifests/{reference}"] = (200, body, headers)
        if head_digest is not None:
            self.server.head[f"/v2/llm/x/manifests/{reference}"] = (
                200, b"", {**headers, "Docker-Content-Digest": head_digest})
        if tag and not reference.startswith("sha256:"):
            self.tags.append(reference)
            self._tags()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    registry = _Fake()
    yield registry
    registry.close()


@pytest.fixture(scope="module")
def good(matrix) -> dict[str, str]:
    return _labels(matrix, "qwen2-7b-h100")


def _unfit(good: dict[str, str]) -> dict[str, str]:
    return {**good, "org.imgfab.driver.floor": "9999.0"}


def _select(fake: _Fake, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMGFAB_", "DOCKER_"))}
    env["DOCKER_CONFIG"] = str(tmp_path)
    return subprocess.run(
        [sys.executable, "-c", "from imgfab.cli import main; main()", "select",
         "--registry", f"{fake.host}/llm/x", "--driver", "999.1.1", "--gpu", "H100-SXM",
         "--explain"], capture_output=True, text=True, timeout=120, env=env)


def test_select_prints_the_digest_of_the_bytes_it_judged_not_a_second_head(fake, good, tmp_path):
    fit = fake.image(good)
    unfit = fake.image(_unfit(good))
    fake.manifest(_sha(unfit), unfit, tag=False)
    # The attack: GET by tag serves a fit image, HEAD names an unfit one.
    fake.manifest("v1", fit, head_digest=_sha(unfit))
    result = _select(fake, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == f"{fake.host}/llm/x@{_sha(fit)}"


def test_an_index_child_whose_bytes_do_not_hash_to_its_digest_is_rejected(fake, good, tmp_path):
    declared = fake.image(_unfit(good))
    served = fake.image(good)
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": [
        {"mediaType": MANIFEST, "digest": _sha(declared), "size": len(declared),
         "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
    fake.manifest(_sha(declared), served, digest_header=None, tag=False)
    fake.manifest("v2", index)
    result = _select(fake, tmp_path)
    assert result.returncode == 1, result.stdout
    assert any(line.startswith("- v2:") and "not the digest asked for" in line
               for line in result.stdout.splitlines()), result.stdout
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr


def test_a_docker_content_digest_that_disagrees_with_the_bytes_is_rejected(fake, good, tmp_path):
    fit = fake.image(good)
    fake.manifest("v3", fit, digest_header="sha256:" + "0" * 64)
    result = _select(fake, tmp_path)
    assert result.returncode == 1, result.stdout
    assert any(line.startswith("- v3:") and "announced" in line
               for line in result.stdout.splitlines()), result.stdout


def test_a_manifest_fetched_by_digest_is_hash_checked(fake, good):
    fit = fake.image(good)
    other = fake.image(_unfit(good))
    fake.manifest(_sha(other), fit, digest_header=None, tag=False)
    with pytest.raises(RegistryError, match="not the digest asked for"):
        registry.image_config(f"{fake.host}/llm/x@{_sha(other)}", Credentials(fake.host))


def test_published_labels_pairs_the_digest_with_its_labels(fake, good):
    fit = fake.image(good)
    fake.manifest("v4", fit, digest_header=None, head_digest="sha256:" + "1" * 64)
    digest, labels = registry.published_labels(f"{fake.host}/llm/x:v4", Credentials(fake.host))
    assert digest == _sha(fit) and labels == good


# --- what select prints of what the registry supplied ---------------------------------------

def test_a_hostile_tag_is_one_printable_rejected_candidate(fake, good, tmp_path):
    fake.manifest("ok", fake.image(good))
    fake.tags.append("\x1b]0;pwned\x07v1?n=1")
    fake._tags()
    result = _select(fake, tmp_path)
    assert result.returncode == 0, result.stderr
    assert not any(ord(ch) < 32 and ch != "\n" or 0x7f <= ord(ch) <= 0x9f
                   for ch in result.stdout), repr(result.stdout)
    assert any(line.startswith("- ") and "not an image reference" in line
               for line in result.stdout.splitlines()), result.stdout


def test_a_verdict_quoting_a_huge_label_is_one_bounded_printable_line(good):
    from imgfab.ops.select import HostGpu, Published, evaluate

    host = HostGpu(driver="999.1.1", gpu="A100-SXM4-80GB", compute_capability="8.0",
                   platform="linux/amd64")
    label = "\x1b[2J" + ",".join(f"sm_{i}" for i in range(20_000))
    candidate = evaluate(Published("r/x", "t", "sha256:" + "0" * 64,
                                   {**good, "org.imgfab.precision": label,
                                    "org.imgfab.precision.min_cc": "8.9"}), host)
    reason = candidate.reason()
    assert not candidate.fits and len(reason) <= 501 and "\x1b" not in reason


@pytest.mark.parametrize("tag", ["v1?n=1", "..", "-x", "a" * 129, "v\x1b1"])
def test_a_tag_outside_the_spec_grammar_is_no_image_reference(tag):
    with pytest.raises(RegistryError, match="not an image reference"):
        registry.ImageRef.parse(f"127.0.0.1:5000/llm/x:{tag}")
