"""Load the compatibility matrix from ``compat/*.yaml`` into a :class:`Matrix`.

The data is flat, sorted and sourced (see ``compat/README.md``). Loading validates the shape
of every record (a malformed file raises :class:`~imgfab.errors.MatrixError`), and drops at load
time every backend release that cannot be built here — no CUDA toolkit or ``nvidia/cuda``
image for its CUDA — recording why in :attr:`Matrix.dropped`, so the resolver never offers it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from imgfab.errors import MatrixError
from imgfab.rules import compare_versions, major_minor, parse_version

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def default_compat_dir() -> Path:
    """The matrix shipped inside the package (``compat/`` of the source tree)."""
    return Path(str(resources.files("imgfab") / "_data" / "compat"))


@dataclass(frozen=True)
class Sourced:
    source: str
    confirmed: bool


@dataclass(frozen=True)
class CudaToolkit(Sourced):
    version: str
    min_driver: str


@dataclass(frozen=True)
class MinorCompat(Sourced):
    cuda_major: int
    min_driver: str
    limits: str


@dataclass(frozen=True)
class CudaImage(Sourced):
    cuda: str
    os: str
    flavors: tuple[str, ...]

    def ref(self, flavor: str) -> str:
        """Upstream reference, e.g. ``nvidia/cuda:12.8.1-devel-ubuntu22.04``."""
        return f"nvidia/cuda:{self.cuda}-{flavor}-{self.os}"


@dataclass(frozen=True)
class OsRelease(Sourced):
    name: str
    python: str


@dataclass(frozen=True)
class Gpu(Sourced):
    name: str
    aliases: tuple[str, ...]
    compute_capability: str
    architecture: str
    memory_gib: float

    @property
    def sm(self) -> str:
        return "sm" + self.compute_capability.replace(".", "")


@dataclass(frozen=True)
class PrecisionRule(Sourced):
    backend: str
    precision: str
    min_compute_capability: str | None
    max_compute_capability: str | None
    excluded_compute_capabilities: tuple[str, ...]
    supported: bool
    note: str


@dataclass(frozen=True)
class TorchRelease(Sourced):
    version: str
    cuda: str
    python: str


@dataclass(frozen=True)
class BackendRelease(Sourced):
    """One release of a serving backend, as published (PyPI metadata + upstream build files)."""

    backend: str
    version: str
    cuda: str  # major.minor of the CUDA its wheels are built for
    torch: str  # PEP 440 specifier
    python: str  # PEP 440 specifier
    cuda_archs: tuple[str, ...]
    wheel_tags: tuple[str, ...]
    python_versions: tuple[str, ...] = ()  # CPython minors with wheels, when the tags are unknown
    tensorrt: str = ""
    base_image: str = ""
    system_packages: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class BackendProfile(Sourced):
    """How a backend family is packaged: runtime base flavor and what serving needs at run time."""

    backend: str
    runtime_flavor: str
    runtime_packages: tuple[str, ...]
    runtime_toolchain: tuple[str, ...]
    builder_packages: tuple[str, ...]
    weights_required: str
    reason: str


@dataclass
class Matrix:
    toolkits: dict[str, CudaToolkit]
    minor_compat: dict[int, MinorCompat]
    images: list[CudaImage]
    os_releases: dict[str, OsRelease]
    gpus: list[Gpu]
    precisions: list[PrecisionRule]
    torch: dict[str, TorchRelease]
    releases: list[BackendRelease]
    profiles: dict[str, BackendProfile]
    dropped: list[tuple[str, str]] = field(default_factory=list)
    unconfirmed: list[str] = field(default_factory=list)

    def gpu(self, name: str) -> Gpu | None:
        """Find a GPU by canonical name or alias, case-insensitively."""
        wanted = name.strip().lower()
        for gpu in self.gpus:
            if gpu.name.lower() == wanted or wanted in (a.lower() for a in gpu.aliases):
                return gpu
        return None

    def precision_rule(self, backend: str, precision: str) -> PrecisionRule | None:
        for rule in self.precisions:
            if rule.backend == backend and rule.precision == precision:
                return rule
        return None

    def image(self, cuda: str, os_name: str) -> CudaImage | None:
        for image in self.images:
            if image.cuda == cuda and image.os == os_name:
                return image
        return None

    def patches(self, cuda_minor: str) -> list[CudaToolkit]:
        """Toolkit releases of one major.minor, newest first."""
        found = [t for v, t in self.toolkits.items() if major_minor(v) == cuda_minor]
        return sorted(found, key=lambda t: parse_version(t.version), reverse=True)

    def backend_releases(self, backend: str) -> list[BackendRelease]:
        """Releases of one backend, newest first."""
        from packaging.version import Version

        found = [r for r in self.releases if r.backend == backend]
        return sorted(found, key=lambda r: Version(r.version), reverse=True)


def _read(directory: Path, name: str) -> dict[str, Any]:
    path = directory / name
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except FileNotFoundError:
        raise MatrixError(f"compat file missing: {path}") from None
    except yaml.YAMLError as exc:
        raise MatrixError(f"compat file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise MatrixError(f"compat file {path} must be a mapping")
    return data


def _records(data: dict[str, Any], key: str, path: str) -> list[dict[str, Any]]:
    rows = data.get(key)
    if not isinstance(rows, list):
        raise MatrixError(f"{path}: '{key}' must be a list of records")
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or not row.get("source"):
            raise MatrixError(f"{path}: {key}[{index}] has no source")
    return rows


def _sourced(row: dict[str, Any]) -> dict[str, Any]:
    return {"source": str(row["source"]), "confirmed": bool(row.get("confirmed", False))}


def _str(row: dict[str, Any], key: str, where: str) -> str:
    value = row.get(key)
    if value is None or isinstance(value, (dict, list)):
        raise MatrixError(f"{where}: missing or malformed '{key}'")
    return str(value)


def _tuple(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


def load_matrix(directory: Path | None = None) -> Matrix:
    """Load and cross-check every compat file. Raises MatrixError on malformed data."""
    directory = Path(directory) if directory else default_compat_dir()
    unconfirmed: list[str] = []

    def note(kind: str, key: str, row: dict[str, Any]) -> None:
        if not row.get("confirmed", False):
            unconfirmed.append(f"{kind} {key}: {row.get('note', 'unconfirmed')}")

    cuda = _read(directory, "cuda.yaml")
    toolkits: dict[str, CudaToolkit] = {}
    for row in _records(cuda, "toolkits", "cuda.yaml"):
        version = _str(row, "version", "cuda.yaml toolkits")
        # A release whose notes give no driver floor keeps min_driver "": no strict stack uses it.
        toolkits[version] = CudaToolkit(version=version, min_driver=_opt(row.get("min_driver")) or "",
                                        **_sourced(row))
        note("cuda", version, row)
    minor_compat = {
        int(row["cuda_major"]): MinorCompat(cuda_major=int(row["cuda_major"]),
                                            min_driver=_str(row, "min_driver", "minor compat"),
                                            limits=str(row.get("limits", "")), **_sourced(row))
        for row in _records(cuda, "minor_version_compat", "cuda.yaml")
    }

    images_data = _read(directory, "cuda_images.yaml")
    images = [CudaImage(cuda=_str(row, "cuda", "cuda_images.yaml"), os=_str(row, "os", "cuda_images.yaml"),
                        flavors=_tuple(row.get("flavors")), **_sourced(row))
              for row in _records(images_data, "images", "cuda_images.yaml")]
    os_releases = {
        _str(row, "name", "cuda_images.yaml os"): OsRelease(name=str(row["name"]),
                                                            python=_str(row, "python", "os"),
                                                            **_sourced(row))
        for row in _records(images_data, "os", "cuda_images.yaml")
    }

    gpu_rows = _records(_read(directory, "gpus.yaml"), "gpus", "gpus.yaml")
    gpus = [Gpu(name=_str(row, "name", "gpus.yaml"), aliases=_tuple(row.get("aliases")),
                compute_capability=_str(row, "compute_capability", f"gpu {row.get('name')}"),
                architecture=str(row.get("architecture", "")),
                memory_gib=float(row.get("memory_gib") or 0), **_sourced(row))
            for row in gpu_rows]
    for row in gpu_rows:
        note("gpu", str(row.get("name")), row)

    precisions = [
        PrecisionRule(backend=_str(row, "backend", "precisions.yaml"),
                      precision=_str(row, "precision", "precisions.yaml"),
                      min_compute_capability=_opt(row.get("min_compute_capability")),
                      max_compute_capability=_opt(row.get("max_compute_capability")),
                      excluded_compute_capabilities=_tuple(row.get("excluded_compute_capabilities")),
                      supported=bool(row.get("supported", True)), note=str(row.get("note", "")),
                      **_sourced(row))
        for row in _records(_read(directory, "precisions.yaml"), "precisions", "precisions.yaml")
    ]

    torch = {
        _str(row, "version", "torch.yaml"): TorchRelease(
            version=str(row["version"]), cuda=_str(row, "cuda", f"torch {row['version']}"),
            python=str(row.get("python", "")), **_sourced(row))
        for row in _records(_read(directory, "torch.yaml"), "releases", "torch.yaml")
    }

    releases: list[BackendRelease] = []
    for backend, filename in (("vllm", "vllm.yaml"), ("tensorrt-llm", "tensorrt_llm.yaml")):
        for row in _records(_read(directory, filename), "releases", filename):
            version = _str(row, "version", filename)
            where = f"{filename} {version}"
            releases.append(BackendRelease(
                backend=backend, version=version, cuda=_str(row, "cuda", where),
                torch=str(row.get("torch") or ""), python=str(row.get("python") or ""),
                cuda_archs=_tuple(row.get("cuda_archs")), wheel_tags=_tuple(row.get("wheel_tags")),
                python_versions=_tuple(row.get("python_classifiers")),
                tensorrt=str(row.get("tensorrt") or ""), base_image=str(row.get("base_image") or ""),
                system_packages=_tuple(row.get("system_packages")), note=str(row.get("note", "")),
                **_sourced(row)))
            note(backend, version, row)

    profiles = {
        _str(row, "backend", "backends.yaml"): BackendProfile(
            backend=str(row["backend"]), runtime_flavor=_str(row, "runtime_flavor", "backends.yaml"),
            runtime_packages=_tuple(row.get("runtime_packages")),
            runtime_toolchain=_tuple(row.get("runtime_toolchain")),
            builder_packages=_tuple(row.get("builder_packages")),
            weights_required=_str(row, "weights_required", "backends.yaml"),
            reason=str(row.get("reason", "")), **_sourced(row))
        for row in _records(_read(directory, "backends.yaml"), "backends", "backends.yaml")
    }

    for record in (*toolkits.values(), *minor_compat.values(), *images, *os_releases.values(),
                   *gpus, *precisions, *torch.values(), *releases, *profiles.values()):
        validate_record(record)
    matrix = Matrix(toolkits=toolkits, minor_compat=minor_compat, images=images,
                    os_releases=os_releases, gpus=gpus, precisions=precisions, torch=torch,
                    releases=[], profiles=profiles, unconfirmed=unconfirmed)
    matrix.releases, matrix.dropped = _buildable(matrix, releases)
    return matrix


# compat data is validated like recipe data: values reach Dockerfiles, lock files and labels.
# No record value may hold a control character (a newline would start a Dockerfile
# instruction); fields that reach a Dockerfile or a shell must fully match their pattern.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_VERSION = r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}"
_SPECIFIER = r"[<>=!~]{0,3}[ ]*[0-9A-Za-z.*+_-]{1,64}([ ]*,[ ]*[<>=!~]{1,3}[ ]*[0-9A-Za-z.*+_-]{1,64}){0,7}"
_FIELD_PATTERNS: dict[str, str] = {
    "version": _VERSION, "cuda": _VERSION, "min_driver": r"([0-9]{1,4}(\.[0-9]{1,4}){0,2})?",
    "os": r"[a-z][a-z0-9.]{0,31}", "name": r"[A-Za-z0-9][A-Za-z0-9 ._()-]{0,63}",
    "flavors": r"[a-z][a-z0-9-]{0,31}", "runtime_flavor": r"[a-z][a-z0-9-]{0,31}",
    "python": rf"({_SPECIFIER})?", "torch": rf"({_SPECIFIER})?", "tensorrt": rf"({_SPECIFIER})?",
    "compute_capability": r"[0-9]{1,2}\.[0-9]{1,2}",
    "cuda_archs": r"[0-9]{1,2}\.[0-9]{1,2}[af]?", "python_versions": r"[0-9]\.[0-9]{1,2}",
    "wheel_tags": r"[A-Za-z0-9._]{1,40}-[A-Za-z0-9._]{1,40}-[A-Za-z0-9._]{1,80}",
    "base_image": r"([a-z0-9][a-z0-9._/:@-]{0,255})?",
    # Debian package names (Policy 5.6.1), and the tool names verify knows
    "system_packages": r"[a-z0-9][a-z0-9+.-]{0,127}", "runtime_packages": r"[a-z0-9][a-z0-9+.-]{0,127}",
    "builder_packages": r"[a-z0-9][a-z0-9+.-]{0,127}", "runtime_toolchain": r"[a-z0-9][a-z0-9+.-]{0,127}",
    "weights_required": r"[A-Za-z0-9._*|,-]{1,256}", "backend": r"[a-z][a-z0-9-]{0,31}",
    "precision": r"[a-z][a-z0-9_]{0,31}",
}
_MAX_TEXT = 4096  # notes, sources, limits: prose, but bounded


def validate_record(record: Any) -> None:
    """Raise MatrixError when a field of a compat ``record`` holds a control character, is
    longer than a bound, or (for a field that reaches a Dockerfile) does not fully match its
    pattern."""
    kind = type(record).__name__
    for spec in fields(record):
        value = getattr(record, spec.name)
        values = value if isinstance(value, tuple) else (value,)
        for item in values:
            if not isinstance(item, str):
                continue
            pattern = _FIELD_PATTERNS.get(spec.name)
            if _CONTROL.search(item) or len(item) > _MAX_TEXT or (
                    pattern is not None and not re.fullmatch(pattern, item)):
                shown = item if len(item) <= 40 else item[:40] + "…"
                raise MatrixError(f"compat {kind} field {spec.name} = {shown!r} is not valid "
                                  "compat data", field="compat",
                                  fix="fix the record (values reach Dockerfiles: no line breaks, "
                                      "only the characters its kind allows)")


def _opt(value: Any) -> str | None:
    return None if value in (None, "") else str(value)


def _buildable(matrix: Matrix, releases: list[BackendRelease]) -> tuple[list[BackendRelease], list[tuple[str, str]]]:
    """Keep releases that can be built: their CUDA has a toolkit row and an nvidia/cuda image."""
    kept: list[BackendRelease] = []
    dropped: list[tuple[str, str]] = []
    for release in releases:
        label = f"{release.backend} {release.version}"
        try:
            cuda_minor = major_minor(release.cuda)
        except ValueError:
            dropped.append((label, f"CUDA '{release.cuda}' is not a version"))
            continue
        patches = matrix.patches(cuda_minor)
        if not patches:
            dropped.append((label, f"no CUDA {cuda_minor} toolkit in compat/cuda.yaml"))
            continue
        if not any(matrix.image(t.version, os_name) for t in patches for os_name in matrix.os_releases):
            dropped.append((label, f"no nvidia/cuda {cuda_minor}.x image in compat/cuda_images.yaml"))
            continue
        if release.backend not in matrix.profiles:
            dropped.append((label, "no packaging profile in compat/backends.yaml"))
            continue
        kept.append(release)
    from packaging.version import Version

    kept.sort(key=lambda r: (r.backend, Version(r.version)))
    return kept, dropped


__all__ = ["Matrix", "load_matrix", "default_compat_dir", "compare_versions"]
