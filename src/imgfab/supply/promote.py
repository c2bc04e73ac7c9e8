"""Promotion by digest: ``imgfab promote REG/REPO@sha256:… --to REG2/REPO2:TAG``.

The image that passed its checks is copied, never rebuilt: ``oras cp`` (oras 1.2) moves the
manifest and its blobs by digest, then the registry is asked what the new tag names, which
must be that same digest. The image's attestations (cosign's ``sha256-<hex>.att``: the SBOM
and the provenance, whose subject is the digest and so holds in any repository) are copied
the same way, and with a key the promoted reference is signed in its new repository. A
target tag that already names another image is not moved unless ``retag``.

Trust is checked before it is passed on (issue 34): with a signing key, the source must first
verify (``cosign verify`` and ``verify-attestation`` of its SBOM and provenance, for exactly
its digest) against the key or keyless identity that signed staging, before anything is
copied; a source that does not is refused (exit 1). Signing an unverified source takes
``verify_source=False`` (``--no-verify-source``), which the result states.
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
from imgfab.docker.toolenv import tool_env
from imgfab.errors import EngineError, RecipeError, RegistryError, ValidationFailed, redact
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
    source_verified: bool  # its signature and attestations verified before anything was copied
    verification: str  # against what, or why not ("not verified: --no-verify-source")

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
                                  timeout=_TIMEOUT_S, check=False, env=tool_env("oras"))
        except subprocess.TimeoutExpired:
            raise EngineError(f"oras cp {source} did not finish in {_TIMEOUT_S}s", field="oras",
                              fix="check both registries are reachable") from None
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        gist = redact(" ".join((lines or [f"exit {done.returncode}"])[-1].split()))[:300]
        raise RegistryError(f"oras cp {source} {target} failed: {gist}", field="promote",
                            fix="check the source digest exists and the credentials for both registries")


def promote(source: str, target: str, *, sign_key: Path | None = None, retag: bool = False,
            trust: cosign.Trust | None = None, verify_source: bool = True,
            source_credentials: Any = None, target_credentials: Any = None) -> Promotion:
    """Copy ``source`` (``REG/REPO@sha256:…``) to ``target`` (``REG2/REPO2:TAG``) by digest.

    ``trust`` (who signed staging: a key or a keyless identity): the source's signature and its
    SBOM and provenance attestations must verify against it before anything is copied. With a
    ``sign_key`` a ``trust`` is required unless ``verify_source`` is False.

    Raises :class:`RecipeError` (exit 2) for a source that is not a digest reference, a
    target that is not a tag, a target tag that names another image (without ``retag``), or
    a signing key with nothing to verify the source against; :class:`ValidationFailed`
    (exit 1) for a source that does not verify; :class:`RegistryError` /
    :class:`EngineError` (exit 1) for the registries and tools.
    """
    parsed_source, parsed_target = registry.ImageRef.parse(source), registry.ImageRef.parse(target)
    if not parsed_source.digest:
        raise RecipeError(f"{source} is not a digest reference", field="IMAGE",
                          fix="promote what passed, by digest: REG/REPO@sha256:…")
    if parsed_target.digest or not parsed_target.tag:
        raise RecipeError(f"{target} is not a tag reference", field="--to",
                          fix="promote to REG/REPO:TAG")
    if trust is not None and not verify_source:
        raise RecipeError("--no-verify-source and a trust root to verify the source with were both given",
                          field="--no-verify-source", fix="pass one of them")
    if sign_key is not None and trust is None and verify_source:
        raise RecipeError("--sign-key signs the release, but nothing says who must have signed the "
                          f"source {source}", field="--verify-key",
                          fix="pass the key that signed staging (--verify-key KEY.pub) or its keyless "
                              "identity (--certificate-identity and --certificate-oidc-issuer); or "
                              "--no-verify-source to sign it unverified, which the output states")
    digest = parsed_source.digest
    source_credentials = source_credentials or registry.Credentials.load(parsed_source.host)
    target_credentials = target_credentials or registry.Credentials.load(parsed_target.host)
    source_ref = f"{parsed_source.name}@{digest}"
    if trust is not None:  # before anything moves: an unverified source is copied nowhere
        verdict = cosign.verify(source_ref, trust, source_credentials)
        if not verdict.verified:
            raise ValidationFailed(f"{source_ref} does not verify with {trust.describe()}: "
                                   f"{'; '.join(verdict.problems)}", field="promote",
                                   fix="promote an image signed and attested by that key or identity "
                                       "(imgfab build --push --sign-key), or pass --no-verify-source "
                                       "to promote it unverified, which the output states")
        verification = f"signature and attestations ({', '.join(sorted(verdict.attestations))}) " \
                       f"verified with {trust.describe()}"
    else:
        verification = ("not verified: --no-verify-source" if not verify_source
                        else "not verified: no --verify-key or keyless identity given")
    held = registry.tag_holder(target, target_credentials)
    if held is not None and digest != held[0] and not retag:
        raise RecipeError(f"{target} already names {held[0]}; promoting {digest} would move it",
                          field="--to", fix="pass --retag to move the tag, or promote to a new tag")
    oras_copy(source_ref, target, source_credentials, target_credentials)
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
    return Promotion(source=source_ref, target=target, promoted=promoted,
                     attestations=copied, signed=sign_key is not None,
                     source_verified=trust is not None, verification=verification)
