"""verify's per-layer scan of an overlay2 layer directory, and its cache key."""

from __future__ import annotations

import os
import stat

import pytest

from imgfab.docker import verify
from imgfab.docker.verify import VerifyPolicy, _layer_key, _scan_directory, local_layer_dirs


@pytest.fixture
def policy() -> VerifyPolicy:
    return VerifyPolicy(mount_path="/models/m", required_labels={},
                        secrets={"ca-cert": b"-----SECRET MARKER 42-----"})


def test_layer_directory_scan(tmp_path, policy):
    layer = tmp_path / "diff"
    (layer / "usr/bin").mkdir(parents=True)
    (layer / "usr/bin/gcc-12").write_text("elf")
    (layer / "models/m").mkdir(parents=True)
    (layer / "models/m/model.safetensors").write_bytes(b"\0")
    (layer / "etc").mkdir()
    (layer / "etc/leak.pem").write_bytes(b"x" * 10 + b"-----SECRET MARKER 42-----")
    try:
        os.mknod(layer / "usr/bin/git", stat.S_IFCHR | 0o600, 0)  # an overlay whiteout
        whiteout = True
    except PermissionError:
        whiteout = False
    result = _scan_directory(layer, "models/m", policy)
    assert ["usr/bin/gcc-12", "file"] in result["matched"]
    assert result["weights"] == ["/models/m/model.safetensors"]
    assert result["secrets"] == ["ca-cert in /etc/leak.pem"]
    if whiteout:
        assert ["usr/bin/git", "whiteout"] in result["matched"]


def test_cache_key_covers_content_mount_and_secrets(policy):
    base = _layer_key("sha256:aa", policy)
    assert base == _layer_key("sha256:aa", policy)
    assert base != _layer_key("sha256:bb", policy)
    assert base != _layer_key("sha256:aa", VerifyPolicy("/models/other", {}, secrets=policy.secrets))
    assert base != _layer_key("sha256:aa", VerifyPolicy("/models/m", {}, secrets={"ca-cert": b"other"}))


def test_local_layer_dirs_lines_up_with_rootfs(tmp_path):
    dirs = [tmp_path / name for name in ("bottom", "middle", "top")]
    for directory in dirs:
        directory.mkdir()
    info = {"GraphDriver": {"Name": "overlay2", "Data": {
        "UpperDir": str(dirs[2]), "LowerDir": f"{dirs[1]}:{dirs[0]}"}}}
    assert local_layer_dirs(info, ["l0", "l1", "l2"]) == dirs
    assert local_layer_dirs(info, ["l0", "l1"]) is None, "a count mismatch is not trusted"
    assert local_layer_dirs({"GraphDriver": {"Name": "vfs"}}, ["l0"]) is None


def test_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    verify._store_layer("k", {"matched": [["usr/bin/gcc", "file"]], "weights": [], "secrets": []})
    assert verify._load_layer("k")["matched"] == [["usr/bin/gcc", "file"]]
    assert verify._load_layer("missing") is None


def test_payload_toolchain_view_needs_the_payloads_toolkit(policy, tmp_path):
    """A CUDA_HOME view of the payload's toolkit (toolchain: payload) fails verify when the
    payload lacks what it points at; the venv's nvcc is a payload note, not a tool failure."""
    from dataclasses import replace

    from imgfab.docker.verify import _LayerScan

    tree = "opt/venv/lib/python3.12/site-packages/nvidia/cu13"
    layer = tmp_path / "diff"
    for path in ("bin/nvcc", "nvvm/bin/cicc", "include/cuda_runtime.h", "include/curand_kernel.h",
                 "lib/libcudart.so.13"):
        (layer / tree / path).parent.mkdir(parents=True, exist_ok=True)
        (layer / tree / path).write_text("x")
    full = _scan_directory(layer, "models/m", policy)
    (layer / tree / "bin/nvcc").unlink()
    partial = _scan_directory(layer, "models/m", policy)
    viewing = replace(policy, payload_toolkit=tuple(verify.PAYLOAD_TOOLKIT), declared_toolchain=())
    for result, ok in ((full, True), (partial, False)):
        scan = _LayerScan(order=["l0"])
        scan.merge("l0", result, set())
        findings = {f.check: f for f in verify.layer_findings(scan, viewing)}
        assert findings["cuda_home"].passed is ok, findings["cuda_home"].detail
        assert findings["tools"].passed, findings["tools"].detail
        if not ok:
            assert "nvcc" in findings["cuda_home"].detail
    assert any("nvcc (Python wheel)" in n for n in scan.notes + _notes(full, policy))
    plain = _LayerScan(order=["l0"])
    plain.merge("l0", partial, set())
    assert "cuda_home" not in {f.check for f in verify.layer_findings(plain, policy)}


def _notes(result, policy):
    from imgfab.docker.verify import _LayerScan

    scan = _LayerScan(order=["l0"])
    scan.merge("l0", result, set())
    verify.layer_findings(scan, policy)
    return scan.notes
