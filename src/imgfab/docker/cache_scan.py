"""The secrets scan of an exported build cache (issue 37).

A ``mode=max`` cache holds the layers of every stage, the builder's included, which the image
itself never ships and ``verify`` never reads. A build secret (the CA bundle, the pip.conf with
its index credentials) reaches steps only as a BuildKit secret mount, never a layer; this scan
proves that for the cache too, with the needles and the per-layer scan ``verify`` uses
(:func:`imgfab.docker.verify.secret_needles`, :func:`imgfab.docker.layers.scan_blob`):

- ``type=registry``: the cache's index is read from the registry (BuildKit's cache index lists
  its layer blobs beside the cache config; with ``image-manifest=true`` an OCI manifest lists
  them), then each layer blob is streamed to a private temporary file, its sha256 checked
  against its digest, and scanned;
- ``type=local``: every blob of the OCI layout under ``dest`` is scanned where it lies;
- ``type=inline``: the cache is in the image's config, which verify already read.

A finding fails the build after the export (the cache is already written: the fix says to delete
that tag). The secret itself is never named, only which secret and where.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgfab.errors import RegistryError, ValidationFailed

# Descriptor media types that are layer blobs (OCI and Docker, gzip / zstd / uncompressed).
LAYER_TYPES = ("application/vnd.oci.image.layer.v1.tar", "application/vnd.oci.image.layer.v1.tar+gzip",
               "application/vnd.oci.image.layer.v1.tar+zstd",
               "application/vnd.docker.image.rootfs.diff.tar.gzip")
MAX_LAYER = 64 << 30  # one layer blob read from a registry: at most 64 GiB
_CHUNK = 1 << 20


@dataclass
class CacheScan:
    """What the scan of one exported cache read and found."""

    spec: str
    layers: int = 0
    bytes: int = 0
    secrets: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "layers": self.layers, "bytes": self.bytes,
                "secrets": list(self.secrets)}


def scan_cache(spec: str, policy: Any, credentials: Any = None) -> CacheScan:
    """Scan the cache ``spec`` (a ``--cache-to`` spec as buildx got it) exported; raises
    :class:`ValidationFailed` naming each secret found and :class:`RegistryError` when the
    registry cannot be read."""
    from imgfab.render.cachespec import spec_settings  # noqa: PLC0415

    settings = spec_settings(spec)
    scan = CacheScan(spec=spec)
    if settings.get("type") == "registry":
        _scan_registry(settings["ref"], policy, credentials, scan)
    elif settings.get("type") == "local":
        blobs = Path(settings["dest"]) / "blobs" / "sha256"
        for blob in sorted(blobs.iterdir()) if blobs.is_dir() else []:
            _scan_file(blob, f"sha256:{blob.name}", policy, scan)
    if scan.secrets:
        where = settings.get("ref") or settings.get("dest") or spec
        raise ValidationFailed(f"the build cache {where} holds a build secret: "
                               f"{'; '.join(scan.secrets[:5])}",
                               field="--cache-to",
                               fix="delete that cache from its registry or directory, and find the "
                                   "step that wrote the secret into a layer")
    return scan


def _scan_file(path: Path, digest: str, policy: Any, scan: CacheScan) -> None:
    from imgfab.docker.layers import scan_blob  # noqa: PLC0415

    result, _, why = scan_blob(path, policy.mount, policy)
    if result is None:  # JSON (the cache config, a manifest) or not a layer: nothing to scan
        return
    scan.layers += 1
    scan.bytes += path.stat().st_size
    scan.secrets += [f"{hit} (layer {digest[:19]})" for hit in result["secrets"]]


def _scan_registry(ref: str, policy: Any, credentials: Any, scan: CacheScan) -> None:
    from imgfab.docker.credentials import Credentials  # noqa: PLC0415
    from imgfab.docker.registry import _checked_digest, _manifest  # noqa: PLC0415
    from imgfab.docker.registry_http import ImageRef, _client_for, _pull_scope  # noqa: PLC0415

    parsed = ImageRef.parse(ref)
    credentials = credentials or Credentials.load(parsed.host)
    client = _client_for(parsed, credentials)
    _, index = _manifest(client, parsed, parsed.reference)
    descriptors = [d for d in index.get("manifests", []) + index.get("layers", [])
                   if isinstance(d, dict)]
    for entry in [d for d in descriptors if d.get("mediaType") not in LAYER_TYPES]:
        if entry.get("mediaType") == "application/vnd.oci.image.manifest.v1+json":
            _, manifest = _manifest(client, parsed, _checked_digest(entry.get("digest"), ref))
            descriptors += [d for d in manifest.get("layers", []) if isinstance(d, dict)]
    layers = sorted({_checked_digest(d.get("digest"), ref) for d in descriptors
                     if d.get("mediaType") in LAYER_TYPES})
    with tempfile.TemporaryDirectory(prefix="imgfab-cache-scan-") as scratch:
        for digest in layers:
            path = Path(scratch) / digest[7:]
            _fetch_blob(client, parsed, _pull_scope(parsed), digest, path)
            _scan_file(path, digest, policy, scan)
            path.unlink()


def _fetch_blob(client: Any, ref: Any, scope: str, digest: str, path: Path) -> None:
    """Stream blob ``digest`` of ``ref``'s repository into ``path`` (mode 0600), at most
    :data:`MAX_LAYER` bytes, its sha256 checked."""
    # The HEAD answers the registry's challenge for this scope (the client keeps the header);
    # the GET streams with it. A redirect to another host drops it (requests strips it there).
    client.request("HEAD", f"/v2/{ref.repository}/blobs/{digest}", scope=scope)
    url = client.resolve(f"/v2/{ref.repository}/blobs/{digest}")
    authorization = client._authorization.get(scope)
    response = client.session.get(url, stream=True, timeout=(5, 60),
                                  headers={"Authorization": authorization} if authorization else {})
    if response.status_code != 200:
        response.close()
        raise RegistryError(f"registry {client.host} answered {response.status_code} to the cache "
                            f"blob {digest[:19]}", field="--cache-to",
                            fix="check the cache ref and the registry log")
    hasher, size = hashlib.sha256(), 0
    with response, open(path, "xb") as out:
        path.chmod(0o600)
        for chunk in response.iter_content(_CHUNK):
            size += len(chunk)
            if size > MAX_LAYER:
                raise RegistryError(f"the cache blob {digest[:19]} is over {MAX_LAYER >> 30} GiB",
                                    field="--cache-to", fix="check the cache ref")
            hasher.update(chunk)
            out.write(chunk)
    if "sha256:" + hasher.hexdigest() != digest:
        raise RegistryError(f"the cache blob {digest[:19]} does not match its digest",
                            field="--cache-to", fix="the registry is corrupt; export the cache again")
