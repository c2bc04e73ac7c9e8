"""The .nv_fatbin parser: synthetic ELF files and a fat binary cut from torch 2.8.0's wheel."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from imgfab.in_image import fatbin
from imgfab.in_image.fatbin import (Archs, FatbinError, FatbinScanner, archs_in_elf,
                                    archs_in_fatbin, fat_binary, fatbin_section, sorted_archs)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fatbin"


def elf_with_sections(sections: dict[str, bytes]) -> bytes:
    """A minimal ELF64 little-endian shared object holding ``sections`` (plus .shstrtab)."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in sections) + b".shstrtab\0"
    body = bytearray(b"\0" * 64)
    placed = []
    for name, data in sections.items():
        placed.append((names.index(name.encode() + b"\0"), len(body), len(data)))
        body += data
        body += b"\0" * (-len(body) % 8)
    placed.append((names.index(b".shstrtab\0"), len(body), len(names)))
    body += names
    body += b"\0" * (-len(body) % 8)
    shoff = len(body)
    headers = [bytes(64)]  # SHN_UNDEF
    for name, offset, size in placed:
        headers.append(struct.pack("<IIQQQQIIQQ", name, 1, 0, 0, offset, size, 0, 0, 8, 0))
    body += b"".join(headers)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 0x3E, 1, 0, 0, shoff, 0, 64, 0, 0, 64,
                                 len(headers), len(headers) - 1)
    body[:64] = header
    return bytes(body)


def test_synthetic_elf_gives_sass_and_ptx():
    blob = fat_binary([(2, 80), (2, 90), (1, 90)]) + bytes(8) + fat_binary([(2, 100), (2, 120)])
    elf = elf_with_sections({".text": b"\x90" * 40, ".nv_fatbin": blob})
    found = archs_in_elf(elf)
    assert sorted_archs(found.sass) == ["8.0", "9.0", "10.0", "12.0"]
    assert sorted_archs(found.ptx) == ["9.0"]
    assert found.blobs == 2 and found.complete


def test_elf_without_device_code_is_empty():
    elf = elf_with_sections({".text": b"\x90" * 16})
    assert fatbin_section(elf) is None
    assert archs_in_elf(elf) == Archs()


def test_not_an_elf_and_a_truncated_fatbin_raise():
    with pytest.raises(FatbinError, match="not an ELF"):
        archs_in_elf(b"MZ" + bytes(100))
    with pytest.raises(FatbinError, match="cut short"):
        archs_in_fatbin(fat_binary([(2, 90)])[:-4])
    bad = bytearray(fat_binary([(2, 90)]))
    struct.pack_into("<Q", bad, 16 + 8, 1 << 40)  # entry payload larger than its fat binary
    with pytest.raises(FatbinError, match="overruns"):
        archs_in_fatbin(bytes(bad))


def test_limit_stops_early_and_says_so():
    blob = b"".join(fat_binary([(2, a)]) for a in (70, 80, 90))
    found = archs_in_fatbin(blob, limit=2)
    assert sorted_archs(found.sass) == ["7.0", "8.0"] and not found.complete


def test_real_fat_binary_from_torch_2_8_wheel():
    """Bytes cut from libtorch_cuda_linalg.so of torch-2.8.0 on PyPI (see fixtures/fatbin/README.md)."""
    blob = (FIXTURES / "torch-2.8.0-linalg-blob.bin").read_bytes()
    found = archs_in_fatbin(blob)
    assert sorted_archs(found.sass) == ["5.0", "6.0", "7.0", "8.0", "8.6", "9.0", "10.0", "12.0"]
    assert found.ptx == set() and found.blobs == 1


def test_scanner_on_a_deflated_stream_in_small_chunks():
    """As refresh reads a wheel member: inflated chunk by chunk, magic found mid-stream."""
    real = (FIXTURES / "torch-2.8.0-linalg-blob.bin").read_bytes()
    elf = elf_with_sections({".text": b"\x90" * 5000, ".nv_fatbin": real + fat_binary([(1, 120)])})
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    stream = compressor.compress(elf) + compressor.flush()
    inflate = zlib.decompressobj(-15)
    scanner = FatbinScanner(max_blobs=10)
    for at in range(0, len(stream), 333):
        scanner.feed(inflate.decompress(stream[at:at + 333]))
    assert scanner.done and scanner.archs.complete and scanner.archs.blobs == 2
    assert "12.0" in scanner.archs.ptx and "5.0" in scanner.archs.sass


def test_scanner_stops_at_max_blobs():
    data = b"\x01" * 100 + b"".join(fat_binary([(2, a)]) for a in (75, 80, 90))
    scanner = FatbinScanner(max_blobs=2)
    scanner.feed(data)
    assert scanner.done and not scanner.archs.complete
    assert sorted_archs(scanner.archs.sass) == ["7.5", "8.0"]


def test_capability_names():
    assert fatbin.capability(90) == "9.0" and fatbin.capability(100) == "10.0"
    assert fatbin.capability(121) == "12.1"
    with pytest.raises(FatbinError):
        fatbin.capability(5)
