"""Read one member (``RECORD``, ``METADATA``) of a remote wheel without downloading it.

A wheel is a zip: its central directory sits at the end of the file. :func:`read_members`
asks for the last 64 KiB (end-of-central-directory record, zip64 locator), then the central
directory, then only the byte range of each wanted member, with HTTP range requests. A server
that ignores ``Range`` (``python -m http.server``) answers 200 with the whole file; that is
accepted for files up to :data:`WHOLE_FILE_LIMIT` and refused above it.

Results are cached by the wheel's sha256 (content-addressed: a cached RECORD never goes stale)
under ``$XDG_CACHE_HOME/imgfab/wheels``.

Errors: :class:`~imgfab.errors.NetworkError` (exit 1) when the index does not answer or the
file is not a zip.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import requests

from imgfab.cache import cache_root
from imgfab.errors import NetworkError

TAIL_BYTES = 65536
WHOLE_FILE_LIMIT = 64 * 1024**2
_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_CENTRAL = b"PK\x01\x02"


def cache_dir() -> Path:
    """Where members read from wheels are kept (``wheels/`` under :func:`imgfab.cache.cache_root`)."""
    return cache_root() / "wheels"


class _RemoteFile:
    """Byte ranges of one URL; falls back to the whole body when ranges are ignored."""

    def __init__(self, url: str, session: requests.Session):
        self.url = url
        self.session = session
        self.whole: bytes | None = None
        self.size: int | None = None

    def _get(self, header: str) -> requests.Response:
        try:
            response = self.session.get(self.url, headers={"Range": header}, timeout=60)
        except requests.RequestException as exc:
            raise NetworkError(f"{self.url} did not answer: {type(exc).__name__}",
                               field="lock", fix="check the network or the index URL") from None
        if response.status_code not in (200, 206):
            raise NetworkError(f"{self.url} answered HTTP {response.status_code}", field="lock")
        return response

    def tail(self, count: int) -> bytes:
        response = self._get(f"bytes=-{count}")
        if response.status_code == 200:
            return self._keep_whole(response)[-count:]
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        self.size = int(total) if total.isdigit() else None
        return response.content

    def read(self, start: int, length: int) -> bytes:
        if self.whole is not None:
            return self.whole[start:start + length]
        response = self._get(f"bytes={start}-{start + length - 1}")
        if response.status_code == 200:
            return self._keep_whole(response)[start:start + length]
        return response.content

    def _keep_whole(self, response: requests.Response) -> bytes:
        if len(response.content) > WHOLE_FILE_LIMIT:
            raise NetworkError(f"{self.url} ignores HTTP range requests and is "
                               f"{len(response.content)} bytes", field="lock",
                               fix="use an index that serves byte ranges (PyPI does)")
        self.whole = response.content
        self.size = len(self.whole)
        return self.whole


def _central_directory(remote: _RemoteFile) -> bytes:
    tail = remote.tail(TAIL_BYTES)
    at = tail.rfind(_EOCD)
    if at < 0:
        raise NetworkError(f"{remote.url} is not a zip (no end-of-central-directory record)",
                           field="lock")
    size = remote.size or 0
    tail_start = size - len(tail)
    cd_size, cd_offset = struct.unpack("<II", tail[at + 12:at + 20])
    if cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF:  # zip64: the locator precedes the EOCD
        locator = tail.rfind(_ZIP64_LOCATOR, 0, at)
        (eocd64_offset,) = struct.unpack("<Q", tail[locator + 8:locator + 16])
        record = remote.read(eocd64_offset, 56)
        cd_size, cd_offset = struct.unpack("<QQ", record[40:56])
    if cd_offset >= tail_start >= 0:
        return tail[cd_offset - tail_start:cd_offset - tail_start + cd_size]
    return remote.read(cd_offset, cd_size)


def _entries(directory: bytes) -> dict[str, tuple[int, int, int, int]]:
    """name → (method, compressed size, uncompressed size, local header offset)."""
    entries = {}
    at = 0
    while directory.startswith(_CENTRAL, at):
        (method, compressed, uncompressed, name_len, extra_len, comment_len,
         offset) = struct.unpack("<10xH8xIIHHH8xI", directory[at + 0:at + 46])
        name = directory[at + 46:at + 46 + name_len].decode("utf-8", "replace")
        extra = directory[at + 46 + name_len:at + 46 + name_len + extra_len]
        if 0xFFFFFFFF in (compressed, uncompressed, offset):
            compressed, uncompressed, offset = _zip64_sizes(extra, compressed, uncompressed, offset)
        entries[name] = (method, compressed, uncompressed, offset)
        at += 46 + name_len + extra_len + comment_len
    return entries


def _zip64_sizes(extra: bytes, compressed: int, uncompressed: int, offset: int) -> tuple[int, int, int]:
    at = 0
    while at + 4 <= len(extra):
        tag, size = struct.unpack("<HH", extra[at:at + 4])
        if tag == 1:
            values = list(struct.unpack(f"<{size // 8}Q", extra[at + 4:at + 4 + size // 8 * 8]))
            if uncompressed == 0xFFFFFFFF:
                uncompressed = values.pop(0)
            if compressed == 0xFFFFFFFF:
                compressed = values.pop(0)
            if offset == 0xFFFFFFFF:
                offset = values.pop(0)
        at += 4 + size
    return compressed, uncompressed, offset


def _member(remote: _RemoteFile, entry: tuple[int, int, int, int]) -> bytes:
    method, compressed, _, offset = entry
    header = remote.read(offset, 30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    data = remote.read(offset + 30 + name_len + extra_len, compressed)
    if method == 0:
        return data
    if method == 8:
        return zlib.decompress(data, -15)
    raise NetworkError(f"{remote.url}: zip compression method {method} is not supported",
                       field="lock")


def read_members(url: str, sha256: str, suffixes: tuple[str, ...] = (".dist-info/RECORD",),
                 *, session: requests.Session | None = None) -> dict[str, str]:
    """``{suffix: text}`` for the members of the wheel at ``url`` whose name ends with each
    suffix (the wheel's own ``.dist-info``). Cached by ``sha256``."""
    cached = cache_dir() / f"{sha256}.json"
    if cached.is_file():
        data = json.loads(cached.read_text())
        if all(s in data for s in suffixes):
            return {s: data[s] for s in suffixes}
    remote = _RemoteFile(url, session or requests.Session())
    entries = _entries(_central_directory(remote))
    found: dict[str, str] = {}
    for suffix in suffixes:
        names = sorted(n for n in entries if n.endswith(suffix) and n.count("/") == suffix.count("/"))
        if not names:
            raise NetworkError(f"{url} has no {suffix}", field="lock")
        found[suffix] = _member(remote, entries[names[0]]).decode("utf-8", "replace")
    cached.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(cached.read_text()) if cached.is_file() else {}
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(previous | found, sort_keys=True))
    tmp.replace(cached)
    return found
