"""What a layer holds besides file contents, and bounded work on hostile layers (issue 21).

- a secret in an entry's name, its link target, its owner names or a PAX record is in the
  pushed layer as much as a file's bytes are: the secrets check finds it, and never prints it;
- a sparse member announced at 32 GiB is not read as 32 GiB of zeros: only the bytes the
  layer stores are searched (the work is bounded by the layer's real size); a sparse map that
  is not sorted or runs past the member's size fails the layer;
- whiteouts hide only the layers below their own, whatever their order inside the layer
  (the walk is linear: bench/verify_whiteouts.py prints the before/after figures).
"""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from imgfab.docker import layers, verify
from imgfab.docker.verify import VerifyPolicy, verify_image

from test_verify_layouts import CLEAN, FakeEngine, layer_tar, save_archive

PASSWORD = "hunter2-Pa55word"
PIP_CONF = f"[global]\nindex-url = https://ci:{PASSWORD}@pypi.corp.example/simple\n".encode()
POLICY = VerifyPolicy(mount_path="/models/m", required_labels={}, secrets={"pip-conf": PIP_CONF})


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _tar(entries: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info in entries:
            body = (data or {}).get(info.name)
            if body is not None:
                info.size = len(body)
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return buffer.getvalue()


def _entry(name: str, **fields) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    for key, value in fields.items():
        setattr(info, key, value)
    return info


def _secrets(layer: bytes, layout: str = "oci"):
    archive = save_archive([layer_tar(CLEAN), layer], layout)
    report = verify_image("t:1", POLICY, engine=FakeEngine(archive, 2), raise_on_failure=False)
    return next(f for f in report.findings if f.check == "secrets")


@pytest.mark.parametrize("entry, where", [
    (_entry(f"etc/{PASSWORD}.txt"), "name"),
    (_entry("etc/pip", type=tarfile.SYMTYPE,
            linkname=f"/srv/https://ci:{PASSWORD}@pypi.corp.example/simple"), "link target"),
    (_entry("etc/pip.lnk", type=tarfile.LNKTYPE, linkname=f"etc/{PASSWORD}"), "link target"),
    (_entry("etc/owned", uname=PASSWORD), "owner"),
    (_entry("etc/noted", pax_headers={"comment": f"pw={PASSWORD}"}), "PAX record"),
    (_entry("etc/x", pax_headers={f"IMGFAB.{PASSWORD}": "1"}), "PAX record"),
])
@pytest.mark.parametrize("layout", ["legacy", "oci"])
def test_a_secret_in_an_entry_header_is_found_and_not_shown(entry, where, layout):
    secrets = _secrets(_tar([_entry("etc/hostname"), entry], {"etc/hostname": b"box\n"}), layout)
    assert not secrets.passed
    assert f"pip-conf (password) in the {where} of" in secrets.detail, secrets.detail
    assert PASSWORD not in secrets.detail


def test_a_secret_in_a_file_name_is_masked_in_the_content_finding():
    layer = _tar([_entry(f"etc/{PASSWORD}")], {f"etc/{PASSWORD}": b"x" + PASSWORD.encode()})
    secrets = _secrets(layer)
    assert not secrets.passed and PASSWORD not in secrets.detail and "/etc/***" in secrets.detail


def test_the_overlay2_directory_scan_searches_names_and_link_targets(tmp_path):
    root = tmp_path / "diff"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / f"{PASSWORD}.txt").write_text("clean\n")
    os.symlink(f"/x/{PASSWORD}", root / "etc" / "link")
    result = verify._scan_directory(root, "models/m", POLICY)
    assert "pip-conf (password) in the name of /etc/***.txt" in result["secrets"]
    assert "pip-conf (password) in the link target of /etc/link" in result["secrets"]
    assert not any(PASSWORD in line for line in result["secrets"])


def _sparse(size: int, segments: list[tuple[int, bytes]]) -> bytes:
    """A layer with one PAX (GNU 0.1) sparse member of announced ``size`` storing
    ``segments`` (offset, bytes)."""
    stored = b"".join(data for _, data in segments)
    info = _entry("var/log/lastlog")
    mapping = ",".join(f"{offset},{len(data)}" for offset, data in segments)
    info.pax_headers = {"GNU.sparse.major": "0", "GNU.sparse.minor": "1",
                        "GNU.sparse.name": "var/log/lastlog", "GNU.sparse.realsize": str(size),
                        "GNU.sparse.size": str(size), "GNU.sparse.map": mapping}
    return _tar([info], {"var/log/lastlog": stored})


@pytest.fixture
def bounded(monkeypatch):
    """The secrets search refuses to read more than 64 MiB of any one member."""
    real = layers._contains

    class Counted(io.RawIOBase):
        def __init__(self, stream):
            self.stream, self.read_bytes = stream, 0

        def readable(self):
            return True

        def readinto(self, target):
            data = self.stream.read(len(target))
            self.read_bytes += len(data)
            assert self.read_bytes <= 64 << 20, "read far more than the layer stores"
            target[:len(data)] = data
            return len(data)

    monkeypatch.setattr(layers, "_contains",
                        lambda stream, needles: real(io.BufferedReader(Counted(stream)), needles))


def test_a_sparse_member_is_searched_by_what_it_stores_not_its_announced_size(bounded):
    leak = f"https://ci:{PASSWORD}@pypi.corp.example/simple".encode()
    layer = _sparse(32 << 30, [(0, b"head"), ((32 << 30) - len(leak), leak)])
    secrets = _secrets(layer)
    assert not secrets.passed and "/var/log/lastlog" in secrets.detail


@pytest.mark.parametrize("segments", [
    [(100, b"late"), (0, b"early")],  # not sorted
    [((32 << 30) - 2, b"past")],  # runs past the announced size
])
def test_an_impossible_sparse_map_fails_the_layer(segments, bounded):
    archive = save_archive([_sparse(32 << 30, segments)], "oci")
    report = verify_image("t:1", POLICY, engine=FakeEngine(archive, 1), raise_on_failure=False)
    found = next(f for f in report.findings if f.check == "layers")
    assert not found.passed and "unreadable: SparseMapError" in found.detail


def _scan(*layer_entries: list[tuple[str, str]]) -> dict[str, int]:
    scan = layers._LayerScan(order=[str(i) for i in range(len(layer_entries))])
    scan.layers = {str(i): list(entries) for i, entries in enumerate(layer_entries)}
    return scan.final_paths()


@pytest.mark.parametrize("same_layer, kept", [
    ([("usr/bin/make", "file"), ("usr/bin", "opaque")], {}),
    ([("usr/bin", "opaque"), ("usr/bin/make", "file")], {}),
    ([("usr/bin/make", "file"), ("usr/bin/make", "whiteout")], {"usr/bin/gcc": 0}),
])
def test_a_layers_whiteouts_hide_only_the_layers_below(same_layer, kept):
    present = _scan([("usr/bin/gcc", "file"), ("usr/bin/make", "file")], same_layer)
    assert present == {"usr/bin/make": 1, **kept}


def test_whiteouts_apply_through_directories_and_are_undone_by_a_higher_layer():
    present = _scan([("usr/bin/gcc", "file"), ("opt/x/bin/cc", "file"), ("usr/lib/a", "file")],
                    [("usr/bin", "whiteout"), ("opt/x", "opaque")],
                    [("usr/bin/gcc", "file")])
    assert present == {"usr/bin/gcc": 2, "usr/lib/a": 0}


def test_a_path_written_twice_belongs_to_the_higher_layer():
    present = _scan([("usr/bin/gcc", "file"), ("usr/bin/make", "file")], [("usr/bin/gcc", "file")])
    assert present == {"usr/bin/gcc": 1, "usr/bin/make": 0}


def test_no_finding_shows_a_secret_or_a_control_character_in_a_path():
    pip_cache = f"root/.cache/pip/{PASSWORD}\x1b[2J\x07"
    layer = _tar([_entry(f"models/m/w\n{PASSWORD}.bin"), _entry(pip_cache)],
                 {f"models/m/w\n{PASSWORD}.bin": b"w", pip_cache: b"c"})
    archive = save_archive([layer], "oci")
    report = verify_image("t:1", POLICY, engine=FakeEngine(archive, 1), raise_on_failure=False)
    details = {f.check: f.detail for f in report.findings}
    assert "/models/m/w\\x0a***.bin" in details["weights"]
    assert "/root/.cache/pip/***\\x1b[2J\\x07" in details["tools"]
    for line in list(details.values()) + report.notes:
        assert PASSWORD not in line and "\n" not in line and "\x1b" not in line, line


@pytest.mark.parametrize("hidden", [
    _entry(f"etc/{PASSWORD}", pax_headers={"path": "etc/innocent"}),  # ustar name, overridden
    _entry("etc/l", type=tarfile.SYMTYPE, linkname=f"/{PASSWORD}",
           pax_headers={"linkpath": "/ok"}),
    _entry("etc/o", uname=PASSWORD, pax_headers={"uname": "nobody"}),
])
def test_a_secret_in_a_header_field_a_pax_record_overrides_is_found(hidden):
    secrets = _secrets(_tar([hidden]))
    assert not secrets.passed and "in a tar header or the padding of the layer" in secrets.detail


def test_a_secret_in_an_unreadable_layer_is_reported_too():
    layer = layer_tar({"etc/x": PASSWORD.encode()})
    broken = layer[:148] + b"\xff" * 8 + layer[156:]  # a bad checksum: tarfile stops reading
    archive = save_archive([broken], "oci")
    report = verify_image("t:1", POLICY, engine=FakeEngine(archive, 1), raise_on_failure=False)
    details = {f.check: f.detail for f in report.findings}
    assert "unreadable" in details["layers"] and "in the unreadable blob" in details["secrets"]
