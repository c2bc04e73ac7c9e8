"""verify's per-layer scan of an overlay2 layer directory, and its cache key."""

from __future__ import annotations

import os
import stat

import pytest

from imgfab import verify
from imgfab.verify import VerifyPolicy, _layer_key, _scan_directory, local_layer_dirs


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
