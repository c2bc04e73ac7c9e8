"""Read which GPU architectures a CUDA library carries code for: ELF ``.nv_fatbin`` → sm/compute.

Pure and standard-library only: no CUDA toolkit (``cuobjdump``) needed, so ``verify`` can run
it inside a built image (:mod:`imgfab.payload.measure`).

A CUDA shared library keeps its device code in the ELF section ``.nv_fatbin``: a run of fat
binaries, each a 16-byte header followed by entries. The layout (little-endian), as written by
``fatbinary`` and read by NVIDIA's own tools; it is not documented by NVIDIA, so the parser
checks every size it reads and raises :class:`FatbinError` on anything that does not fit::

    fat binary header (16 bytes)         entry header (``header_size`` bytes, ≥ 32)
      u32 magic       0xBA55ED50           u16 kind         1 = PTX, 2 = ELF (SASS cubin)
      u16 version     1                    u16 (unused)
      u16 header_size 16                   u32 header_size
      u64 fat_size    bytes of entries     u64 payload_size (entry = header_size + payload_size)
                                           u32 compressed size, u32 (unused)
                                           u16 minor, u16 major   (of the format)
                                           u32 arch         e.g. 90 for sm_90 / compute_90

>>> blob = fat_binary([(2, 90), (1, 90), (2, 80)])
>>> sorted(archs_in_fatbin(blob).sass), sorted(archs_in_fatbin(blob).ptx)
(['8.0', '9.0'], ['9.0'])
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Iterable, Iterator

FATBIN_MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
_FAT_HEADER = struct.Struct("<IHHQ")
_ENTRY_HEADER = struct.Struct("<HHIQIIHHI")
KIND_PTX, KIND_ELF = 1, 2


class FatbinError(ValueError):
    """The bytes are not an ELF file / fat binary of the expected shape."""


@dataclass
class Archs:
    """Architectures found: ``sass`` (cubins, run as-is) and ``ptx`` (JIT-compiled by the driver).

    Values are compute capabilities as strings ("9.0", "10.0", "12.0"); ``blobs`` counts the fat
    binaries read, ``complete`` is False when a reader stopped early (a byte bound).
    """

    sass: set[str] = field(default_factory=set)
    ptx: set[str] = field(default_factory=set)
    blobs: int = 0
    complete: bool = True

    def update(self, other: "Archs") -> None:
        self.sass |= other.sass
        self.ptx |= other.ptx
        self.blobs += other.blobs
        self.complete = self.complete and other.complete


def capability(arch: int) -> str:
    """``90`` → ``"9.0"``, ``100`` → ``"10.0"``, ``121`` → ``"12.1"``."""
    if arch < 10:
        raise FatbinError(f"architecture number {arch} is not sm_XX")
    return f"{arch // 10}.{arch % 10}"


def sorted_archs(values: Iterable[str]) -> list[str]:
    """Compute capabilities in numeric order: 7.5 < 8.0 < 10.0 < 12.0."""
    return sorted(set(values), key=lambda v: tuple(int(p) for p in v.split(".")))


def _entries(data: bytes | memoryview, start: int, end: int) -> Iterator[tuple[int, int]]:
    """(kind, arch) of each entry between ``start`` and ``end`` of one fat binary."""
    offset = start
    while offset + _ENTRY_HEADER.size <= end:
        kind, _, header_size, payload, _, _, _, _, arch = _ENTRY_HEADER.unpack_from(data, offset)
        if header_size < _ENTRY_HEADER.size or offset + header_size + payload > end:
            raise FatbinError(f"fat binary entry at {offset} overruns its fat binary")
        if kind in (KIND_PTX, KIND_ELF):
            yield kind, arch
        offset += header_size + payload


def archs_in_fatbin(data: bytes | memoryview, *, limit: int | None = None) -> Archs:
    """Walk the fat binaries laid end to end in ``data`` (an ``.nv_fatbin`` section).

    Zero padding between fat binaries is skipped. ``limit`` stops after that many fat binaries
    (``complete`` is then False). Raises FatbinError on a malformed header.
    """
    found = Archs()
    view = memoryview(data)
    offset = 0
    while offset + _FAT_HEADER.size <= len(view):
        magic, _, header_size, fat_size = _FAT_HEADER.unpack_from(view, offset)
        if magic != FATBIN_MAGIC:
            if magic == 0:
                offset += 8  # alignment padding between fat binaries
                continue
            raise FatbinError(f"no fat binary magic at offset {offset}")
        if limit is not None and found.blobs >= limit:
            found.complete = False
            break
        end = offset + header_size + fat_size
        if end > len(view):
            raise FatbinError(f"fat binary at {offset} is cut short")
        for kind, arch in _entries(view, offset + header_size, end):
            (found.sass if kind == KIND_ELF else found.ptx).add(capability(arch))
        found.blobs += 1
        offset = end
    return found


def fatbin_section(elf: bytes | memoryview) -> memoryview | None:
    """The bytes of ``.nv_fatbin`` in a whole ELF64 little-endian file, or None if it has none."""
    view = memoryview(elf)
    if len(view) < 64 or bytes(view[:4]) != b"\x7fELF":
        raise FatbinError("not an ELF file")
    if view[4] != 2 or view[5] != 1:
        raise FatbinError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", view, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", view, 0x3A)
    if shoff == 0 or shnum == 0:
        return None
    if shoff + shnum * shentsize > len(view) or shentsize < 64:
        raise FatbinError("section header table lies outside the file")

    def header(index: int) -> tuple[int, int, int]:
        base = shoff + index * shentsize
        name, = struct.unpack_from("<I", view, base)
        offset, size = struct.unpack_from("<QQ", view, base + 0x18)
        return name, offset, size

    _, names_at, names_size = header(shstrndx)
    names = bytes(view[names_at:names_at + names_size])
    for index in range(shnum):
        name, offset, size = header(index)
        end = names.find(b"\0", name)
        if names[name:end] == b".nv_fatbin":
            if offset + size > len(view):
                raise FatbinError(".nv_fatbin lies outside the file")
            return view[offset:offset + size]
    return None


def archs_in_elf(elf: bytes | memoryview) -> Archs:
    """Architectures of a whole shared library (empty :class:`Archs` when it has no device code)."""
    section = fatbin_section(elf)
    return archs_in_fatbin(section) if section is not None else Archs()


class FatbinScanner:
    """Incremental reader for a library that arrives as a stream (a zip member being inflated).

    Feed chunks with :meth:`feed`; it finds the first fat binary by its magic (the section header
    table sits at the end of the file, so a stream cannot look it up), then reads fat binary
    after fat binary (one at a time is buffered: a few MB per compilation unit), and is ``done``
    once ``max_blobs`` (None: no bound) were read or the run of fat binaries ends (``archs.complete`` then True).
    """

    def __init__(self, max_blobs: int | None = None):  # None: until the run of fat binaries ends
        self.max_blobs = max_blobs
        self.archs = Archs(complete=False)
        self.done = False
        self._buffer = bytearray()
        self._found = False

    def feed(self, chunk: bytes) -> None:
        if self.done:
            return
        self._buffer += chunk
        buf = self._buffer
        while not self.done:
            if not self._found:
                at = buf.find(_MAGIC_BYTES)
                if at < 0:
                    del buf[:max(0, len(buf) - 3)]
                    return
                del buf[:at]
                self._found = True
            while len(buf) >= 8 and bytes(buf[:8]) == bytes(8):
                del buf[:8]  # padding between fat binaries
            if len(buf) < _FAT_HEADER.size:
                return
            magic, _, header_size, fat_size = _FAT_HEADER.unpack_from(buf, 0)
            if magic != FATBIN_MAGIC:
                self.done, self.archs.complete = True, True  # the run of fat binaries ended
                return
            end = header_size + fat_size
            if len(buf) < end:
                return
            for kind, arch in _entries(buf, header_size, end):
                (self.archs.sass if kind == KIND_ELF else self.archs.ptx).add(capability(arch))
            del buf[:end]
            self.archs.blobs += 1
            if self.max_blobs is not None and self.archs.blobs >= self.max_blobs:
                self.done = True


def fat_binary(entries: list[tuple[int, int]], payload: bytes = b"\x00" * 16) -> bytes:
    """Build a minimal fat binary with ``(kind, arch)`` entries (for tests and doctests)."""
    body = b"".join(_ENTRY_HEADER.pack(kind, 0x101, 64, len(payload), 0, 0, 1, 7, arch)
                    + bytes(64 - _ENTRY_HEADER.size) + payload for kind, arch in entries)
    return _FAT_HEADER.pack(FATBIN_MAGIC, 1, 16, len(body)) + body


__all__ = ["Archs", "FatbinError", "FatbinScanner", "archs_in_elf", "archs_in_fatbin",
           "fatbin_section", "fat_binary", "capability", "sorted_archs"]
