"""select and doctor judge each image on its own (issue 12): one tag with bad labels, or one the
registry cannot describe, is one rejected candidate, never a failure of the whole repository.

The registry is a local anonymous HTTP server serving a good image's config next to broken ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from imgfab.ops.doctor import image_findings
from imgfab.in_image.facts import GpuFacts, HostFacts
from imgfab.ops.select import HostGpu, Published, choose

from test_select_doctor import _labels

H100 = HostGpu(driver="999.1.1", gpu="H100-SXM", compute_capability="9.0", platform="linux/amd64")


@pytest.fixture(scope="module")
def good(matrix) -> dict[str, str]:
    return _labels(matrix, "qwen2-7b-h100")


def _broken(good: dict[str, str]) -> list[dict]:
    return [
        {**good, "org.imgfab.driver.floor": "not-a-version"},
        {**good, "org.imgfab.archs": "sm_zz,9.x"},
        {**good, "org.imgfab.precision": "fp8", "org.imgfab.precision.min_cc": "x"},
        {**good, "org.imgfab.backend.version": 5},
        {**good, "org.imgfab.recipe.name": None},
        ["not", "a", "mapping"],
    ]


def test_one_bad_label_is_one_rejected_candidate(good):
    images = [Published("r/x", f"bad{i}", f"sha256:{i:064x}", labels)
              for i, labels in enumerate(_broken(good))]
    images.append(Published("r/x", "good", "sha256:" + "f" * 64, good))
    best, candidates = choose(images, H100)
    assert best is not None and best.image.tag == "good"
    assert len(candidates) == len(images)
    rejected = [c for c in candidates if c.image.tag.startswith("bad")]
    assert all(not c.fits and "labels" in {v.check for v in c.verdicts} for c in rejected)


def test_doctor_reports_unreadable_labels_as_a_finding(good):
    host = HostFacts(driver="999.1.1", gpus=[GpuFacts(0, "NVIDIA H100 80GB HBM3", "9.0")])
    for labels in _broken(good):
        findings = image_findings(labels, host)
        assert findings and all(f.severity in ("ok", "error", "info", "warn") for f in findings)
        assert any(f.severity == "error" for f in findings), labels


class _Registry(BaseHTTPRequestHandler):
    blobs: dict[str, bytes] = {}
    manifests: dict[str, bytes] = {}

    def log_message(self, *args):
        pass

    def _send(self, status, body=b"", headers=None):
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        parts = self.path.split("?")[0].split("/")
        if self.path.startswith("/v2/llm/x/tags/list"):
            return self._send(200, json.dumps({"tags": sorted(self.manifests)}).encode(),
                              {"Content-Type": "application/json"})
        if parts[-2] == "manifests" and parts[-1] in self.manifests:
            body = self.manifests[parts[-1]]
            return self._send(200, body, {
                "Content-Type": "application/vnd.docker.distribution.manifest.v2+json",
                "Docker-Content-Digest": "sha256:" + hashlib.sha256(body).hexdigest()})
        if parts[-2] == "blobs" and parts[-1] in self.blobs:
            return self._send(200, self.blobs[parts[-1]])
        return self._send(404, b'{"errors":[{"code":"NOT_FOUND"}]}')

    do_HEAD = do_GET


def _image(tag: str, config: bytes) -> None:
    digest = "sha256:" + hashlib.sha256(config).hexdigest()
    _Registry.blobs[digest] = config
    _Registry.manifests[tag] = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": digest, "size": len(config)}, "layers": []}).encode()


def test_select_cli_survives_broken_tags(good, tmp_path):
    _image("good", json.dumps({"config": {"Labels": good}}).encode())
    _image("bad-json", b"{not json")
    _image("bad-labels", json.dumps({"config": {"Labels": {"org.imgfab.driver.floor": 535}}}).encode())
    _image("bad-floor", json.dumps({"config": {"Labels": {**good, "org.imgfab.driver.floor": "x"}}}).encode())
    _Registry.manifests["bad-manifest"] = b"[1, 2]"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("IMGFAB_", "DOCKER_"))}
        env["DOCKER_CONFIG"] = str(tmp_path)
        result = subprocess.run(
            [sys.executable, "-c", "from imgfab.cli import main; main()", "select",
             "--registry", f"127.0.0.1:{server.server_port}/llm/x", "--driver", "999.1.1",
             "--gpu", "H100-SXM", "--explain"],
            capture_output=True, text=True, timeout=120, env=env)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1].startswith(f"127.0.0.1:{server.server_port}/llm/x@sha256:")
    assert any(line.startswith("* good") for line in lines)
    for tag in ("bad-json", "bad-labels", "bad-floor", "bad-manifest"):
        assert any(line.startswith(f"- {tag}:") for line in lines), (tag, lines)


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _host_edge(tmp_path: Path, *, nvml: str | None = None, smi: str | None = None) -> dict[str, str]:
    """An environment whose NVML edge is a recorded pynvml (``nvml``: FakeNvml arguments) or,
    with pynvml made unimportable, whose nvidia-smi prints ``smi``; Docker unreachable."""
    edge = tmp_path / "edge"
    edge.mkdir()
    if nvml is not None:
        (edge / "pynvml.py").write_text(
            "from fake_nvml import FakeNvml, H100, H200, A100\n"
            f"_FAKE = FakeNvml({nvml})\n"
            "def __getattr__(name):\n    return getattr(_FAKE, name)\n")
    else:
        (edge / "pynvml.py").write_text("raise ImportError('nvidia-ml-py is not installed')\n")
    path = os.environ.get("PATH", "")
    if smi is not None:
        script = edge / "nvidia-smi"
        script.write_text(f"#!/bin/sh\nprintf '{smi}'\n")
        script.chmod(0o755)
        path = f"{edge}{os.pathsep}{path}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMGFAB_", "DOCKER_"))}
    env.update(DOCKER_CONFIG=str(tmp_path), DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock", PATH=path,
               PYTHONPATH=os.pathsep.join([str(edge), str(FIXTURES), env.get("PYTHONPATH", "")]))
    return env


def _select_here(env: dict[str, str], port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from imgfab.cli import main; main()", "select",
                           "--registry", f"127.0.0.1:{port}/llm/x", "--explain"],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("edge, seen", [
    ({"nvml": "driver='580.159.04', gpus=[H200]"}, "read from NVML: GPU0 NVIDIA H200, 140.4 GiB, driver 580.159.04"),
    ({"smi": "0, NVIDIA H200, 9.0, 143771, 580.159.04\\n"},
     "read from nvidia-smi: GPU0 NVIDIA H200, 140.4 GiB, driver 580.159.04"),
])
def test_select_without_gpu_or_driver_uses_this_hosts_first_gpu(good, tmp_path, edge, seen):
    _Registry.manifests.clear()
    _image("good", json.dumps({"config": {"Labels": good}}).encode())
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = _select_here(_host_edge(tmp_path, **edge), server.server_port)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"host: H200 (cc 9.0), driver 580.159.04; {seen}"
    assert any(line.startswith("* good") for line in lines)
    assert lines[-1].startswith(f"127.0.0.1:{server.server_port}/llm/x@sha256:")


@pytest.mark.parametrize("edge, said", [
    ({"smi": "0, NVIDIA H100 NVL, 9.0, 95830, 580.95.05\\n"}, "imgfab: --gpu: unknown GPU 'NVIDIA H100 NVL'"),
    ({}, "imgfab: --driver/--gpu: cannot read this host's GPU (neither NVML"),
    ({"nvml": "init_error='NVML Shared Library Not Found'"}, "imgfab: --driver/--gpu: cannot read this host's GPU (NVML did not start"),
])
def test_select_without_gpu_on_a_host_it_cannot_match_is_one_line_exit_2(tmp_path, edge, said):
    env = _host_edge(tmp_path, **edge)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if p == str(tmp_path / "edge") or not (Path(p) / "nvidia-smi").exists())
    result = _select_here(env, 9)  # refused before any registry is asked
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(said) and result.stderr.count("\n") == 1, result.stderr


def test_doctor_names_the_hosts_gpu_from_the_matrix(tmp_path):
    env = _host_edge(tmp_path, nvml="driver='580.159.04', gpus=[H200]")
    result = subprocess.run([sys.executable, "-c", "from imgfab.cli import main; main()", "doctor"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert "[ok] driver: driver 580.159.04; GPUs: NVIDIA H200 (cc 9.0)" in result.stdout, result.stdout
    assert ("[ok] gpu-matrix: GPU0 NVIDIA H200, 140.4 GiB is H200 in compat/gpus.yaml (cc 9.0, hopper) "
            "(`imgfab select` without --gpu decides for it)") in result.stdout
