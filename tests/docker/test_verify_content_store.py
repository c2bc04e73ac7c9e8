"""verify on the containerd image store (issue 19): a local engine's content store holds each
layer as its compressed blob, found through the image's own manifest (the image ID is its
digest, or an index's). Each blob is read whole and must hash to the diff id inspect reports."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest

from imgfab.docker import verify
from imgfab.docker.layers import local_layer_blobs
from imgfab.docker.verify import VerifyPolicy

SECRET = b"-----CONTENT STORE SECRET 9e1-----"


def _layer(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _put(store, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (store / digest).write_bytes(data)
    return f"sha256:{digest}"


@pytest.fixture
def image(tmp_path, monkeypatch):
    """A content store under a data root, and inspect's answer for an image of two layers."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "docker-data"
    store = root / "containerd/daemon/io.containerd.content.v1.content/blobs/sha256"
    store.mkdir(parents=True)
    tars = [_layer({"usr/bin/tool": b"elf"}), _layer({"etc/leak.pem": b"x" * 9 + SECRET})]
    blobs = [_put(store, gzip.compress(t, mtime=0)) for t in tars]
    manifest = {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                "layers": [{"digest": d, "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip"}
                           for d in blobs]}
    manifest_id = _put(store, json.dumps(manifest).encode())
    index = {"manifests": [{"digest": manifest_id, "platform": {"os": "linux", "architecture": "amd64"}}]}
    info = {"Id": _put(store, json.dumps(index).encode()), "Os": "linux", "Architecture": "amd64",
            "GraphDriver": {"Name": "overlayfs", "Data": None}, "Config": {},
            "RootFS": {"Layers": [f"sha256:{hashlib.sha256(t).hexdigest()}" for t in tars]}}

    class Engine:
        saved = 0

        def inspect_image(self, ref):
            return info

        def image_history(self, ref):
            return []

        def docker_info(self):
            return {"DockerRootDir": str(root)}

        def save_stream(self, ref):
            Engine.saved += 1
            raise AssertionError("the content store was there: no docker save")

    return info, store, Engine(), blobs


def test_blobs_are_found_through_the_index_and_manifest(image):
    info, store, engine, blobs = image
    found = local_layer_blobs(info, info["RootFS"]["Layers"], engine.docker_info()["DockerRootDir"])
    assert [f"sha256:{p.name}" for p in found] == blobs
    root = engine.docker_info()["DockerRootDir"]
    assert local_layer_blobs(info, info["RootFS"]["Layers"][:1], root) is None, "count must match"
    assert local_layer_blobs({**info, "Id": "sha256:" + "0" * 64}, info["RootFS"]["Layers"],
                             engine.docker_info()["DockerRootDir"]) is None


def test_each_blob_is_scanned_and_checked_against_its_diff_id(image):
    info, store, engine, blobs = image
    policy = VerifyPolicy(mount_path="/models/m", required_labels={}, secrets={"ca-cert": SECRET})
    report = verify.verify_image("img", policy, engine=engine, raise_on_failure=False)
    checks = {f.check: f for f in report.findings}
    assert checks["layers"].passed, checks["layers"].detail
    assert not checks["secrets"].passed and "/etc/leak.pem" in checks["secrets"].detail
    assert "read from the containerd content store" in " ".join(report.notes)
    # A blob whose bytes are not the layer inspect names: unscanned, the layers check fails.
    (store / blobs[0][7:]).write_bytes(gzip.compress(_layer({"usr/bin/other": b"elf"}), mtime=0))
    policy.secrets = {"ca-cert": SECRET + b"2"}  # another cache key: nothing known from the first scan
    again = verify.verify_image("img", policy, engine=engine, raise_on_failure=False)
    layers = next(f for f in again.findings if f.check == "layers")
    assert not layers.passed and "hash to" in layers.detail, layers.detail
