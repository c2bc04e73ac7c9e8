"""Decoding the members of a ``docker save`` stream: chunked readers, gzip/zstd detection,
and the sha256 of each member's uncompressed bytes as they are read (a layer's diff id).

:func:`open_blob` classifies one member by its content and returns a reader plus a
:class:`Digest` that sees every uncompressed byte the reader yields; :meth:`Digest.finish`
reads what the consumer left (a tar's end blocks) and returns ``sha256:<hex>``. A layer is
then judged by the bytes that were hashed, never by the name it is listed under.
"""

from __future__ import annotations

import gzip
import hashlib
import io
from collections.abc import Iterable, Iterator
from typing import Any

CHUNK = 4 * 1024 * 1024

_GZIP_MAGIC = b"\x1f\x8b"

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (for tarfile's stream mode)."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks: Iterator[bytes] = iter(chunks)
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


class Digest(io.RawIOBase):
    """A reader over ``stream`` that hashes (sha256) every byte passed through it, and
    searches those bytes for ``needles`` (name → bytes): ``found`` names the needles seen
    anywhere in the stream (headers and padding included, not only what a tar reader yields)."""

    def __init__(self, stream: Any, needles: dict[str, bytes] | None = None):
        self._stream = stream
        self._hash = hashlib.sha256()
        self._needles = dict(needles or {})
        self._overlap = max((len(n) for n in self._needles.values()), default=1) - 1
        self._tail = b""
        self.found: set[str] = set()
        self.size = 0
        self.reader: Any = None  # the reader handed out on top of this one (drained by finish)
        self.trailing = False  # finish() found non-zero bytes the consumer had left unread

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        data = self._stream.read(len(target))
        if not data:
            return 0
        size = len(data)
        target[:size] = data
        self._hash.update(data)
        self.size += size
        if self._needles:
            window = self._tail + data
            self.found.update(name for name, needle in self._needles.items() if needle in window)
            self._tail = window[-self._overlap:] if self._overlap else b""
        return size

    def finish(self) -> str:
        """Read whatever the consumer left unread (setting ``trailing`` when that is more than
        zero padding), then ``sha256:<hex>`` of all the bytes."""
        source = self.reader if self.reader is not None else self
        while chunk := source.read(CHUNK):
            self.trailing = self.trailing or bool(chunk.strip(b"\0"))
        return "sha256:" + self._hash.hexdigest()


class _ZstdReader:
    """A zstd stream reader whose corruption errors are ValueError, as gzip's are OSError."""

    def __init__(self, stream: Any, error: type[Exception]):
        self._stream = stream
        self._error = error

    def read(self, size: int = -1) -> bytes:
        try:
            return self._stream.read(size)
        except self._error as exc:
            raise ValueError(f"zstd: {exc}") from None


def read_up_to(stream: Any, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def peek(stream: Any, size: int = 1024) -> tuple[bytes, Any]:
    """The first ``size`` bytes of ``stream`` and a reader that still yields all of it."""
    head = read_up_to(stream, size)

    def chunks() -> Iterator[bytes]:
        if head:
            yield head
        while chunk := stream.read(CHUNK):
            yield chunk
    return head, io.BufferedReader(ChunkReader(chunks()), CHUNK)


def open_blob(stream: Any, needles: dict[str, bytes] | None = None
              ) -> tuple[str, Any, Digest | None]:
    """Classify one archive member by content: ``("tar", reader, digest)`` for a layer
    (decompressed when gzip or zstd), ``("empty", reader, digest)`` for an all-zero empty tar,
    ``("other", reader, digest)`` for anything else; ``("<why>", None, None)`` when it cannot
    be decompressed. ``digest`` hashes the uncompressed bytes the reader yields, and searches
    them for ``needles``."""
    head, reader = peek(stream)
    if head.startswith(_GZIP_MAGIC):
        reader = gzip.GzipFile(fileobj=reader, mode="rb")
    elif head.startswith(_ZSTD_MAGIC):
        try:
            import zstandard  # noqa: PLC0415
        except ImportError:
            return "zstd blob, and the zstandard module is not installed", None, None
        decompressor = zstandard.ZstdDecompressor()
        reader = _ZstdReader(decompressor.stream_reader(reader, read_across_frames=True),
                             zstandard.ZstdError)
    digest = Digest(reader, needles)
    head, reader = peek(digest)
    digest.reader = reader
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar", reader, digest
    if len(head) >= 512 and not head.strip(b"\0"):
        # An empty tar is all zeros; bytes after its end blocks are hidden from every reader.
        while chunk := reader.read(CHUNK):
            if chunk.strip(b"\0"):
                return "data after the end-of-archive blocks", None, None
        return "empty", reader, digest
    return "other", reader, digest

