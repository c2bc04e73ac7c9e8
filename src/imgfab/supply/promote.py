"""Promotion by digest: ``imgfab promote REG/REPO@sha256:… --to REG2/REPO2:TAG``.

The image that passed its checks is copied, never rebuilt: ``oras cp`` (oras 1.2) moves the
manifest and its blobs by digest, then the registry is asked what the new tag names, which
must be that same digest. The image's attestations (cosign's ``sha256-<hex>.att``: the SBOM
and the provenance, whose subject is the digest and so holds in any repository) are copied
the same way, and with a key the promoted reference is signed in its new repository. A
target tag that already names another image is not moved unless ``retag``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from imgfab.docker import registry
from imgfab.docker.registry_http import _is_loopback
from imgfab.errors import EngineError, RecipeError, RegistryError, redact
from imgfab.supply import cosign
from imgfab.supply.registry_auth import private_docker_config

_TIMEOUT_S = 1800


@dataclass
class Promotion:
    """What :func:`promote` did (the ``--json`` object)."""

    source: str  # REG/REPO@sha256:…
    target: str  # REG2/REPO2:TAG
    promoted: str  # REG2/REPO2@sha256:…, the same digest
    attestations: bool  # the source's attestations were copied
    signed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def oras_binary() -> str:
    """``$IMGFAB_ORAS``, else ``oras`` on PATH; :class:`EngineError` (exit 1) when neither."""
    found = os.environ.get("IMGFAB_ORAS") or shutil.which("oras")
    if not found or not os.access(found, os.X_OK):
        raise EngineError("oras is not installed here", field="oras",
                          fix="install oras 1.2 (Debian: apt-get install oras) and put it on PATH, "
                              "or name it in IMGFAB_ORAS")
    return found


def oras_copy(source: str, target: str, source_credentials: Any, target_credentials: Any) -> None:
    """``oras cp SOURCE TARGET`` with each side's credentials in a private config (plain
    http for a loopback registry, as :mod:`imgfab.docker.registry_http` uses)."""
    src_host, dst_host = (registry.ImageRef.parse(r).host for r in (source, target))
    args = [oras_binary(), "cp", "--no-tty"]
    args += ["--from-plain-http"] if _is_loopback(src_host) else []
    args += ["--to-plain-http"] if _is_loopback(dst_host) else []
    with private_docker_config(source_credentials) as src_config, \
            private_docker_config(target_credentials) as dst_config:
        args += ["--from-registry-config", str(Path(src_config) / "config.json")] if src_config else []
        args += ["--to-registry-config", str(Path(dst_config) / "config.json")] if dst_config else []
        try:
            done = subprocess.run([*args, source, target], capture_output=True, text=True,
                                  timeout=_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise EngineError(f"oras cp {source} did not finish in {_TIMEOUT_S}s", field="oras",
                              fix="check both registries are reachable") from None
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        gist = redact(" ".join((lines or [f"exit {done.returncode}"])[-1].split()))[:300]
        raise RegistryError(f"oras cp {source} {target} failed: {gist}", field="promote",
                            fix="check the source digest exists and the credentials for both registries")


def promote(source: str, target: str, *, sign_key: Path | None = None, retag: bool = False,
            source_credentials: Any = None, target_credentials: Any = None) -> Promotion:
    """Copy ``source`` (``REG/REPO@sha256:…``) to ``target`` (``REG2/REPO2:TAG``) by digest.

    Raises :class:`RecipeError` (exit 2) for a source that is not a digest reference, a
    target that is not a tag, or a target tag that names another image (without ``retag``);
    :class:`RegistryError` / :class:`EngineError` (exit 1) for the registries and tools.
    """
    parsed_source, parsed_target = registry.ImageRef.parse(source), registry.ImageRef.parse(target)
    if not parsed_source.digest:
        raise RecipeError(f"{source} is not a digest reference", field="IMAGE",
                          fix="promote what passed, by digest: REG/REPO@sha256:…")
    if parsed_target.digest or not parsed_target.tag:
        raise RecipeError(f"{target} is not a tag reference", field="--to",
                          fix="promote to REG/REPO:TAG")
    digest = parsed_source.digest
    source_credentials = source_credentials or registry.Credentials.load(parsed_source.host)
    target_credentials = target_credentials or registry.Credentials.load(parsed_target.host)
    held = registry.tag_holder(target, target_credentials)
    if held is not None and digest != held[0] and not retag:
        raise RecipeError(f"{target} already names {held[0]}; promoting {digest} would move it",
                          field="--to", fix="pass --retag to move the tag, or promote to a new tag")
    oras_copy(f"{parsed_source.name}@{digest}", target, source_credentials, target_credentials)
    now = registry.resolve_digest(target, target_credentials).rsplit("@", 1)[1]
    if now != digest:
        raise RegistryError(f"{target} names {now} after the copy, not {digest}", field="promote",
                            fix="another push raced the promotion; promote again")
    attestations = f"{parsed_source.name}:{digest.replace(':', '-')}.att"
    copied = registry.tag_holder(attestations, source_credentials) is not None
    if copied:
        oras_copy(attestations, f"{parsed_target.name}:{digest.replace(':', '-')}.att",
                  source_credentials, target_credentials)
    promoted = f"{parsed_target.name}@{digest}"
    if sign_key is not None:
        cosign.sign(promoted, sign_key, target_credentials)
    return Promotion(source=f"{parsed_source.name}@{digest}", target=target, promoted=promoted,
                     attestations=copied, signed=sign_key is not None)
