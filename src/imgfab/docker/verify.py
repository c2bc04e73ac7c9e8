"""Post-build checks on a built runtime image; each check is a :class:`Finding`.

:func:`verify_image` reads the image through :mod:`imgfab.docker.engine` (``docker inspect`` and a
streamed ``docker save``, never written to disk), both by the one image ID inspect answered
(the build passes the ID it wrote), and checks:

- ``user``: the runtime user is set and is not root;
- ``labels``: every ``org.imgfab.*`` label :func:`imgfab.render.context.image_labels` writes is
  present with the rendered value; ``NVIDIA_REQUIRE_CUDA`` is in the environment; a
  HEALTHCHECK is set;
- ``weights``: no layer holds a file under the recipe's weights mount path (the empty mount
  directory itself is expected);
- ``secrets``: no layer (nor the image config) holds the bytes of a build secret (the CA
  bundle, the pip configuration): the whole file, each PEM block of a bundle that is not a
  public CA of this host's trust store, each URL with credentials and its password; in file
  contents, entry names, link targets, owner names and PAX records (a finding masks the
  secret in the path it names);
- ``layers``: every layer ``manifest.json`` lists was read, whatever layout ``docker save``
  wrote (legacy ``<id>/layer.tar``, OCI ``blobs/sha256/<hex>``, gzip or zstd blobs), and its
  uncompressed bytes hash to the diff id the image config and inspect list at its place; an
  unreadable, missing or mismatched listed layer, bytes hidden after a tar's end, or an
  impossible sparse map fails the image (fail closed). Scan results are cached under the
  hashes of the bytes scanned, never under inspect's diff ids alone;
- ``tools``: no build-only tool is left in the final filesystem unless the backend declares
  it as its run-time toolchain (``compat/backends.yaml`` ``runtime_toolchain``); pip/apt
  caches and the builder's requirements file are never allowed.

A failed check raises :class:`imgfab.errors.ValidationFailed` listing every failure (with
``raise_on_failure=False`` the :class:`VerifyReport` is returned instead).
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import os
import posixpath
import re
import stat
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from imgfab.cache import cache_root
from imgfab.errors import ValidationFailed
from imgfab.stack.toolchain import PAYLOAD_CUDA_HOME
from imgfab.docker.catalogue import (_ALL_PATTERNS, ALWAYS_FORBIDDEN, NOTE_ONLY, PAYLOAD_TOOLKIT,
                                     TOOL_PATHS)
from imgfab.docker.layers import (_MAX_SECRET_BYTES, _contains, _LayerScan, _scan_directory,
                                  local_layer_blobs, scan_blob,
                                  _scan_layers, local_layer_dirs, mask)

# The names other stations and the tests use, wherever they live in this package.
__all__ = ["ALWAYS_FORBIDDEN", "NOTE_ONLY", "PAYLOAD_TOOLKIT", "TOOL_PATHS", "Finding",
           "VerifyPolicy", "VerifyReport", "layer_findings", "local_layer_dirs", "policy_for",
           "public_pem_blocks", "secret_needles", "verify_image"]

# PEM blocks of a bundle, and URLs with user:password@ (a pip index with credentials).
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?-----END \1-----", re.S)
_URL_CREDENTIALS = re.compile(rb"[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*:([^\s/@]+)@[^\s\"'<>]+")
# Shorter passwords are searched for inside their URL only (alone they match too much).
_MIN_PASSWORD = 6
# Host trust stores whose certificates are public, not secrets (Debian/Ubuntu, RHEL).
SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


@dataclass
class Finding:
    """One check's verdict: ``check`` name, ``passed``, and one line of ``detail``."""

    check: str
    passed: bool
    detail: str


@dataclass
class VerifyPolicy:
    """What an image built from a recipe must satisfy."""

    mount_path: str
    required_labels: dict[str, str]
    declared_toolchain: tuple[str, ...] = ()
    secrets: dict[str, bytes] = field(default_factory=dict)
    # The runtime base image's layer diff ids: caches it ships itself (debootstrap leaves its
    # .debs in /var/cache/apt/archives) are reported as notes, not as failures of this build.
    base_diff_ids: tuple[str, ...] = ()
    # Certificate PEM blocks of the host's public trust store: a CA bundle's public CAs are in
    # every image that installs ca-certificates, so only its other blocks are searched for.
    public_pem: frozenset[bytes] = frozenset()
    # Set when the runtime's CUDA_HOME is a view of the payload's toolkit tree: what the view
    # needs from the payload (PAYLOAD_TOOLKIT names), which the final filesystem must hold.
    payload_toolkit: tuple[str, ...] = ()

    @property
    def mount(self) -> str:
        """The weights mount, normalised and relative as in a layer tar (``models/x``)."""
        return posixpath.normpath("/" + self.mount_path).strip("/")

    def needles(self) -> dict[str, bytes]:
        """What the secrets check searches for, by name: each secret whole, each PEM block
        of it that is not a public CA certificate, each URL with credentials and (when at
        least 6 bytes) its password, raw and percent-decoded."""
        return secret_needles(self.secrets, self.public_pem)


def secret_needles(secrets: dict[str, bytes],
                   public_pem: frozenset[bytes] = frozenset()) -> dict[str, bytes]:
    """``secrets`` (name → file bytes) expanded into the byte strings no layer may hold."""
    needles: dict[str, bytes] = {}

    def add(name: str, needle: bytes) -> None:
        if needle and needle not in needles.values():
            unique, n = name, 2
            while unique in needles:
                unique, n = f"{name} {n}", n + 1
            needles[unique] = needle

    for name, data in sorted(secrets.items()):
        add(name, data)
        for index, block in enumerate(_PEM_BLOCK.finditer(data), 1):
            if b"PRIVATE KEY" not in block.group(1) and block.group(0) in public_pem:
                continue
            add(f"{name} (PEM block {index})", block.group(0))
        for url in _URL_CREDENTIALS.finditer(data):
            add(f"{name} (URL with credentials)", url.group(0))
            raw = url.group(1)
            for password in (raw, urllib.parse.unquote_to_bytes(raw)):
                if len(password) >= _MIN_PASSWORD:
                    add(f"{name} (password)", password)
    return needles


def public_pem_blocks(paths: Iterable[str] = SYSTEM_BUNDLES) -> frozenset[bytes]:
    """The certificate blocks of the host's trust store (public, not secrets)."""
    blocks: set[bytes] = set()
    for path in paths:
        try:
            data = _read_regular(Path(path))
        except OSError:
            continue
        blocks.update(m.group(0) for m in _PEM_BLOCK.finditer(data)
                      if m.group(1) == b"CERTIFICATE")
    return frozenset(blocks)


def _read_regular(path: Path, limit: int = _MAX_SECRET_BYTES) -> bytes:
    """The bytes of regular file ``path`` (at most ``limit``); OSError otherwise."""
    with open(path, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{path} is larger than {limit} bytes")
    return data


@dataclass
class VerifyReport:
    image: str
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(f.passed for f in self.findings)

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if not f.passed]

    def to_dict(self) -> dict[str, Any]:
        return {"image": self.image, "passed": self.passed, "notes": self.notes,
                "findings": [asdict(f) for f in self.findings]}


def policy_for(recipe: Any, stack: Any, matrix: Any,
               secrets: dict[str, Path] | None = None) -> VerifyPolicy:
    """The policy for an image built from ``recipe`` resolved to ``stack``; ``secrets`` are
    the build secret files whose bytes must not appear in any layer."""
    from imgfab.recipe import recipe_hash  # noqa: PLC0415
    from imgfab.render.context import LABEL_PREFIX, image_labels  # noqa: PLC0415

    profile = matrix.profiles[stack.backend]
    labels = image_labels(recipe, stack, recipe_hash(recipe), profile.weights_required)
    read: dict[str, bytes] = {}
    for name, path in sorted((secrets or {}).items()):
        try:
            data = _read_regular(Path(path))
        except OSError as exc:
            raise ValidationFailed(f"cannot read build secret {name} to search for it: {exc}",
                                   field="verify", fix="give a regular, readable file") from None
        if data:
            read[name] = data
    return VerifyPolicy(
        mount_path=recipe.model.mount_path,
        required_labels={k: v for k, v in labels.items() if k.startswith(LABEL_PREFIX + ".")},
        declared_toolchain=tuple(sorted(stack.runtime_toolchain)),
        secrets=read, public_pem=public_pem_blocks() if read else frozenset(),
        payload_toolkit=tuple(PAYLOAD_TOOLKIT) if stack.cuda_home == PAYLOAD_CUDA_HOME else ())


def verify_image(ref: str, policy: VerifyPolicy, *, engine: Any = None,
                 raise_on_failure: bool = True) -> VerifyReport:
    """Run every check on image ``ref`` (best an image ID, as the build produced it).
    Raises :class:`ValidationFailed` listing the failures (unless ``raise_on_failure`` is
    False); :class:`imgfab.errors.EngineError` if the engine cannot inspect or save the image.

    ``ref`` is looked up once: the history and the save use the ID that inspect answered,
    so a tag moved meanwhile (another build of the same ``repository:tag``) cannot put one
    image's config beside another's layers.
    """
    engine = engine or importlib.import_module("imgfab.docker.engine")
    report = VerifyReport(image=ref)
    info = engine.inspect_image(ref)
    image_id = str(info.get("Id") or ref)
    report.findings += _config_findings(info.get("Config") or {}, policy)
    ours = list((info.get("RootFS") or {}).get("Layers") or [])
    scan = _scan_image(image_id, info, ours, policy, engine)
    scan.base_count = sum(1 for _ in iter_prefix(ours, list(policy.base_diff_ids)))
    report.findings += layer_findings(scan, policy)
    report.notes += scan.notes
    needles = policy.needles()  # a path or a name shown may hold a secret, or a line break
    for finding in report.findings:
        finding.detail = mask(finding.detail, needles)
    report.notes = [mask(note, needles) for note in report.notes]
    if raise_on_failure and not report.passed:
        listed = "; ".join(f"{f.check}: {f.detail}" for f in report.failures)
        raise ValidationFailed(f"image {ref} failed {len(report.failures)} check(s): {listed}",
                               field="verify",
                               fix="fix the recipe/templates, or declare a needed run-time "
                                   "tool in compat/backends.yaml runtime_toolchain")
    return report


def iter_prefix(ours: list[str], base: list[str]) -> Iterator[str]:
    """The leading layers ``ours`` shares with ``base``."""
    for mine, theirs in zip(ours, base):
        if mine != theirs:
            return
        yield mine


def _config_findings(config: dict[str, Any], policy: VerifyPolicy) -> list[Finding]:
    findings = []
    user = (config.get("User") or "").strip()
    name = user.split(":")[0]
    findings.append(Finding("user", bool(name) and name not in ("root", "0"),
                            f"runtime user is {user!r}" if user else "runtime user is unset (root)"))
    labels = config.get("Labels") or {}
    missing = sorted(k for k in policy.required_labels if k not in labels)
    wrong = sorted(k for k, v in policy.required_labels.items()
                   if k in labels and labels[k] != v)
    detail = "all present" if not (missing or wrong) else \
        "; ".join(part for part in (f"missing {', '.join(missing[:8])}" if missing else "",
                                    f"differ: {', '.join(wrong[:8])}" if wrong else "") if part)
    findings.append(Finding("labels", not (missing or wrong), detail))
    env_keys = {entry.partition("=")[0] for entry in config.get("Env") or []}
    findings.append(Finding("env", "NVIDIA_REQUIRE_CUDA" in env_keys,
                            "NVIDIA_REQUIRE_CUDA set" if "NVIDIA_REQUIRE_CUDA" in env_keys
                            else "NVIDIA_REQUIRE_CUDA missing from the environment"))
    test = ((config.get("Healthcheck") or {}).get("Test")) or []
    healthy = bool(test) and test[0] != "NONE"
    findings.append(Finding("healthcheck", healthy,
                            "HEALTHCHECK set" if healthy else "no HEALTHCHECK"))
    return findings


# Bumped when the scan itself changes, so results of an older scanner are not reused.
_SCANNER_VERSION = "3"


def cache_dir() -> Path:
    """Where per-layer scan results are kept (``verify/`` under :func:`imgfab.cache.cache_root`)."""
    return cache_root() / "verify"


def _layer_key(diff_id: str, policy: VerifyPolicy) -> str:
    """A layer's scan result depends only on its content (the diff id), the weights mount,
    the secrets searched for and the path catalogue: all four are in the key.

    From a save stream, ``diff_id`` is the hash of the bytes that were scanned, never a claim
    of inspect's; from a local engine's overlay2 storage it is the diff id the engine's layer
    store gives that directory, in the inspect answer for the image ID being verified."""
    digest = hashlib.sha256()
    for part in (diff_id, policy.mount, _ALL_PATTERNS.pattern, _SCANNER_VERSION):
        digest.update(part.encode() + b"\0")
    for name, data in sorted(policy.needles().items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def _load_layer(key: str) -> dict[str, Any] | None:
    try:
        return json.loads((cache_dir() / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _store_layer(key: str, result: dict[str, Any]) -> None:
    """Best effort: a cache that cannot be written only costs a rescan next time."""
    try:
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        staging = directory / f".{key}.{os.getpid()}"
        staging.write_text(json.dumps(result, sort_keys=True), encoding="utf-8")
        os.replace(staging, directory / f"{key}.json")
    except OSError:
        pass


def _docker_root(engine: Any) -> str:
    """The local engine's data root (``docker info``), '' when unknown."""
    try:
        return str((engine.docker_info() or {}).get("DockerRootDir") or "")
    except Exception:  # noqa: BLE001 - no local storage: the save stream is read instead
        return ""


def _scan_image(image_id: str, info: dict[str, Any], layers: list[str], policy: VerifyPolicy,
                engine: Any) -> _LayerScan:
    """Scan every layer once per content. Results are cached under the sha256 of the layer
    bytes that were scanned; a layer whose cached result is not known is read from the
    engine's storage when it is local (else one ``docker save`` of ``image_id``, whose layers
    must hash to the diff ids inspect reported)."""
    keys = {diff_id: _layer_key(diff_id, policy) for diff_id in layers}
    known = {diff_id: _load_layer(key) for diff_id, key in keys.items()}
    unknown = [d for d in layers if known[d] is None]
    directories = local_layer_dirs(info, layers) if unknown else []
    blobs = None
    if unknown and directories is None:  # the containerd image store: its local content store
        blobs = local_layer_blobs(info, layers, _docker_root(engine))
    if unknown and directories is None and blobs is None:
        scan = _scan_layers(engine.save_stream(image_id), policy)
        for name, digest in zip(scan.order, scan.diff_ids):  # keyed by what was hashed
            _store_layer(_layer_key(digest, policy), scan.results[name])
        if len(scan.order) != len(layers):
            scan.unscanned.append(f"manifest.json lists {len(scan.order)} layers, the image "
                                  f"has {len(layers)}")
        elif scan.diff_ids != layers:
            index = next(i for i, (a, b) in enumerate(zip(scan.diff_ids, layers)) if a != b)
            scan.unscanned.append(f"the saved layer {index + 1} hashes to "
                                  f"{scan.diff_ids[index][:19]}…, inspect of {image_id[:19]}… "
                                  f"reports {layers[index][:19]}…")
        return scan
    scan = _LayerScan(order=list(layers))
    secret_hits: set[str] = set()
    mount = policy.mount
    for index, diff_id in enumerate(layers):
        result = known[diff_id]
        if result is None and blobs is not None:
            # The content store's blob at this place of the image's own manifest: read whole,
            # its uncompressed bytes must hash to the diff id inspect reported (fail closed).
            result, read_as, why = scan_blob(blobs[index], mount, policy)
            if result is None or read_as != diff_id:
                scan.unscanned.append(f"layer {index + 1} ({blobs[index].name[:12]}… in the content "
                                      f"store: {why or f'its bytes hash to {read_as[:19]}…, inspect reports {diff_id[:19]}…'})")
                continue
            _store_layer(keys[diff_id], result)
        elif result is None:
            # The engine's own layer store, in the same inspect answer (of the ID, not a tag)
            # that named the diff ids: overlay2 directories are new for every build of equal
            # bytes, so keying by them would rescan every layer of every rebuild.
            assert directories is not None
            result = _scan_directory(directories[index], mount, policy)
            _store_layer(keys[diff_id], result)
        scan.merge(diff_id, result, secret_hits)
    # The image config (history, environment, labels) as the engine reports it.
    config_text = json.dumps([info, engine.image_history(image_id)], sort_keys=True).encode()
    for name in _contains(io.BytesIO(config_text), policy.needles()):
        secret_hits.add(f"{name} in the image config")
    scan.secrets = sorted(secret_hits)
    where = "the containerd content store" if blobs is not None else "the engine's storage"
    scan.notes.append(f"layers: {len(layers) - len(unknown)} of {len(layers)} known from earlier "
                      f"scans, {len(unknown)} read from {where}")
    return scan


def layer_findings(scan: _LayerScan, policy: VerifyPolicy) -> list[Finding]:
    """What the layers hold, judged against ``policy``: every listed layer read, nothing
    under the weights mount, no secret bytes, no undeclared build tool, and the payload
    toolkit a CUDA_HOME view points at; notes go to ``scan.notes``."""
    result = [
        Finding("layers", not scan.unscanned,
                f"listed layers not scanned: {', '.join(scan.unscanned[:5])}"
                if scan.unscanned else f"all {len(scan.order)} listed layers scanned"),
        Finding("weights", not scan.weights,
                f"files under {policy.mount_path}: {', '.join(scan.weights[:5])}"
                if scan.weights else f"nothing under {policy.mount_path}"),
        Finding("secrets", not scan.secrets,
                f"build secret bytes found: {', '.join(scan.secrets[:5])}"
                if scan.secrets else f"no bytes of {', '.join(policy.secrets) or 'no secrets'}"),
    ]
    present = scan.final_paths()
    forbidden = {name: pats for name, pats in TOOL_PATHS.items()
                 if name not in policy.declared_toolchain}
    forbidden.update(ALWAYS_FORBIDDEN)
    offenders = []
    for name, patterns in sorted(forbidden.items()):
        hits = sorted(p for p in present if any(re.fullmatch(pat, p) for pat in patterns))
        inherited = [p for p in hits if present[p] < scan.base_count]
        if name in ALWAYS_FORBIDDEN and inherited:
            scan.notes.append(f"{name} inherited from the runtime base image "
                              f"(/{inherited[0]}, {len(inherited)} file(s)): not this build's")
            hits = [p for p in hits if p not in inherited]
        if hits:
            offenders.append(f"{name} (/{hits[0]})")
    for name, patterns in NOTE_ONLY.items():
        hits = sorted(p for p in present if any(re.fullmatch(pat, p) for pat in patterns))
        if hits:
            scan.notes.append(f"{name} present (/{hits[0]}): a dependency of the payload")
    if policy.payload_toolkit:
        missing = [name for name in policy.payload_toolkit
                   if not any(re.fullmatch(PAYLOAD_TOOLKIT[name], p) for p in present)]
        result.append(Finding(
            "cuda_home", not missing,
            f"the payload lacks what CUDA_HOME's view points at: {', '.join(missing)} "
            "(lock the toolchain's cuda-toolkit wheels)" if missing
            else f"the payload carries the view's {', '.join(policy.payload_toolkit)}"))
    declared = ", ".join(policy.declared_toolchain) or "none"
    result.append(Finding("tools", not offenders,
                          f"undeclared build-only tools: {', '.join(offenders)} "
                          f"(declared: {declared})" if offenders
                          else f"no undeclared build tools (declared: {declared})"))
    return result
