"""Signatures and attestations through the real ``cosign`` CLI (sigstore/cosign 2.x).

imgfab never writes a signature itself: :func:`sign` and :func:`attest` run ``cosign sign`` and
``cosign attest``, :func:`verify` runs ``cosign verify`` and ``cosign verify-attestation`` and
then reads what cosign printed, so a consumer running cosign by hand sees the same verdict.

Two kinds of trust:

- a key pair (``--sign-key`` / ``--verify-key``, ``cosign generate-key-pair``): the local stack
  has no transparency log, so it signs with ``--tlog-upload=false`` and verifies with
  ``--insecure-ignore-tlog`` (cosign prints its warning; :data:`NO_TLOG_NOTE` says so too);
- keyless (``--certificate-identity`` + ``--certificate-oidc-issuer``): Fulcio certificates
  and the Rekor log, as the rendered GitHub workflow signs; the tlog is always checked.

Registry credentials reach cosign through a private ``DOCKER_CONFIG`` (a temporary
``config.json``, mode 0600, removed afterwards), never on its command line. The key's
password travels in ``COSIGN_PASSWORD`` in the environment of ``cosign sign`` and ``cosign
attest`` only: from ``$IMGFAB_COSIGN_PASSWORD``, else the file ``$IMGFAB_COSIGN_PASSWORD_FILE``.
cosign inherits nothing else but its allow-list (:mod:`imgfab.docker.toolenv`).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgfab.docker.toolenv import tool_env
from imgfab.errors import EngineError, RecipeError, redact
from imgfab.supply.registry_auth import private_docker_config
from imgfab.supply.statement import subject_names

# cosign's --type names and the predicate types they stand for (cosign's
# pkg/cosign/attestation: CosignCustomProvenanceV01 ... ; `cosign attest --help`).
PREDICATE_TYPES = {"cyclonedx": "https://cyclonedx.org/bom",
                   "slsaprovenance1": "https://slsa.dev/provenance/v1"}
NO_TLOG_NOTE = ("signed with a key and no transparency log (--tlog-upload=false): verify with "
                "--insecure-ignore-tlog; the rendered workflow signs keylessly with Rekor")
_TIMEOUT_S = 300


@dataclass(frozen=True)
class Trust:
    """Who must have signed: a public key, or a keyless identity (certificate subject and
    OIDC issuer). ``tlog``: whether the transparency log is checked (always for keyless)."""

    key: Path | None = None
    identity: str | None = None
    issuer: str | None = None
    tlog: bool = False

    def __post_init__(self) -> None:
        if self.key is None and not (self.identity and self.issuer):
            raise RecipeError("no trust root given", field="--verify-key",
                              fix="pass --verify-key KEY.pub, or --certificate-identity and "
                                  "--certificate-oidc-issuer for keyless signatures")
        if self.key is not None and (self.identity or self.issuer):
            raise RecipeError("a key and a keyless identity were both given",
                              field="--certificate-identity",
                              fix="pass either --verify-key or the keyless identity")

    def args(self) -> list[str]:
        if self.key is not None:
            return ["--key", str(self.key)] + ([] if self.tlog else ["--insecure-ignore-tlog"])
        return ["--certificate-identity", str(self.identity),
                "--certificate-oidc-issuer", str(self.issuer)]

    def describe(self) -> str:
        return f"key {self.key}" if self.key is not None else \
            f"identity {self.identity} from {self.issuer}"


def cosign_binary() -> str:
    """``$IMGFAB_COSIGN``, else ``cosign`` on PATH; :class:`EngineError` (exit 1) when neither."""
    found = os.environ.get("IMGFAB_COSIGN") or shutil.which("cosign")
    if not found or not os.access(found, os.X_OK):
        raise EngineError("cosign is not installed here", field="cosign",
                          fix="install cosign 2.5 (https://github.com/sigstore/cosign/releases) and "
                              "put it on PATH, or name it in IMGFAB_COSIGN")
    return found


def key_password() -> str:
    """The signing key's password: ``$IMGFAB_COSIGN_PASSWORD``, else the contents of
    ``$IMGFAB_COSIGN_PASSWORD_FILE``, else empty (an unencrypted key)."""
    if "IMGFAB_COSIGN_PASSWORD" in os.environ:
        return os.environ["IMGFAB_COSIGN_PASSWORD"]
    path = os.environ.get("IMGFAB_COSIGN_PASSWORD_FILE")
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise RecipeError(f"cannot read IMGFAB_COSIGN_PASSWORD_FILE: {exc.strerror}",
                              field="IMGFAB_COSIGN_PASSWORD_FILE",
                              fix="point it at a readable file holding the key's password") from None
    return ""


def private_key(path: Path, option: str = "--sign-key") -> Path:
    """``path`` when it is a cosign private key only its owner can read or write (``chmod
    600``, as ``cosign generate-key-pair`` writes it; ssh refuses a looser key the same way).
    RecipeError (exit 2) naming ``option`` otherwise: not a file, or open to group or others.
    The key's content is never read here, so no message can quote it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = 0
    if not stat.S_ISREG(mode):
        raise RecipeError(f"{path} is not a key file", field=option,
                          fix="give the path of a cosign key (cosign generate-key-pair)")
    if mode & 0o077:
        raise RecipeError(f"the private key {path} is open to group or others (mode "
                          f"{stat.S_IMODE(mode):04o})", field=option, fix=f"chmod 600 {path}")
    return Path(path)


def _run(args: list[str], credentials: Any = None, *, password: str | None = None,
         timeout_s: int = _TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run cosign with ``args``; a private DOCKER_CONFIG holds ``credentials`` (an
    :class:`imgfab.docker.credentials.Credentials`) when they are not anonymous. Its
    environment is its allow-list (:mod:`imgfab.docker.toolenv`) and, for signing only, the
    key's ``password``."""
    extra = {"COSIGN_PASSWORD": password} if password is not None else {}
    with private_docker_config(credentials) as config_dir:
        if config_dir is not None:
            extra["DOCKER_CONFIG"] = str(config_dir)
        env = tool_env("cosign", extra)
        try:
            return subprocess.run([cosign_binary(), *args], capture_output=True, text=True,
                                  env=env, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise EngineError(f"cosign {args[0]} did not finish in {timeout_s}s", field="cosign",
                              fix="check the registry is reachable") from None


def _gist(done: subprocess.CompletedProcess[str]) -> str:
    """cosign's error in one line (its last ``Error:`` line, else its last line), redacted."""
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    text = (errors or lines or [f"exit {done.returncode}"])[-1].removeprefix("Error: ")
    return redact(" ".join(text.split()))[:300]


def _digest_ref(ref: str) -> str:
    if "@sha256:" not in ref:
        raise RecipeError(f"{ref} is not a digest reference", field="image",
                          fix="sign and verify REGISTRY/REPO@sha256:…, never a tag")
    return ref


def sign(digest_ref: str, key: Path, credentials: Any = None, *, tlog: bool = False) -> None:
    """``cosign sign --key KEY`` the image ``digest_ref`` (``--tlog-upload=false`` unless
    ``tlog``). Raises :class:`EngineError` (exit 1) with cosign's message on failure."""
    args = ["sign", "--key", str(private_key(key)), "--yes",
            f"--tlog-upload={'true' if tlog else 'false'}", _digest_ref(digest_ref)]
    done = _run(args, credentials, password=key_password())
    if done.returncode != 0:
        raise EngineError(f"cosign sign {digest_ref} failed: {_gist(done)}", field="--sign-key",
                          fix="check the key and its password (IMGFAB_COSIGN_PASSWORD[_FILE]) "
                              "and that the registry accepts the push")


def attest(digest_ref: str, predicate: Path, kind: str, key: Path, credentials: Any = None, *,
           tlog: bool = False) -> None:
    """``cosign attest --type KIND --predicate FILE``: the signed in-toto statement whose
    subject is ``digest_ref``, attached in the registry beside the image."""
    if kind not in PREDICATE_TYPES:
        raise RecipeError(f"unknown attestation type {kind!r}", field="attest",
                          fix=f"one of {', '.join(sorted(PREDICATE_TYPES))}")
    args = ["attest", "--key", str(private_key(key)), "--yes", "--type", kind,
            "--predicate", str(predicate), f"--tlog-upload={'true' if tlog else 'false'}",
            _digest_ref(digest_ref)]
    done = _run(args, credentials, password=key_password())
    if done.returncode != 0:
        raise EngineError(f"cosign attest --type {kind} {digest_ref} failed: {_gist(done)}",
                          field="--sign-key", fix="check the key and the registry")


@dataclass
class Verdict:
    """What :func:`verify` found: ``problems`` empty means the signature and every required
    attestation verified for exactly this digest."""

    image: str
    problems: list[str]
    attestations: dict[str, int]  # kind → statements that verified for this digest

    @property
    def verified(self) -> bool:
        return not self.problems


def _statements(output: str) -> list[dict[str, Any]]:
    """The in-toto statements of ``cosign verify-attestation``'s output (one DSSE envelope
    per line, its payload base64)."""
    found = []
    for line in output.splitlines():
        try:
            envelope = json.loads(line)
            statement = json.loads(base64.b64decode(envelope.get("payload", "")))
        except (ValueError, TypeError, AttributeError):
            continue
        if isinstance(statement, dict):
            found.append(statement)
    return found


def subject_digests(statement: dict[str, Any]) -> set[str]:
    """``sha256:<hex>`` of every subject of an in-toto statement (to name them in a refusal;
    whether one is the image's is :func:`imgfab.supply.statement.subject_names`)."""
    subjects = statement.get("subject") if isinstance(statement.get("subject"), list) else []
    return {f"sha256:{s['digest']['sha256']}" for s in subjects
            if isinstance(s, dict) and isinstance(s.get("digest"), dict)
            and isinstance(s["digest"].get("sha256"), str)}


def verify(digest_ref: str, trust: Trust, credentials: Any = None, *,
           attestations: tuple[str, ...] = ("cyclonedx", "slsaprovenance1")) -> Verdict:
    """Verify ``digest_ref``'s signature and its ``attestations`` against ``trust``.

    Each check is cosign's own (``cosign verify``, ``cosign verify-attestation --type``); on
    top, imgfab requires that what cosign accepted names this digest: the signature's
    ``critical.image.docker-manifest-digest``, each statement's subject and predicate type.
    """
    digest = _digest_ref(digest_ref).split("@", 1)[1]
    problems: list[str] = []
    done = _run(["verify", *trust.args(), "--output", "json", digest_ref], credentials)
    if done.returncode != 0:
        problems.append(f"signature: none verifies with {trust.describe()} ({_gist(done)})")
    else:
        try:
            signed = {((p.get("critical") or {}).get("image") or {}).get("docker-manifest-digest")
                      for p in json.loads(done.stdout)}
        except (ValueError, AttributeError, TypeError):
            signed = set()
        if digest not in signed:
            problems.append(f"signature: the verified signatures name {sorted(map(str, signed))}, "
                            f"not {digest}")
    counted: dict[str, int] = {}
    for kind in attestations:
        done = _run(["verify-attestation", *trust.args(), "--type", kind, digest_ref], credentials)
        if done.returncode != 0:
            problems.append(f"attestation {kind}: none verifies with {trust.describe()} "
                            f"({_gist(done)})")
            continue
        statements = [s for s in _statements(done.stdout)
                      if s.get("predicateType") == PREDICATE_TYPES[kind]]
        ours = [s for s in statements if subject_names(s, digest)]
        if not ours:
            others = sorted({d for s in statements for d in subject_digests(s)})
            problems.append(f"attestation {kind}: its subject is {', '.join(others) or 'nothing'}, "
                            f"not {digest}")
        counted[kind] = len(ours)
    return Verdict(digest_ref, problems, counted)
