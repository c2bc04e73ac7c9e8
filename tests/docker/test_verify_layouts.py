"""verify reads every layout ``docker save`` writes (issue 12).

Synthetic ``docker save`` archives, built here byte for byte: the legacy layout
(``<id>/layer.tar``, duplicates as symlinks), the OCI layout Engine ≥ 25 writes
(``blobs/sha256/<hex>`` listed by ``manifest.json``), and OCI blobs compressed with gzip or
zstd (containerd image store). The engine is a stand-in at the edge: it hands verify the
archive as ``save_stream`` would and an ``inspect`` without overlay2 directories.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest

from imgfab.docker import verify
from imgfab.docker.verify import VerifyPolicy, verify_image

SECRET = b"-----SECRET MARKER 42-----"
CLEAN = {"etc/hostname": b"box\n", "opt/imgfab/serve.sh": b"#!/bin/sh\n"}
DIRTY = {"models/m/model.safetensors": b"weights", "usr/bin/make": b"\x7fELF",
         "etc/leak.txt": b"xx" + SECRET + b"yy"}


def layer_tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _compress(data: bytes, how: str) -> bytes:
    if how == "gzip":
        return gzip.compress(data)
    if how == "zstd":
        import zstandard
        return zstandard.ZstdCompressor().compress(data)
    return data


def save_archive(layers: list[bytes], layout: str, *, compress: str = "none",
                 drop: int | None = None, corrupt: int | None = None,
                 history: list[dict] | None = None, declared: list[str] | None = None) -> bytes:
    """A ``docker save`` archive of one image with ``layers`` (bottom first).

    ``drop``: leave listed layer number ``drop`` out of the archive; ``corrupt``: replace its
    bytes with a truncated gzip stream; ``declared``: the config's diff ids (default: the
    layers' true hashes)."""
    config = json.dumps({"config": {"User": "imgfab"}, "history": history or [],
                         "rootfs": {"type": "layers", "diff_ids": declared or [
                             "sha256:" + hashlib.sha256(l).hexdigest() for l in layers]}})
    members: list[tuple[str, bytes | str]] = []  # name → bytes, or str for a symlink target
    listed = []
    if layout.startswith("legacy"):
        seen: dict[bytes, str] = {}
        for index, layer in enumerate(layers):
            name = f"{index:064x}/layer.tar"
            listed.append(name)
            if layout == "legacy-symlink" and layer in seen:
                members.append((name, f"../{seen[layer].split('/')[0]}/layer.tar"))
            else:
                seen[layer] = name
                members.append((name, layer))
        members.append(("cfg.json", config.encode()))
        manifest = [{"Config": "cfg.json", "RepoTags": ["t:1"], "Layers": listed}]
    else:
        blobs = []
        for layer in layers:
            blob = _compress(layer, compress)
            name = f"blobs/sha256/{hashlib.sha256(blob).hexdigest()}"
            if name not in listed:
                blobs.append((name, blob))
            listed.append(name)
        cfg_name = f"blobs/sha256/{hashlib.sha256(config.encode()).hexdigest()}"
        members += [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                    ("index.json", b'{"schemaVersion":2,"manifests":[]}'),
                    (cfg_name, config.encode()), *blobs]
        manifest = [{"Config": cfg_name, "RepoTags": ["t:1"], "Layers": listed}]
    if drop is not None:
        members = [(n, d) for n, d in members if n != listed[drop]]
    if corrupt is not None:
        members = [(n, gzip.compress(b"x" * 5000)[:40] if n == listed[corrupt] else d)
                   for n, d in members]
    members.append(("manifest.json", json.dumps(manifest).encode()))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def declared_diff_ids(archive: bytes) -> list[str]:
    """The ``rootfs.diff_ids`` of the image config in ``archive`` (what inspect reports)."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        return json.load(tar.extractfile(manifest[0]["Config"]))["rootfs"]["diff_ids"]


class FakeEngine:
    """The engine edge: inspect (no overlay2 dirs, so the save stream is read) and save.
    inspect reports the archive's diff ids (padded with made-up ones up to ``count``), or
    ``layers`` when given."""

    def __init__(self, archive: bytes, count: int, layers: list[str] | None = None):
        self.archive = archive
        self.count = count
        self.layers = layers
        self.refs: list[tuple[str, str]] = []

    def inspect_image(self, ref):
        self.refs.append(("inspect", ref))
        layers = self.layers
        if layers is None:
            layers = (declared_diff_ids(self.archive) if self.archive else [])[:self.count]
            layers += [f"sha256:{i:064x}" for i in range(len(layers), self.count)]
        return {"Id": "sha256:" + "1" * 64,
                "Config": {"User": "imgfab", "Labels": {}, "Env": ["NVIDIA_REQUIRE_CUDA=x"],
                           "Healthcheck": {"Test": ["CMD", "true"]}},
                "RootFS": {"Layers": layers}}

    def save_stream(self, ref):
        self.refs.append(("save", ref))
        return (self.archive[i:i + 1000] for i in range(0, len(self.archive), 1000))

    def image_history(self, ref):
        self.refs.append(("history", ref))
        return []


@pytest.fixture(autouse=True)
def no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _verdicts(archive: bytes, count: int, policy: VerifyPolicy | None = None) -> dict[str, bool]:
    policy = policy or VerifyPolicy(mount_path="/models/m", required_labels={},
                                    secrets={"ca-cert": SECRET})
    report = verify_image("t:1", policy, engine=FakeEngine(archive, count), raise_on_failure=False)
    return {f.check: f.passed for f in report.findings}


LAYOUTS = [("legacy", "none"), ("legacy-symlink", "none"), ("oci", "none"), ("oci", "gzip"),
           ("oci", "zstd")]


@pytest.mark.parametrize("layout, compress", LAYOUTS)
def test_each_layout_finds_weights_tools_and_secrets(layout, compress):
    archive = save_archive([layer_tar(CLEAN), layer_tar(DIRTY)], layout, compress=compress)
    verdicts = _verdicts(archive, 2)
    assert verdicts["layers"] is True
    assert (verdicts["weights"], verdicts["tools"], verdicts["secrets"]) == (False, False, False)


@pytest.mark.parametrize("layout, compress", LAYOUTS)
def test_each_layout_passes_a_clean_image(layout, compress):
    archive = save_archive([layer_tar(CLEAN), layer_tar(CLEAN)], layout, compress=compress)
    verdicts = _verdicts(archive, 2)
    assert all(verdicts.values()), verdicts


def test_duplicate_layer_linked_in_a_legacy_save_is_still_scanned():
    archive = save_archive([layer_tar(DIRTY), layer_tar(CLEAN), layer_tar(DIRTY)], "legacy-symlink")
    policy = VerifyPolicy(mount_path="/models/m", required_labels={})
    scan = verify._scan_layers(iter([archive]), policy)
    assert scan.unscanned == [] and len(scan.order) == 3
    assert scan.layers[scan.order[2]] == scan.layers[scan.order[0]] != []


@pytest.mark.parametrize("layout, compress", [("legacy", "none"), ("oci", "gzip")])
def test_a_listed_layer_missing_from_the_archive_fails_closed(layout, compress):
    archive = save_archive([layer_tar(CLEAN), layer_tar(DIRTY)], layout, compress=compress, drop=1)
    verdicts = _verdicts(archive, 2)
    assert verdicts["layers"] is False


@pytest.mark.parametrize("layout", ["legacy", "oci"])
def test_the_missing_layer_is_named(layout):
    archive = save_archive([layer_tar(CLEAN), layer_tar(DIRTY)], layout, drop=1)
    scan = verify._scan_layers(iter([archive]), VerifyPolicy(mount_path="/models/m", required_labels={}))
    assert len(scan.unscanned) == 1 and "not in the archive" in scan.unscanned[0]
    report = verify_image("t:1", VerifyPolicy(mount_path="/models/m", required_labels={}),
                          engine=FakeEngine(archive, 2), raise_on_failure=False)
    layers = next(f for f in report.findings if f.check == "layers")
    assert not layers.passed and "not in the archive" in layers.detail


@pytest.mark.parametrize("layout, compress", [("legacy", "none"), ("oci", "gzip")])
def test_a_secret_in_the_image_history_is_found(layout, compress):
    history = [{"created_by": "RUN echo " + SECRET.decode() + " > /dev/null"}]
    archive = save_archive([layer_tar(CLEAN)], layout, compress=compress, history=history)
    assert _verdicts(archive, 1)["secrets"] is False


def test_a_secret_in_the_image_history_is_found_on_the_overlay2_path(tmp_path):
    layer = tmp_path / "diff"
    (layer / "etc").mkdir(parents=True)
    (layer / "etc/hostname").write_text("box\n")

    class Overlay(FakeEngine):
        def inspect_image(self, ref):
            info = super().inspect_image(ref)
            info["GraphDriver"] = {"Name": "overlay2", "Data": {"UpperDir": str(layer)}}
            return info

        def save_stream(self, ref):
            raise AssertionError("the overlay2 path reads the layer directories")

        def image_history(self, ref):
            return [{"CreatedBy": "RUN echo " + SECRET.decode()}]

    policy = VerifyPolicy(mount_path="/models/m", required_labels={}, secrets={"ca-cert": SECRET})
    report = verify_image("t:1", policy, engine=Overlay(b"", 1), raise_on_failure=False)
    secrets = next(f for f in report.findings if f.check == "secrets")
    assert not secrets.passed and "image config" in secrets.detail


def test_an_unreadable_listed_layer_fails_closed():
    archive = save_archive([layer_tar(CLEAN), layer_tar(DIRTY)], "oci", compress="gzip", corrupt=1)
    assert _verdicts(archive, 2)["layers"] is False


def test_a_layer_count_other_than_the_images_fails_closed():
    archive = save_archive([layer_tar(CLEAN)], "oci")
    assert _verdicts(archive, 2)["layers"] is False


def test_zstd_without_the_module_fails_closed(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_zstd(name, *args, **kwargs):
        if name == "zstandard":
            raise ImportError(name)
        return real(name, *args, **kwargs)
    archive = save_archive([layer_tar(CLEAN), layer_tar(CLEAN)], "oci", compress="zstd")
    monkeypatch.setattr(builtins, "__import__", no_zstd)
    assert _verdicts(archive, 2)["layers"] is False


@pytest.mark.parametrize("layout", ["legacy", "oci"])
def test_whiteout_named_files_are_still_searched(layout):
    sneaky = {"etc/.wh.leak": b"aa" + SECRET, "models/m/.wh.w": b"weights"}
    verdicts = _verdicts(save_archive([layer_tar(CLEAN), layer_tar(sneaky)], layout), 2)
    assert verdicts["secrets"] is False
    assert verdicts["weights"] is False


def test_an_empty_whiteout_is_a_deletion_not_a_finding():
    deleting = {"usr/bin/.wh.make": b""}
    archive = save_archive([layer_tar({"usr/bin/make": b"elf"}), layer_tar(deleting)], "oci")
    verdicts = _verdicts(archive, 2)
    assert verdicts["tools"] is True and verdicts["secrets"] is True


@pytest.mark.parametrize("mount", ["/models//m", "/models/m/.", "/models/./m/"])
def test_mount_path_is_normalised(mount):
    policy = VerifyPolicy(mount_path=mount, required_labels={})
    archive = save_archive([layer_tar({"models/m/w.bin": b"w"})], "oci")
    assert _verdicts(archive, 1, policy)["weights"] is False


PIP_CONF = b"[global]\nindex-url = https://ci:hunter2-Pa55@pypi.corp.example/simple\n"
CORP_CA = (b"-----BEGIN CERTIFICATE-----\nQ09SUCBDQSBPTkU=\n-----END CERTIFICATE-----\n")
PUBLIC_CA = (b"-----BEGIN CERTIFICATE-----\nUFVCTElDIENB\n-----END CERTIFICATE-----\n")


@pytest.mark.parametrize("leak, name", [
    (b"PIP_INDEX_URL=https://ci:hunter2-Pa55@pypi.corp.example/simple", "pip-conf (URL with credentials)"),
    (b"password was hunter2-Pa55 here", "pip-conf (password)"),
    (b"trust:\n" + CORP_CA, "ca-cert (PEM block 2)"),
])
def test_secrets_are_found_as_url_password_and_pem_block(leak, name):
    policy = VerifyPolicy(mount_path="/models/m", required_labels={},
                          secrets={"pip-conf": PIP_CONF, "ca-cert": PUBLIC_CA + CORP_CA},
                          public_pem=frozenset({PUBLIC_CA.strip()}))
    archive = save_archive([layer_tar({"etc/profile.d/x.sh": leak})], "oci", compress="gzip")
    report = verify_image("t:1", policy, engine=FakeEngine(archive, 1), raise_on_failure=False)
    secrets = next(f for f in report.findings if f.check == "secrets")
    assert not secrets.passed
    assert name in secrets.detail


def test_public_ca_blocks_of_a_bundle_are_not_secrets():
    policy = VerifyPolicy(mount_path="/models/m", required_labels={},
                          secrets={"ca-cert": PUBLIC_CA + CORP_CA},
                          public_pem=frozenset({PUBLIC_CA.strip()}))
    archive = save_archive([layer_tar({"etc/ssl/certs/ca-certificates.crt": PUBLIC_CA})], "oci")
    assert _verdicts(archive, 1, policy)["secrets"] is True


def test_short_passwords_are_searched_inside_their_url_only():
    needles = verify.secret_needles({"pip-conf": b"index-url = https://u:pw@h/simple\n"})
    assert b"pw" not in needles.values()
    assert b"https://u:pw@h/simple" in needles.values()
