"""Post-build checks on a built runtime image; each check is a :class:`Finding`.

:func:`verify_image` reads the image through :mod:`imgfab.engine` (``docker inspect`` and a
streamed ``docker save``, never written to disk) and checks:

- ``user``: the runtime user is set and is not root;
- ``labels``: every ``org.imgfab.*`` label :func:`imgfab.render.image_labels` writes is
  present with the rendered value; ``NVIDIA_REQUIRE_CUDA`` is in the environment; a
  HEALTHCHECK is set;
- ``weights``: no layer holds a file under the recipe's weights mount path (the empty mount
  directory itself is expected);
- ``secrets``: no layer (nor the image config) holds the bytes of a build secret (the CA
  bundle, the pip configuration): the whole file, each PEM block of a bundle that is not a
  public CA of this host's trust store, each URL with credentials and its password;
- ``layers``: every layer ``manifest.json`` lists was read, whatever layout ``docker save``
  wrote (legacy ``<id>/layer.tar``, OCI ``blobs/sha256/<hex>``, gzip or zstd blobs); an
  unreadable or missing listed layer fails the image (fail closed);
- ``tools``: no build-only tool is left in the final filesystem unless the backend declares
  it as its run-time toolchain (``compat/backends.yaml`` ``runtime_toolchain``); pip/apt
  caches and the builder's requirements file are never allowed.

A failed check raises :class:`imgfab.errors.ValidationFailed` listing every failure (with
``raise_on_failure=False`` the :class:`VerifyReport` is returned instead).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import io
import json
import os
import posixpath
import re
import stat
import tarfile
import urllib.parse
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from imgfab.errors import ValidationFailed
from imgfab.toolchain import PAYLOAD_CUDA_HOME

# Build-only tools by the name a backend declares in `runtime_toolchain`, and the paths
# (relative, as in a layer tar) that betray them. How obtained: the file lists of the Debian
# bookworm / Ubuntu 24.04 packages (`dpkg -L gcc-12 g++-12 cmake git make ninja-build
# libc6-dev python3.11-dev`), the NVIDIA CUDA -devel images (`/usr/local/cuda-X.Y/bin/nvcc`)
# and the PyPI wheels that ship the same tools as console scripts (cmake, ninja).
# A declared name allows exactly its own patterns: vLLM declares gcc (the C compiler, not
# g++), TensorRT-LLM declares nvcc (which brings the CUDA toolkit tree with it).
TOOL_PATHS: dict[str, tuple[str, ...]] = {
    "cmake": (r"usr/(local/)?bin/cmake", r"opt/venv/bin/cmake"),
    "g++": (r"usr/(local/)?bin/(g\+\+|c\+\+)(-[0-9.]+)?", r"usr/bin/x86_64-linux-gnu-g\+\+(-[0-9.]+)?",
            r"usr/bin/aarch64-linux-gnu-g\+\+(-[0-9.]+)?"),
    "gcc": (r"usr/(local/)?bin/(gcc|cc)(-[0-9.]+)?", r"usr/bin/x86_64-linux-gnu-gcc(-[0-9.]+)?",
            r"usr/bin/aarch64-linux-gnu-gcc(-[0-9.]+)?"),
    "git": (r"usr/(local/)?bin/git",),
    "libc6-dev": (r"usr/include/stdio\.h",),
    "make": (r"usr/(local/)?bin/make",),
    # The OS ninja-build package. A `ninja` console script inside /opt/venv is a Python
    # dependency of the backend's own wheels (vLLM requires ninja for JIT builds): payload,
    # not a build leftover, so it is reported as a note, not a failure.
    "ninja": (r"usr/(local/)?bin/ninja",),
    "nvcc": (r"usr/local/cuda[^/]*/bin/nvcc", r"usr/bin/nvcc"),
    "python3-dev": (r"usr/include/python3[0-9.]*/Python\.h",),
}
# Never allowed, whatever the backend declares: caches and the builder's own inputs.
ALWAYS_FORBIDDEN: dict[str, tuple[str, ...]] = {
    "apt cache": (r"var/cache/apt/archives/[^/]+\.deb",),
    "pip cache": (r"root/\.cache/pip/.+", r"home/[^/]+/\.cache/pip/.+"),
    "builder requirements": (r"opt/imgfab/requirements\.(txt|lock)",),
}
# The payload's own CUDA toolkit tree (CUDA 13 wheels: site-packages/nvidia/cuNN), which a
# payload toolchain's CUDA_HOME view points at (compat/backends.yaml toolchain: payload).
_PAYLOAD_TREE = r"opt/venv/lib/python3[0-9.]*/site-packages/nvidia/cu[0-9]+"
PAYLOAD_TOOLKIT: dict[str, str] = {
    "nvcc": _PAYLOAD_TREE + r"/bin/nvcc",
    "cicc": _PAYLOAD_TREE + r"/nvvm/bin/cicc",
    "cuda_runtime.h": _PAYLOAD_TREE + r"/include/cuda_runtime\.h",
    # FlashInfer's sampling kernels include cuRAND's device API (nvidia-curand, a torch wheel)
    "curand_kernel.h": _PAYLOAD_TREE + r"/include/curand_kernel\.h",
    "libcudart": _PAYLOAD_TREE + r"/lib/libcudart\.so\.[0-9]+",
}
# A payload-brought tool is the backend's own dependency (vLLM requires ninja; vLLM 0.22+
# installs nvcc through humming-kernels[cu13]): reported, not a build leftover.
NOTE_ONLY: dict[str, tuple[str, ...]] = {"ninja (Python wheel)": (r"opt/venv/bin/ninja",),
                                         "nvcc (Python wheel)": (PAYLOAD_TOOLKIT["nvcc"],)}
_CHUNK = 4 * 1024 * 1024
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# PEM blocks of a bundle, and URLs with user:password@ (a pip index with credentials).
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?-----END \1-----", re.S)
_URL_CREDENTIALS = re.compile(rb"[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*:([^\s/@]+)@[^\s\"'<>]+")
# Shorter passwords are searched for inside their URL only (alone they match too much).
_MIN_PASSWORD = 6
# Host trust stores whose certificates are public, not secrets (Debian/Ubuntu, RHEL).
SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
_MAX_SECRET_BYTES = 16 * 1024 * 1024


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
    from imgfab.render import LABEL_PREFIX, image_labels  # noqa: PLC0415

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
    """Run every check on image ``ref``. Raises :class:`ValidationFailed` listing the failures
    (unless ``raise_on_failure`` is False); :class:`imgfab.errors.EngineError` if the engine
    cannot inspect or save the image."""
    engine = engine or importlib.import_module("imgfab.engine")
    report = VerifyReport(image=ref)
    info = engine.inspect_image(ref)
    report.findings += _config_findings(info.get("Config") or {}, policy)
    ours = list((info.get("RootFS") or {}).get("Layers") or [])
    scan = _scan_image(ref, info, ours, policy, engine)
    scan.base_count = sum(1 for _ in iter_prefix(ours, list(policy.base_diff_ids)))
    report.findings += scan.findings(policy)
    report.notes += scan.notes
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

    def findings(self, policy: VerifyPolicy) -> list[Finding]:
        result = [
            Finding("layers", not self.unscanned,
                    f"listed layers not scanned: {', '.join(self.unscanned[:5])}"
                    if self.unscanned else f"all {len(self.order)} listed layers scanned"),
            Finding("weights", not self.weights,
                    f"files under {policy.mount_path}: {', '.join(self.weights[:5])}"
                    if self.weights else f"nothing under {policy.mount_path}"),
            Finding("secrets", not self.secrets,
                    f"build secret bytes found: {', '.join(self.secrets[:5])}"
                    if self.secrets else f"no bytes of {', '.join(policy.secrets) or 'no secrets'}"),
        ]
        present = self.final_paths()
        forbidden = {name: pats for name, pats in TOOL_PATHS.items()
                     if name not in policy.declared_toolchain}
        forbidden.update(ALWAYS_FORBIDDEN)
        offenders = []
        for name, patterns in sorted(forbidden.items()):
            hits = sorted(p for p in present if any(re.fullmatch(pat, p) for pat in patterns))
            inherited = [p for p in hits if present[p] < self.base_count]
            if name in ALWAYS_FORBIDDEN and inherited:
                self.notes.append(f"{name} inherited from the runtime base image "
                                  f"(/{inherited[0]}, {len(inherited)} file(s)): not this build's")
                hits = [p for p in hits if p not in inherited]
            if hits:
                offenders.append(f"{name} (/{hits[0]})")
        for name, patterns in NOTE_ONLY.items():
            hits = sorted(p for p in present if any(re.fullmatch(pat, p) for pat in patterns))
            if hits:
                self.notes.append(f"{name} present (/{hits[0]}): a dependency of the payload")
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


_ALL_PATTERNS = re.compile("|".join(f"(?:{p})" for pats in
                                    (*TOOL_PATHS.values(), *ALWAYS_FORBIDDEN.values(),
                                     *NOTE_ONLY.values(), tuple(PAYLOAD_TOOLKIT.values()))
                                    for p in pats))


# Bumped when the scan itself changes, so results of an older scanner are not reused.
_SCANNER_VERSION = "2"


def cache_dir() -> Path:
    """Where per-layer scan results are kept (``$XDG_CACHE_HOME/imgfab/verify``)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "imgfab" / "verify"


def _layer_key(diff_id: str, policy: VerifyPolicy) -> str:
    """A layer's scan result depends only on its content (the diff id), the weights mount,
    the secrets searched for and the path catalogue: all four are in the key."""
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


def _scan_image(ref: str, info: dict[str, Any], layers: list[str], policy: VerifyPolicy,
                engine: Any) -> _LayerScan:
    """Scan every layer once per content: results are cached by diff id, and layers not seen
    before are read from the engine's storage when it is local (else one ``docker save``)."""
    keys = {diff_id: _layer_key(diff_id, policy) for diff_id in layers}
    known = {diff_id: _load_layer(key) for diff_id, key in keys.items()}
    unknown = [d for d in layers if known[d] is None]
    directories = local_layer_dirs(info, layers) if unknown else []
    if unknown and directories is None:
        scan = _scan_layers(engine.save_stream(ref), policy)
        if len(scan.order) != len(layers):
            scan.unscanned.append(f"manifest.json lists {len(scan.order)} layers, the image "
                                  f"has {len(layers)}")
        elif not scan.unscanned:
            for diff_id, name in zip(layers, scan.order):
                _store_layer(keys[diff_id], scan.results[name])
        return scan
    scan = _LayerScan(order=list(layers))
    secret_hits: set[str] = set()
    mount = policy.mount
    for index, diff_id in enumerate(layers):
        result = known[diff_id]
        if result is None:
            assert directories is not None
            result = _scan_directory(directories[index], mount, policy)
            _store_layer(keys[diff_id], result)
        scan.merge(diff_id, result, secret_hits)
    # The image config (history, environment, labels) as the engine reports it.
    config_text = json.dumps([info, engine.image_history(ref)], sort_keys=True).encode()
    for name in _contains(io.BytesIO(config_text), policy.needles()):
        secret_hits.add(f"{name} in the image config")
    scan.secrets = sorted(secret_hits)
    scan.notes.append(f"layers: {len(layers) - len(unknown)} of {len(layers)} known from earlier "
                      f"scans, {len(unknown)} read from the engine's storage")
    return scan


def _scan_directory(root: Path, mount: str, policy: VerifyPolicy) -> dict[str, Any]:
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


def _scan_layers(chunks: Iterable[bytes], policy: VerifyPolicy) -> _LayerScan:
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
