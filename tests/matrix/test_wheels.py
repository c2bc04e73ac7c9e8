"""Reading a wheel member's GPU code with range requests (imgfab.matrix.wheels), on a fake PyPI."""

from __future__ import annotations

import io
import json
import random
import sys
from pathlib import Path
import types
import zipfile

import pytest

from imgfab.matrix import refresh as R
from imgfab.matrix import wheels as wheel_payload
from imgfab.in_image.fatbin import fat_binary

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "in_image"))  # run alone, too
from test_fatbin import elf_with_sections  # noqa: E402


class FakeResponse:
    def __init__(self, body: bytes, status: int = 200, headers: dict | None = None):
        self.content, self.status_code, self.headers = body, status, headers or {}

    def raise_for_status(self):
        if self.status_code >= 400:
            raise OSError(f"HTTP {self.status_code}")

    def iter_content(self, size):
        for at in range(0, len(self.content), size):
            yield self.content[at:at + size]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def fake_requests(blob: bytes, log: list) -> types.ModuleType:
    module = types.ModuleType("requests")
    module.RequestException = OSError

    def head(url, **kwargs):
        return FakeResponse(b"", headers={"Content-Length": str(len(blob))})

    def get(url, headers=None, **kwargs):
        start, end = (int(x) for x in headers["Range"].split("=")[1].split("-"))
        log.append(end - start + 1)
        return FakeResponse(blob[start:end + 1], 206)

    module.head, module.get = head, get
    return module


def wheel_with(member: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr("torch-9.9.9.dist-info/METADATA", "Name: torch\nVersion: 9.9.9\n")
        wheel.writestr(member, data)
        wheel.writestr("torch/__init__.py", "")
    return buffer.getvalue()


def test_scan_member_reads_the_fatbin_through_ranges(monkeypatch):
    elf = elf_with_sections({".text": b"\x90" * 300_000,
                             ".nv_fatbin": fat_binary([(2, 80), (2, 90)]) + fat_binary([(2, 100), (1, 120)])})
    blob = wheel_with("torch/lib/libtorch_cuda.so", elf)
    ranges: list[int] = []
    monkeypatch.setitem(sys.modules, "requests", fake_requests(blob, ranges))
    found = wheel_payload.scan_member("https://files.pythonhosted.org/x/torch.whl", "torch.whl",
                                      wheel_payload.MEMBERS["torch"])
    assert (found.sass, found.ptx, found.blobs, found.complete) == (("8.0", "9.0", "10.0"), ("12.0",), 2, True)
    assert found.member == "torch/lib/libtorch_cuda.so"
    assert "every fat binary" in found.describe() and found.url.startswith("https://files.pythonhosted.org/")


def test_a_wheel_without_the_member_gives_none(monkeypatch):
    blob = wheel_with("torch/lib/libc10.so", b"\x7fELF")
    monkeypatch.setitem(sys.modules, "requests", fake_requests(blob, []))
    assert wheel_payload.scan_member("https://x/t.whl", "t.whl", wheel_payload.MEMBERS["torch"]) is None


def test_scan_member_reads_past_the_64th_fat_binary(monkeypatch):
    """torch 2.11-2.14's libtorch_cuda.so carries sm_89, sm_103 and sm_121 only past the 64th fat
    binary: a fixture of 70, the late ones carrying those, is read to its end."""
    early = [fat_binary([(2, 80), (2, 90), (1, 90)]) for _ in range(64)]
    late = [fat_binary([(2, 89)]), fat_binary([(2, 103)]), fat_binary([(2, 121)])] + \
        [fat_binary([(2, 80)]) for _ in range(3)]
    elf = elf_with_sections({".text": b"\x90" * 100_000, ".nv_fatbin": b"".join(early + late)})
    monkeypatch.setitem(sys.modules, "requests", fake_requests(wheel_with("torch/lib/libtorch_cuda.so", elf), []))
    found = wheel_payload.scan_member("https://x/torch.whl", "torch.whl", wheel_payload.MEMBERS["torch"])
    assert found.blobs == 70 and found.complete
    assert {"8.9", "10.3", "12.1"} <= set(found.sass) and found.ptx == ("9.0",)
    assert "(every fat binary)" in found.describe()


def test_a_read_cut_by_the_byte_bound_says_so(monkeypatch):
    noise = random.Random(0)  # incompressible payloads: 400 fat binaries are ~1.6 MB compressed
    elf = elf_with_sections({".text": b"\x90" * 10, ".nv_fatbin": b"".join(
        fat_binary([(2, 80)], noise.randbytes(4096)) for _ in range(400))})
    monkeypatch.setitem(sys.modules, "requests", fake_requests(wheel_with("torch/lib/libtorch_cuda.so", elf), []))
    found = wheel_payload.scan_member("https://x/t.whl", "t.whl", wheel_payload.MEMBERS["torch"],
                                      max_bytes=1024 * 1024)
    assert not found.complete and 0 < found.blobs < 400
    assert f"(the first {found.blobs} fat binaries, stopped at the 1 MiB compressed-byte bound)" \
        in found.describe()


def test_a_cache_entry_of_the_older_64_blob_scan_is_not_reused(tmp_path, monkeypatch):
    (tmp_path / "t.whl.archs.json").write_text(json.dumps(
        {"wheel": "t.whl", "member": "torch/lib/libtorch_cuda.so", "sass": ["9.0"], "ptx": [],
         "blobs": 64, "complete": False, "url": "https://x/t.whl", "read_on": "2026-11-30"}))
    fresh = wheel_payload.MemberArchs(wheel="t.whl", member="m", sass=("8.9", "9.0"), ptx=(), blobs=70,
                                      complete=True, url="https://x/t.whl", read_on="2026-12-02")
    monkeypatch.setattr(wheel_payload, "scan_member", lambda *a, **k: fresh)
    assert wheel_payload.PayloadCache(tmp_path).archs("torch", "https://x/t.whl", "t.whl") == fresh


def test_cache_answers_without_the_network(tmp_path, monkeypatch):
    cache = wheel_payload.PayloadCache(tmp_path)
    (tmp_path / f"t.whl.archs.v{wheel_payload.SCAN_VERSION}.json").write_text(json.dumps(
        {"wheel": "t.whl", "member": "torch/lib/libtorch_cuda.so", "sass": ["9.0"], "ptx": [],
         "blobs": 3, "complete": False, "url": "https://x/t.whl", "read_on": "2026-11-30"}))
    monkeypatch.setattr(wheel_payload, "scan_member", lambda *a, **k: pytest.fail("network used"))
    found = cache.archs("torch", "https://x/t.whl", "t.whl")
    assert found.sass == ("9.0",) and found.describe().endswith("(the first 3 fat binaries), read 2026-11-30")


def test_refresh_records_the_measured_architectures_and_keeps_hand_rows(tmp_path):
    from test_refresh import RECORDED, fake_fetch_json, fake_fetch_metadata

    for name in R.FILES.values():
        (tmp_path / name).write_text((RECORDED / name).read_text())
    seen = []

    def read_archs(project, url, filename):
        seen.append((project, filename))
        return wheel_payload.MemberArchs(wheel=filename, member="lib.so", sass=("9.0",), ptx=(), blobs=1,
                                         complete=True, url=url, read_on="2026-11-30")

    R.refresh(tmp_path, fetch_json=fake_fetch_json, fetch_metadata=fake_fetch_metadata,
              packages=("torch",), read_archs=read_archs)
    rows = R.read_records(tmp_path / "torch.yaml")
    assert rows["2.10.0"]["fatbin_sass"] == ["9.0"] and "read 2026-11-30" in rows["2.10.0"]["fatbin_source"]
    assert rows["2.9.1+cu130"]["index"] == "https://download.pytorch.org/whl/cu130"  # kept as it was
    assert all(project == "torch" for project, _ in seen)


def test_a_refresh_that_measured_the_same_again_writes_no_diff(tmp_path):
    """`imgfab compat refresh` on another day, or from an empty cache, reads the same wheels and
    finds the same code: the fatbin_source dates stay as they were (no 'read X -> read Y' lines)."""
    from test_refresh import RECORDED, fake_fetch_json, fake_fetch_metadata

    for name in R.FILES.values():
        (tmp_path / name).write_text((RECORDED / name).read_text())

    def reader(day: str, sass: tuple[str, ...] = ("9.0",)):
        def read_archs(project, url, filename):
            return wheel_payload.MemberArchs(wheel=filename, member="lib.so", sass=sass, ptx=(), blobs=70,
                                             complete=True, url=url, read_on=day)
        return read_archs

    def refresh(read_archs):
        return R.refresh(tmp_path, fetch_json=fake_fetch_json, fetch_metadata=fake_fetch_metadata,
                         packages=("vllm", "torch"), read_archs=read_archs)

    refresh(reader("2026-11-30"))
    before = {name: (tmp_path / name).read_bytes() for name in R.FILES.values()}
    assert refresh(reader("2026-12-01")) == []
    assert {name: (tmp_path / name).read_bytes() for name in R.FILES.values()} == before
    # a real change is still written, with the new date
    changed = refresh(reader("2026-12-02", ("8.9", "9.0")))
    rows = R.read_records(tmp_path / "torch.yaml")
    assert changed and rows["2.10.0"]["fatbin_sass"] == ["8.9", "9.0"]
    assert rows["2.10.0"]["fatbin_source"].endswith("read 2026-12-02")
