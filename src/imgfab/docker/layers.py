"""Reading an image's layers as docker save writes them, in every layout: the legacy
<id>/layer.tar, the OCI blobs/sha256/..., gzip or zstd blobs, links between duplicate layers;
and overlay2 layer directories read in place. Exactly the layers manifest.json lists are
merged, in its order; a listed layer that could not be read is recorded (verify fails closed).

Each layer yields the catalogue paths it holds (imgfab.docker.catalogue), whiteouts, files under
the weights mount, and the names of the secret needles found in its bytes. Judging that is
imgfab.docker.verify's job.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import re
import stat
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgfab.docker.blobs import CHUNK as _CHUNK
from imgfab.docker.blobs import ChunkReader, open_blob, read_up_to
from imgfab.docker.catalogue import _ALL_PATTERNS


_MAX_SECRET_BYTES = 16 * 1024 * 1024


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
    # sha256 of each ordered layer's uncompressed bytes as read (the verified diff ids)
    diff_ids: list[str] = field(default_factory=list)
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
        of the layer that last wrote them.

        Linear in the entries (times the path depth): the layers are walked top first, and a
        path is present unless a higher layer wrote it already, whited it (or a directory above
        it) out, or made a directory above it opaque. A layer's whiteouts hide only the layers
        below it."""
        present: dict[str, int] = {}
        gone: set[str] = set()  # whited out: the path and everything under it
        emptied: set[str] = set()  # opaque: everything under the directory
        order = self.order or sorted(self.layers)
        for index in range(len(order) - 1, -1, -1):
            entries = self.layers.get(order[index], [])
            for path, kind in entries:
                if kind in ("opaque", "whiteout") or path in present:
                    continue
                if path in gone or any(parent in gone or parent in emptied
                                       for parent in _parents(path)):
                    continue
                present[path] = index
            for path, kind in entries:
                if kind == "whiteout":
                    gone.add(path)
                elif kind == "opaque":
                    emptied.add(path)
        return present


def _parents(path: str) -> Iterator[str]:
    """``a/b/c`` → ``a/b``, ``a``."""
    while "/" in path:
        path = path.rsplit("/", 1)[0]
        yield path


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


# Where a local engine's containerd keeps its content (compressed layer blobs, manifests):
# dockerd's own containerd under its data root, or a system containerd.
_CONTENT_STORES = ("{root}/containerd/daemon/io.containerd.content.v1.content/blobs/sha256",
                   "/var/lib/containerd/io.containerd.content.v1.content/blobs/sha256")
_BLOB_NAME = re.compile(r"^sha256:([0-9a-f]{64})$")
_MAX_MANIFEST_BYTES = 4 << 20


def local_layer_blobs(info: dict[str, Any], layers: list[str], docker_root: str) -> list[Path] | None:
    """The compressed blob of every layer (bottom first) in a local containerd image store's
    content store, when this process can read it; None otherwise. The image ID (``info["Id"]``)
    is its manifest's digest there, or an index's: then the manifest for the image's own
    platform. The manifest must list as many layers as ``RootFS.Layers``; each blob's
    uncompressed bytes must then hash to the diff id at its place (the caller checks)."""
    image_id = str(info.get("Id") or "")
    if not _BLOB_NAME.match(image_id) or not docker_root:
        return None
    for pattern in _CONTENT_STORES:
        store = Path(pattern.format(root=docker_root))
        if not store.is_dir() or not os.access(store, os.R_OK | os.X_OK):
            continue
        manifest = _read_json(store, image_id)
        if manifest and "manifests" in manifest:  # an index: the image's own platform
            wanted = (info.get("Os") or "linux", info.get("Architecture") or "amd64")
            chosen = next((m for m in manifest["manifests"] if isinstance(m, dict)
                           and (m.get("platform") or {}).get("os") == wanted[0]
                           and (m.get("platform") or {}).get("architecture") == wanted[1]), None)
            manifest = _read_json(store, str((chosen or {}).get("digest") or ""))
        listed = (manifest or {}).get("layers")
        if not isinstance(listed, list) or len(listed) != len(layers):
            return None
        blobs = []
        for layer in listed:
            match = _BLOB_NAME.match(str((layer or {}).get("digest") or "") if isinstance(layer, dict) else "")
            blob = store / match.group(1) if match else None
            if blob is None or not blob.is_file() or not os.access(blob, os.R_OK):
                return None
            blobs.append(blob)
        return blobs
    return None


def _read_json(store: Path, digest: str) -> dict[str, Any] | None:
    match = _BLOB_NAME.match(digest)
    if not match:
        return None
    try:
        with open(store / match.group(1), "rb") as handle:
            data = handle.read(_MAX_MANIFEST_BYTES + 1)
        value = json.loads(data) if len(data) <= _MAX_MANIFEST_BYTES else None
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def scan_blob(path: Path, mount: str, policy: Any) -> tuple[dict[str, Any] | None, str, str]:
    """One compressed layer blob of the content store → ``(result, diff id, why)``: the same
    per-layer scan a layer tar of ``docker save`` gets (``_scan_layer``), the uncompressed bytes
    hashed as they are read; ``result`` is None (and ``why`` says why) when it cannot be read
    whole."""
    needles = policy.needles()
    try:
        with open(path, "rb") as stream:
            kind, reader, digest = open_blob(stream, needles)
            if kind == "tar":
                result = _scan_layer(reader, mount, needles)
            elif kind == "empty":
                result = {"matched": [], "weights": [], "secrets": []}
            else:
                return None, "", kind if reader is None else "not a layer tar"
            assert digest is not None
            diff_id = digest.finish()
            if digest.trailing:
                return None, diff_id, "data after the end-of-archive blocks"
    except (tarfile.TarError, OSError, EOFError, zlib.error, ValueError) as exc:
        return None, "", f"unreadable: {exc.__class__.__name__}"
    result["secrets"] = with_unlocated(result["secrets"], digest.found)
    return result, diff_id, ""


def with_unlocated(located: list[str], found: Iterable[str]) -> list[str]:
    """A layer's secret lines, plus one for each secret its bytes hold that no entry accounts
    for (a tar header, the padding)."""
    return sorted(set(located) | {f"{hit} in a tar header or the padding of the layer"
                                  for hit in found
                                  if not any(line.startswith(hit + " in ") for line in located)})


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
            for hit in sorted(h for h, needle in needles.items() if needle in os.fsencode(path)):
                secrets.append(f"{hit} in the name of /{mask(path, needles)}")
            if stat.S_ISLNK(info.st_mode):
                target = os.fsencode(os.readlink(full))
                secrets += [f"{hit} in the link target of /{mask(path, needles)}"
                            for hit, needle in sorted(needles.items()) if needle in target]
            if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
                matched.append([path, "whiteout"])
                continue
            if mount and path.startswith(mount + "/"):
                weights.append("/" + path)
            if _ALL_PATTERNS.fullmatch(path):
                matched.append([path, "file"])
            if stat.S_ISREG(info.st_mode) and needles:
                with open(full, "rb") as handle:
                    secrets += [f"{hit} in /{mask(path, needles)}"
                                for hit in _contains(handle, needles)]
    return {"matched": matched, "weights": weights, "secrets": secrets}


def _scan_layers(chunks: Iterable[bytes], policy: Any) -> _LayerScan:
    """One pass over a ``docker save`` stream, in any layout it is written in.

    Every regular member is classified by its content, not its name: a tar (possibly gzip or
    zstd compressed) is scanned as a layer, anything else (configs, index files) is searched for
    secrets. Symlinks and hard links (legacy saves link duplicate layers) are followed. Every
    member's uncompressed bytes are hashed as they are read. Then exactly the layers
    ``manifest.json`` lists are merged in its order, each with the hash it was read as
    (``diff_ids``); a listed layer that was not read, or whose hash is not the diff id the
    image config lists at its place, is recorded in ``unscanned`` (the ``layers`` finding fails).
    """
    scan = _LayerScan()
    mount = policy.mount
    needles = policy.needles()
    secret_hits: set[str] = set()
    aliases: dict[str, str] = {}
    unreadable: dict[str, str] = {}
    digests: dict[str, str] = {}  # member → sha256 of its uncompressed bytes, as read
    configs: dict[str, list[str]] = {}  # member → the rootfs.diff_ids it declares
    manifest: Any = None
    try:
        with tarfile.open(fileobj=io.BufferedReader(ChunkReader(chunks), _CHUNK),
                          mode="r|") as outer:
            for member in outer:
                name = posixpath.normpath(member.name.removeprefix("./"))
                for hit, where in header_hits(member, needles):
                    secret_hits.add(f"{hit} in the {where} of {mask(name, needles)} (docker save)")
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
                digest = None
                try:
                    kind, reader, digest = open_blob(stream, needles)
                    if kind == "tar":
                        scan.results[name] = _scan_layer(reader, mount, needles)
                    elif kind == "empty":
                        scan.results[name] = {"matched": [], "weights": [], "secrets": []}
                    elif kind == "other":
                        data = read_up_to(reader, _MAX_SECRET_BYTES + 1)
                        if len(data) <= _MAX_SECRET_BYTES and (declared := _diff_ids_of(data)):
                            configs[name] = declared
                        rest = io.BufferedReader(ChunkReader(_chain(data, reader)), _CHUNK)
                        for hit in _contains(rest, needles):
                            secret_hits.add(f"{hit} in the image config ({name})")
                    else:
                        unreadable[name] = kind
                        continue
                    assert digest is not None
                    digests[name] = digest.finish()
                    if name in scan.results:  # bytes no entry accounts for: headers, padding
                        scan.results[name]["secrets"] = with_unlocated(scan.results[name]["secrets"],
                                                                       digest.found)
                    if digest.trailing and scan.results.pop(name, None) is not None:
                        unreadable[name] = "data after the end-of-archive blocks"
                except (tarfile.TarError, OSError, EOFError, zlib.error, ValueError) as exc:
                    scan.results.pop(name, None)
                    unreadable[name] = f"unreadable: {exc.__class__.__name__}"
                    secret_hits.update(f"{hit} in the unreadable blob {mask(name, needles)}"
                                       for hit in (digest.found if digest else ()))
    except (tarfile.TarError, OSError, EOFError, zlib.error, ValueError) as exc:
        # a damaged or cut-short stream: what was read stands, the rest is unscanned
        scan.unscanned.append(f"the docker save stream (unreadable: {exc.__class__.__name__})")
    entries = manifest if isinstance(manifest, list) else []
    declared: list[str] | None = None
    if len(entries) != 1 or not isinstance(entries[0], dict):
        scan.unscanned.append("manifest.json (missing, or not exactly one image)")
        listed: list[str] = []
    else:
        listed = [posixpath.normpath(str(n).removeprefix("./")) for n in
                  entries[0].get("Layers") or []]
        config = posixpath.normpath(str(entries[0].get("Config") or "").removeprefix("./"))
        declared = configs.get(_follow(config, aliases))
        if declared is None:
            scan.unscanned.append(f"{config} (the image config: not in the archive, or it "
                                  "lists no rootfs.diff_ids)")
        elif len(declared) != len(listed):
            scan.unscanned.append(f"{config} (the image config lists {len(declared)} diff ids, "
                                  f"manifest.json {len(listed)} layers)")
    for index, name in enumerate(listed):
        target = _follow(name, aliases)
        result = scan.results.get(target)
        if result is None:
            why = unreadable.get(target, "not in the archive")
            scan.unscanned.append(f"{name} ({why})")
            continue
        digest = digests[target]
        claimed = declared[index] if declared and index < len(declared) else None
        if declared and claimed != digest:
            scan.unscanned.append(f"{name} (its bytes hash to {digest[:19]}…, the image config "
                                  f"lists {str(claimed)[:19]}… at layer {index + 1})")
        scan.order.append(name)
        scan.diff_ids.append(digest)
        scan.results[name] = result
        scan.layers[name] = [(p, k) for p, k in result["matched"]]
        scan.weights += result["weights"]
    for result in scan.results.values():  # a secret in any blob is a leak, listed or not
        secret_hits.update(result["secrets"])
    scan.secrets = sorted(secret_hits)
    return scan


def _follow(name: str, aliases: dict[str, str]) -> str:
    for _ in range(16):  # links of links, bounded
        if name not in aliases:
            break
        name = aliases[name]
    return name


def _chain(first: bytes, stream: Any) -> Iterator[bytes]:
    yield first
    while chunk := stream.read(_CHUNK):
        yield chunk


def _diff_ids_of(data: bytes) -> list[str] | None:
    """The ``rootfs.diff_ids`` an image config declares, when ``data`` is one."""
    try:
        config = json.loads(data)
    except ValueError:
        return None
    rootfs = config.get("rootfs") if isinstance(config, dict) else None
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if isinstance(diff_ids, list) and all(isinstance(d, str) for d in diff_ids):
        return list(diff_ids)
    return None


def _text_bytes(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def header_hits(entry: tarfile.TarInfo, needles: dict[str, bytes]) -> list[tuple[str, str]]:
    """``(needle name, where)`` for each needle in an entry's header: its name, its link
    target, its owner names and each PAX record (key and value); these bytes are in the layer
    as much as a file's contents are."""
    fields = [("name", entry.name), ("link target", entry.linkname),
              ("owner", entry.uname), ("group", entry.gname)]
    fields += [("PAX record", f"{key}={value}") for key, value in entry.pax_headers.items()]
    hits: set[tuple[str, str]] = set()
    for where, text in fields:
        data = _text_bytes(text or "")
        hits.update((name, where) for name, needle in needles.items() if needle in data)
    return sorted(hits)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def mask(path: str, needles: dict[str, bytes]) -> str:
    """``path`` as a finding may show it: every needle in it replaced by ``***`` (a finding
    never shows a secret), control characters escaped (a finding is one printable line)."""
    data = _text_bytes(path)
    for needle in sorted(needles.values(), key=len, reverse=True):
        data = data.replace(needle, b"***")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", data.decode("utf-8", "replace"))


class SparseMapError(ValueError):
    """A sparse member's map is not sorted, or runs past the size it announces."""


def _stored_bytes(inner: tarfile.TarFile, entry: tarfile.TarInfo) -> Any:
    """A reader of what an entry stores in the layer. A sparse entry yields only its data
    segments (one zero byte stands for each hole): its announced size is not read as zeros,
    so the work is bounded by the layer's real size. A sparse map that is not sorted or runs
    past the announced size is refused (:class:`SparseMapError`: the layer is unscanned)."""
    content = inner.extractfile(entry)
    if content is None or not entry.issparse():
        return content
    segments = list(entry.sparse or [])
    end = 0
    for offset, size in segments:
        if offset < end or size < 0 or offset + size > entry.size:
            raise SparseMapError(f"sparse map of {entry.name!r} is not sorted or exceeds its size")
        end = offset + size
    raw = content.raw  # seek only sets the position; reads move forward through the stream

    def chunks() -> Iterator[bytes]:
        position = 0
        for offset, size in segments:
            if offset > position:
                yield b"\0"
            raw.seek(offset)
            left = size
            while left > 0:
                chunk = raw.read(min(_CHUNK, left))
                if not chunk:
                    raise ValueError(f"sparse data of {entry.name!r} is truncated")
                left -= len(chunk)
                yield chunk
            position = offset + size
    return io.BufferedReader(ChunkReader(chunks()), _CHUNK)


def _scan_layer(stream: Any, mount: str, needles: dict[str, bytes]) -> dict[str, Any]:
    """One layer tar → ``{"matched": [[path, kind]], "weights": [...], "secrets": [...]}``.

    Whiteout-named entries record the deletion, and a whiteout that carries bytes is still
    searched (its bytes are in the pushed layer even though the engine drops the file).
    Every entry's header (name, link target, PAX records) is searched as well as its bytes.
    """
    matched: list[list[str]] = []
    weights: list[str] = []
    secrets: set[str] = set()
    with tarfile.open(fileobj=stream, mode="r|") as inner:
        for entry in inner:
            path = posixpath.normpath(entry.name.removeprefix("./").lstrip("/"))
            for hit, where in header_hits(entry, needles):
                secrets.add(f"{hit} in the {where} of /{mask(path, needles)}")
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
                content = _stored_bytes(inner, entry)
                if content is not None:
                    for name in _contains(content, needles):
                        secrets.add(f"{name} in /{mask(path, needles)}")
    return {"matched": matched, "weights": weights, "secrets": sorted(secrets)}
