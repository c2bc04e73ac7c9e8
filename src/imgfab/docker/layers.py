"""Reading an image's layers as docker save writes them, in every layout: the legacy
<id>/layer.tar, the OCI blobs/sha256/..., gzip or zstd blobs, links between duplicate layers;
and overlay2 layer directories read in place. Exactly the layers manifest.json lists are
merged, in its order; a listed layer that could not be read is recorded (verify fails closed).

Each layer yields the catalogue paths it holds (imgfab.docker.catalogue), whiteouts, files under
the weights mount, and the names of the secret needles found in its bytes. Judging that is
imgfab.docker.verify's job.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import posixpath
import stat
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgfab.docker.catalogue import _ALL_PATTERNS


_CHUNK = 4 * 1024 * 1024


_GZIP_MAGIC = b"\x1f\x8b"


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


_MAX_SECRET_BYTES = 16 * 1024 * 1024


class _ChunkReader(io.RawIOBase):
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


def _contains(stream: Any, needles: dict[str, bytes]) -> list[str]:
    """Names of the needles found in ``stream`` (read in chunks, overlapping)."""
    if not needles:
        return []
    overlap = max(len(n) for n in needles.values()) - 1
    found: set[str] = set()
    tail = b""
    while chunk := stream.read(_CHUNK):
        window = tail + chunk
        for name, needle in needles.items():
            if name not in found and needle in window:
                found.add(name)
        tail = window[-overlap:] if overlap else b""
    return sorted(found)


@dataclass
class _LayerScan:
    weights: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # layer tar name → [(path, kind)] for the paths the tool catalogue matches, and whiteouts
    layers: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    base_count: int = 0
    # layer name → its cacheable result ({"matched", "weights", "secrets"})
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    # listed layers that were not read (fail closed), each "name (why)"
    unscanned: list[str] = field(default_factory=list)

    def merge(self, layer: str, result: dict[str, Any], secret_hits: set[str]) -> None:
        """Add one layer's (possibly cached) result."""
        self.layers[layer] = [(path, kind) for path, kind in result.get("matched", [])]
        self.weights += result.get("weights", [])
        secret_hits.update(result.get("secrets", []))

    def final_paths(self) -> dict[str, int]:
        """Catalogue-matched paths in the final filesystem (whiteouts applied) → the index
        of the layer that last wrote them."""
        present: dict[str, int] = {}
        for index, layer in enumerate(self.order or sorted(self.layers)):
            for path, kind in self.layers.get(layer, []):
                if kind == "opaque":
                    present = {p: i for p, i in present.items() if not p.startswith(path + "/")}
                elif kind == "whiteout":
                    present = {p: i for p, i in present.items()
                               if p != path and not p.startswith(path + "/")}
                else:
                    present[path] = index
        return present



def local_layer_dirs(info: dict[str, Any], layers: list[str]) -> list[Path] | None:
    """The overlay2 ``diff`` directory of every layer (bottom first), when this process can read
    the engine's storage (a local engine); None otherwise. ``LowerDir`` lists the lower layers
    top first and ``UpperDir`` is the top layer, so the reversed list lines up with
    ``RootFS.Layers``."""
    driver = info.get("GraphDriver") or {}
    if driver.get("Name") != "overlay2":
        return None
    data = driver.get("Data") or {}
    top_down = [data.get("UpperDir") or ""] + [d for d in (data.get("LowerDir") or "").split(":") if d]
    if len(top_down) != len(layers) or not all(os.path.isdir(d) and os.access(d, os.R_OK) for d in top_down):
        return None
    return [Path(d) for d in reversed(top_down)]


def _scan_directory(root: Path, mount: str, policy: Any) -> dict[str, Any]:
    """One overlay2 layer directory → the same result a layer tar gives: whiteouts are
    character devices 0/0, opaque directories carry the ``trusted.overlay.opaque`` xattr."""
    matched: list[list[str]] = []
    weights: list[str] = []
    secrets: list[str] = []
    needles = policy.needles()
    for directory, subdirs, files in os.walk(root):
        relative_dir = os.path.relpath(directory, root)
        relative_dir = "" if relative_dir == "." else relative_dir
        try:
            if relative_dir and os.getxattr(directory, "trusted.overlay.opaque") == b"y":
                matched.append([relative_dir, "opaque"])
        except OSError:
            pass
        for name in sorted(subdirs) + sorted(files):
            path = posixpath.join(relative_dir, name) if relative_dir else name
            full = os.path.join(directory, name)
            info = os.lstat(full)
            if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
                matched.append([path, "whiteout"])
                continue
            if mount and path.startswith(mount + "/"):
                weights.append("/" + path)
            if _ALL_PATTERNS.fullmatch(path):
                matched.append([path, "file"])
            if stat.S_ISREG(info.st_mode) and needles:
                with open(full, "rb") as handle:
                    secrets += [f"{hit} in /{path}" for hit in _contains(handle, needles)]
    return {"matched": matched, "weights": weights, "secrets": secrets}


def _scan_layers(chunks: Iterable[bytes], policy: Any) -> _LayerScan:
    """One pass over a ``docker save`` stream, in any layout it is written in.

    Every regular member is classified by its content, not its name: a tar (possibly gzip or
    zstd compressed) is scanned as a layer, anything else (configs, index files) is searched for
    secrets. Symlinks and hard links (legacy saves link duplicate layers) are followed. Then
    exactly the layers ``manifest.json`` lists are merged in its order; a listed layer that was
    not read is recorded in ``unscanned`` (the ``layers`` finding fails).
    """
    scan = _LayerScan()
    mount = policy.mount
    needles = policy.needles()
    secret_hits: set[str] = set()
    aliases: dict[str, str] = {}
    unreadable: dict[str, str] = {}
    manifest: Any = None
    with tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks), _CHUNK),
                      mode="r|") as outer:
        for member in outer:
            name = posixpath.normpath(member.name.removeprefix("./"))
            if member.issym():
                aliases[name] = posixpath.normpath(
                    posixpath.join(posixpath.dirname(name), member.linkname))
                continue
            if member.islnk():
                aliases[name] = posixpath.normpath(member.linkname.removeprefix("./"))
                continue
            if not member.isfile():
                continue
            stream = outer.extractfile(member)
            if stream is None:
                continue
            if name == "manifest.json":
                data = stream.read(_MAX_SECRET_BYTES)
                try:
                    manifest = json.loads(data)
                except ValueError:
                    manifest = None
                for hit in _contains(io.BytesIO(data), needles):
                    secret_hits.add(f"{hit} in the image config ({name})")
                continue
            try:
                kind, reader = _open_blob(stream)
                if kind == "tar":
                    scan.results[name] = _scan_layer(reader, mount, needles)
                elif kind == "empty":
                    scan.results[name] = {"matched": [], "weights": [], "secrets": []}
                elif kind == "other":
                    for hit in _contains(reader, needles):
                        secret_hits.add(f"{hit} in the image config ({name})")
                else:
                    unreadable[name] = kind
            except (tarfile.TarError, OSError, EOFError, zlib.error, ValueError) as exc:
                unreadable[name] = f"unreadable: {exc.__class__.__name__}"
    entries = manifest if isinstance(manifest, list) else []
    if len(entries) != 1 or not isinstance(entries[0], dict):
        scan.unscanned.append("manifest.json (missing, or not exactly one image)")
        listed: list[str] = []
    else:
        listed = [posixpath.normpath(str(n).removeprefix("./")) for n in
                  entries[0].get("Layers") or []]
    for name in listed:
        target = name
        for _ in range(16):  # links of links, bounded
            if target not in aliases:
                break
            target = aliases[target]
        result = scan.results.get(target)
        if result is None:
            why = unreadable.get(target, "not in the archive")
            scan.unscanned.append(f"{name} ({why})")
            continue
        scan.order.append(name)
        scan.results[name] = result
        scan.layers[name] = [(p, k) for p, k in result["matched"]]
        scan.weights += result["weights"]
    for result in scan.results.values():  # a secret in any blob is a leak, listed or not
        secret_hits.update(result["secrets"])
    scan.secrets = sorted(secret_hits)
    return scan


def _read_up_to(stream: Any, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _peek(stream: Any, size: int = 1024) -> tuple[bytes, Any]:
    """The first ``size`` bytes of ``stream`` and a reader that still yields all of it."""
    head = _read_up_to(stream, size)

    def chunks() -> Iterator[bytes]:
        if head:
            yield head
        while chunk := stream.read(_CHUNK):
            yield chunk
    return head, io.BufferedReader(_ChunkReader(chunks()), _CHUNK)


def _open_blob(stream: Any) -> tuple[str, Any]:
    """Classify one archive member by content: ``("tar", reader)`` for a layer (decompressed
    when gzip or zstd), ``("empty", None)`` for an all-zero empty tar, ``("other", reader)``
    for anything else; ``("<why>", None)`` when it cannot be decompressed."""
    head, reader = _peek(stream)
    if head.startswith(_GZIP_MAGIC):
        head, reader = _peek(gzip.GzipFile(fileobj=reader, mode="rb"))
    elif head.startswith(_ZSTD_MAGIC):
        try:
            import zstandard  # noqa: PLC0415
        except ImportError:
            return "zstd blob, and the zstandard module is not installed", None
        decompressor = zstandard.ZstdDecompressor()
        head, reader = _peek(decompressor.stream_reader(reader, read_across_frames=True))
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar", reader
    if len(head) >= 512 and not head.strip(b"\0"):
        rest = reader.read(_CHUNK)
        return ("empty", None) if not rest.strip(b"\0") else ("tar", reader)
    return "other", reader


def _scan_layer(stream: Any, mount: str, needles: dict[str, bytes]) -> dict[str, Any]:
    """One layer tar → ``{"matched": [[path, kind]], "weights": [...], "secrets": [...]}``.

    Whiteout-named entries record the deletion, and a whiteout that carries bytes is still
    searched (its bytes are in the pushed layer even though the engine drops the file).
    """
    matched: list[list[str]] = []
    weights: list[str] = []
    secrets: set[str] = set()
    with tarfile.open(fileobj=stream, mode="r|") as inner:
        for entry in inner:
            path = posixpath.normpath(entry.name.removeprefix("./").lstrip("/"))
            if path == ".":
                continue
            base = posixpath.basename(path)
            directory = posixpath.dirname(path)
            whiteout = base.startswith(".wh.")
            if base == ".wh..wh..opq":
                matched.append([directory, "opaque"])
            elif whiteout:
                matched.append([posixpath.join(directory, base[4:]), "whiteout"])
            if whiteout and not (entry.isfile() and entry.size > 0):
                continue
            if mount and path.startswith(mount + "/"):
                weights.append("/" + path)
            if not whiteout and _ALL_PATTERNS.fullmatch(path):
                matched.append([path, "file"])
            if entry.isfile() and needles:
                content = inner.extractfile(entry)
                if content is not None:
                    for name in _contains(content, needles):
                        secrets.add(f"{name} in /{path}")
    return {"matched": matched, "weights": weights, "secrets": sorted(secrets)}
