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

from imgfab.errors import CompatibilityError, MatrixError
from imgfab.in_image.rules import compare_versions, major_minor, parse_version
from imgfab.matrix.gpus import NvmlName, check_nvml_names, match_gpu, parse_nvml_names

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
class CudaRuntime(Sourced):
    """A CUDA runtime (cudart) component version → the toolkit release that first ships it.

    The strict driver floor of a payload is that toolkit's ``min_driver``.
    """

    cudart: str
    toolkit: str


@dataclass(frozen=True)
class CudaImage(Sourced):
    cuda: str
    os: str
    flavors: tuple[str, ...]
    eol: bool = False  # NVIDIA marks the tag end-of-life (deleted from Docker Hub six months later)
    platforms: tuple[str, ...] = ("linux/amd64",)

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
    min_driver: str = ""  # the oldest driver that supports this GPU at all (Blackwell: R570)
    min_driver_source: str = ""
    cpu_arch: str = "x86_64"  # hosts this GPU comes in (GH200/GB200/GB300: aarch64 superchips)
    datacenter: bool = True  # forward compatibility is supported on datacenter GPUs only
    nvml_names: tuple[NvmlName, ...] = ()  # product names as NVML / nvidia-smi print them
    # NVIDIA's last driver branch for this GPU's architecture ("" = none announced), from
    # gpus.yaml architectures: a host on a newer branch cannot drive it (Volta: R580).
    last_driver_branch: str = ""
    last_driver_source: str = ""

    @property
    def sm(self) -> str:
        return "sm" + self.compute_capability.replace(".", "")


@dataclass(frozen=True)
class Architecture(Sourced):
    """A GPU architecture, its compute capabilities and NVIDIA's last driver branch for it."""

    name: str
    compute_capabilities: tuple[str, ...]
    last_driver_branch: str = ""  # "" = "Ongoing" in NVIDIA's table


@dataclass(frozen=True)
class PrecisionRule(Sourced):
    backend: str
    precision: str
    min_compute_capability: str | None
    max_compute_capability: str | None
    excluded_compute_capabilities: tuple[str, ...]
    supported: bool
    note: str
    backend_versions: str = ""  # PEP 440 specifier of backend releases the rule covers ("" = all)
    native_min_compute_capability: str | None = None  # below it (≥ min) the precision is not native
    fallback: str = ""  # what runs where it is not native, e.g. "weight-only (Marlin W4A16)"
    # where native is not a range: the capabilities that run it natively (() = nowhere); None: unset
    native_compute_capabilities: tuple[str, ...] | None = None

    def native_on(self, compute_capability: str) -> bool:
        """Whether ``compute_capability`` runs the precision natively (no ``fallback``)."""
        from imgfab.in_image.rules import compare_versions  # noqa: PLC0415

        if self.native_compute_capabilities is not None:
            return any(compare_versions(compute_capability, c) == 0
                       for c in self.native_compute_capabilities)
        native = self.native_min_compute_capability
        return not native or compare_versions(compute_capability, native) >= 0

    def native_text(self) -> str:
        """Where native compute is, for a message: "needs compute capability ≥ 8.9",
        "needs compute capability 9.0 or 10.0", "is on no GPU in this release"."""
        if self.native_compute_capabilities is not None:
            return ("needs compute capability " + " or ".join(self.native_compute_capabilities)
                    if self.native_compute_capabilities else "is on no GPU in this release")
        return f"needs compute capability ≥ {self.native_min_compute_capability}"


@dataclass(frozen=True)
class TorchRelease(Sourced):
    version: str  # a local label names a non-PyPI build: 2.9.1+cu130
    cuda: str
    python: str
    index: str = "https://pypi.org/simple"
    cuda_runtime: str = ""  # nvidia-cuda-runtime (cudart) pin, or the cuda-toolkit release pinned
    sass: tuple[str, ...] = ()  # measured in libtorch_cuda.so (compat refresh)
    ptx: tuple[str, ...] = ()
    fatbin_source: str = ""


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
    torch_index: str = "https://pypi.org/simple"  # where its torch comes from (install guide)
    fatbin_sass: tuple[str, ...] = ()  # measured in the wheel's own CUDA library (compat refresh)
    fatbin_ptx: tuple[str, ...] = ()
    fatbin_source: str = ""
    # When the release was complete on PyPI (the latest upload time of its files, compat
    # refresh): "2026-04-18T05:50:15Z"; "" when not recorded. It bounds the lock (imgfab.payload.era).
    uploaded: str = ""


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
    # Compilers the backend's kernels need at run time on some GPUs (imgfab.stack.toolchain).
    jit_toolchains: tuple[Any, ...] = ()
    # Requirements the payload adds when the recipe spans nodes (target.nodes > 1), e.g. ray.
    multinode_requires: tuple[str, ...] = ()


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
    runtimes: dict[str, CudaRuntime] = field(default_factory=dict)
    driver_branches: list["DriverBranch"] = field(default_factory=list)
    architectures: dict[str, Architecture] = field(default_factory=dict)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    unconfirmed: list[str] = field(default_factory=list)
    advisories: list[Any] = field(default_factory=list)  # imgfab.matrix.advisories.Advisory
    payload_checks: list[Any] = field(default_factory=list)  # imgfab.matrix.payloads.PayloadCheck

    def advisories_for(self, package: str, version: str) -> list[Any]:
        """The advisories whose affected range holds ``package`` ``version``, in file order."""
        return [a for a in self.advisories if a.affects(package, version)]

    def payload_check(self, backend: str, version: str, python: str) -> Any:
        """What ``imgfab compat refresh --payloads`` recorded of ``backend`` ``version``'s payload
        for an image of ``python`` (a :class:`~imgfab.matrix.payloads.PayloadCheck`), or None."""
        return next((c for c in self.payload_checks
                     if (c.backend, c.version, c.python) == (backend, version, python)), None)

    def gpu(self, name: str) -> Gpu | None:
        """Find a GPU by canonical name or alias, case-insensitively."""
        wanted = name.strip().lower()
        for gpu in self.gpus:
            if gpu.name.lower() == wanted or wanted in (a.lower() for a in gpu.aliases):
                return gpu
        return None

    def host_gpu(self, name: str, memory: int | float | str | None = None, *,
                 field: str = "--gpu") -> Gpu:
        """The GPU a host reports as ``name`` (NVML's product name, or a matrix name or alias)
        with ``memory`` (NVML bytes, or nvidia-smi's MiB); :func:`imgfab.matrix.gpus.match_gpu`
        says the rule. Raises RecipeError naming ``field`` when no single GPU fits."""
        return match_gpu(self.gpus, name, memory, field=field)

    def precision_rule(self, backend: str, precision: str, version: str = "") -> PrecisionRule | None:
        """The rule for ``precision`` under ``backend`` (at ``version``, when rules are per range).

        A rule with ``backend_versions`` applies only to releases inside it; the first matching
        rule in file order wins, so a version-ranged rule is listed before the open-ended one.
        """
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        for rule in self.precisions:
            if rule.backend != backend or rule.precision != precision:
                continue
            if rule.backend_versions and version and \
                    not SpecifierSet(rule.backend_versions).contains(Version(version), prereleases=True):
                continue
            if rule.backend_versions and not version:
                continue
            return rule
        return None

    def driver_ceilings(self, archs: tuple[str, ...], exact: bool = False) -> dict[str, str]:
        """Per compute capability that code built for ``archs`` runs on (exactly, for an
        engine), NVIDIA's last driver branch for its architecture; capabilities without one
        are left out. E.g. archs (7.0, 7.5, 8.0) → {"7.0": "580"}."""
        from imgfab.in_image.rules import binary_runs_on  # noqa: PLC0415

        found = {}
        for arch in self.architectures.values():
            if not arch.last_driver_branch:
                continue
            for cc in arch.compute_capabilities:
                runs = cc in archs if exact else binary_runs_on(cc, list(archs))
                if runs:
                    found[cc] = arch.last_driver_branch
        return found

    def image(self, cuda: str, os_name: str) -> CudaImage | None:
        for image in self.images:
            if image.cuda == cuda and image.os == os_name:
                return image
        return None

    def runtime_toolkit(self, runtime: str) -> CudaToolkit | None:
        """The toolkit whose driver a payload's CUDA runtime needs: ``12.8.90`` → 12.8.1.

        ``runtime`` is a cudart component version (``runtimes`` table) or, for torch ≥ 2.11,
        the ``cuda-toolkit`` release it pins (a ``toolkits`` row).
        """
        if runtime in self.runtimes:
            return self.toolkits.get(self.runtimes[runtime].toolkit)
        return self.toolkits.get(runtime)

    def patches(self, cuda_minor: str) -> list[CudaToolkit]:
        """Toolkit releases of one major.minor, newest first."""
        found = [t for v, t in self.toolkits.items() if major_minor(v) == cuda_minor]
        return sorted(found, key=lambda t: parse_version(t.version), reverse=True)

    def backend_releases(self, backend: str) -> list[BackendRelease]:
        """Releases of one backend, newest first."""
        from packaging.version import Version

        found = [r for r in self.releases if r.backend == backend]
        return sorted(found, key=lambda r: Version(r.version), reverse=True)


@dataclass(frozen=True)
class DriverBranch(Sourced):
    """A datacenter driver branch and the CUDA majors it runs under forward compatibility."""

    branch: str  # "535"
    kind: str  # lts | production | feature
    forward_compat_cuda: tuple[str, ...]  # CUDA majors.minors the cuda-compat package supports
    end_of_life: str = ""


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


_UPLOADED = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


def _uploaded(row: dict[str, Any], where: str) -> str:
    """A release's ``uploaded:`` (UTC, to the second, as compat refresh writes it), or ""."""
    value = str(row.get("uploaded") or "")
    if value and not _UPLOADED.match(value):
        raise MatrixError(f"{where}: uploaded {value!r} is not a UTC time like 2026-04-18T05:50:15Z",
                          field="compat")
    return value


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
    runtimes = {
        _str(row, "cudart", "cuda.yaml runtimes"): CudaRuntime(
            cudart=str(row["cudart"]), toolkit=_str(row, "toolkit", "cuda.yaml runtimes"), **_sourced(row))
        for row in cuda.get("runtimes") or [] if row.get("source")
    }
    for row in cuda.get("runtimes") or []:
        note("cudart", str(row.get("cudart")), row)
    driver_branches = [
        DriverBranch(branch=_str(row, "branch", "cuda.yaml driver_branches"), kind=str(row.get("kind", "")),
                     forward_compat_cuda=_tuple(row.get("forward_compat_cuda")),
                     end_of_life=str(row.get("end_of_life") or ""), **_sourced(row))
        for row in cuda.get("driver_branches") or [] if row.get("source")
    ]
    minor_compat = {
        int(row["cuda_major"]): MinorCompat(cuda_major=int(row["cuda_major"]),
                                            min_driver=_str(row, "min_driver", "minor compat"),
                                            limits=str(row.get("limits", "")), **_sourced(row))
        for row in _records(cuda, "minor_version_compat", "cuda.yaml")
    }

    images_data = _read(directory, "cuda_images.yaml")
    images = [CudaImage(cuda=_str(row, "cuda", "cuda_images.yaml"), os=_str(row, "os", "cuda_images.yaml"),
                        flavors=_tuple(row.get("flavors")), eol=bool(row.get("eol", False)),
                        platforms=_tuple(row.get("platforms")) or ("linux/amd64",), **_sourced(row))
              for row in _records(images_data, "images", "cuda_images.yaml")]
    os_releases = {
        _str(row, "name", "cuda_images.yaml os"): OsRelease(name=str(row["name"]),
                                                            python=_str(row, "python", "os"),
                                                            **_sourced(row))
        for row in _records(images_data, "os", "cuda_images.yaml")
    }

    gpus_data = _read(directory, "gpus.yaml")
    architectures = _architectures(gpus_data)
    gpu_rows = _records(gpus_data, "gpus", "gpus.yaml")
    gpus = [Gpu(name=_str(row, "name", "gpus.yaml"), aliases=_tuple(row.get("aliases")),
                compute_capability=_str(row, "compute_capability", f"gpu {row.get('name')}"),
                architecture=str(row.get("architecture", "")),
                memory_gib=float(row.get("memory_gib") or 0),
                min_driver=str(row.get("min_driver") or ""),
                min_driver_source=str(row.get("min_driver_source") or ""),
                cpu_arch=str(row.get("cpu_arch") or "x86_64"),
                datacenter=bool(row.get("datacenter", True)),
                nvml_names=parse_nvml_names(row.get("nvml_names"), f"gpu {row.get('name')}"),
                **_ceiling(architectures, row), **_sourced(row))
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
                      backend_versions=str(row.get("backend_versions") or ""),
                      native_min_compute_capability=_opt(row.get("native_min_compute_capability")),
                      fallback=str(row.get("fallback") or ""),
                      native_compute_capabilities=(None if row.get("native_compute_capabilities") is None
                                                   else _tuple(row.get("native_compute_capabilities"))),
                      **_sourced(row))
        for row in _records(_read(directory, "precisions.yaml"), "precisions", "precisions.yaml")
    ]

    torch = {
        _str(row, "version", "torch.yaml"): TorchRelease(
            version=str(row["version"]), cuda=_str(row, "cuda", f"torch {row['version']}"),
            python=str(row.get("python", "")), index=str(row.get("index") or "https://pypi.org/simple"),
            cuda_runtime=str(row.get("cuda_runtime") or ""), sass=_tuple(row.get("fatbin_sass")),
            ptx=_tuple(row.get("fatbin_ptx")), fatbin_source=str(row.get("fatbin_source") or ""),
            **_sourced(row))
        for row in _records(_read(directory, "torch.yaml"), "releases", "torch.yaml")
    }
    for row in _read(directory, "torch.yaml")["releases"]:
        note("torch", str(row["version"]), row)

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
                torch_index=str(row.get("torch_index") or "https://pypi.org/simple"),
                fatbin_sass=_tuple(row.get("fatbin_sass")), fatbin_ptx=_tuple(row.get("fatbin_ptx")),
                fatbin_source=str(row.get("fatbin_source") or ""),
                uploaded=_uploaded(row, where), **_sourced(row)))
            note(backend, version, row)

    profiles = {
        _str(row, "backend", "backends.yaml"): BackendProfile(
            backend=str(row["backend"]), runtime_flavor=_str(row, "runtime_flavor", "backends.yaml"),
            runtime_packages=_tuple(row.get("runtime_packages")),
            runtime_toolchain=_tuple(row.get("runtime_toolchain")),
            builder_packages=_tuple(row.get("builder_packages")),
            weights_required=_str(row, "weights_required", "backends.yaml"),
            reason=str(row.get("reason", "")),
            jit_toolchains=_jit_toolchains(row),
            multinode_requires=_tuple(row.get("multinode_requires")), **_sourced(row))
        for row in _records(_read(directory, "backends.yaml"), "backends", "backends.yaml")
    }

    for record in (*toolkits.values(), *minor_compat.values(), *images, *os_releases.values(),
                   *architectures.values(), *gpus, *(entry for gpu in gpus for entry in gpu.nvml_names),
                   *precisions, *torch.values(), *releases, *profiles.values(),
                   *(jit for profile in profiles.values() for jit in profile.jit_toolchains)):
        validate_record(record)
    check_nvml_names(gpus)
    matrix = Matrix(toolkits=toolkits, minor_compat=minor_compat, images=images,
                    os_releases=os_releases, gpus=gpus, precisions=precisions, torch=torch,
                    releases=[], profiles=profiles, runtimes=runtimes,
                    driver_branches=driver_branches, architectures=architectures,
                    unconfirmed=unconfirmed)
    from imgfab.matrix.advisories import load_advisories  # noqa: PLC0415 - it builds on this module

    matrix.advisories = load_advisories(directory)
    from imgfab.matrix.payloads import load_payload_checks  # noqa: PLC0415 - it builds on this module

    matrix.payload_checks = load_payload_checks(directory)
    matrix.releases, matrix.dropped = _buildable(matrix, releases)
    return matrix


def _architectures(data: dict[str, Any]) -> dict[str, Architecture]:
    """gpus.yaml ``architectures``: name → :class:`Architecture`; a duplicate is malformed."""
    found: dict[str, Architecture] = {}
    for row in _records(data, "architectures", "gpus.yaml"):
        name = _str(row, "name", "gpus.yaml architectures")
        if name in found:
            raise MatrixError(f"gpus.yaml: architecture {name!r} is listed twice")
        found[name] = Architecture(name=name, compute_capabilities=_tuple(row.get("compute_capabilities")),
                                   last_driver_branch=_opt(row.get("last_driver_branch")) or "",
                                   **_sourced(row))
    return found


def _ceiling(architectures: dict[str, Architecture], row: dict[str, Any]) -> dict[str, str]:
    """The ``last_driver_*`` fields of one gpus.yaml row, from its architecture's row. A GPU
    whose architecture is not listed is malformed data (its ceiling would be silently unknown)."""
    where = f"gpus.yaml gpu {row.get('name')}"
    arch = architectures.get(str(row.get("architecture", "")))
    if arch is None:
        raise MatrixError(f"{where}: architecture {row.get('architecture')!r} has no architectures row")
    return {"last_driver_branch": arch.last_driver_branch,
            "last_driver_source": arch.source if arch.last_driver_branch else ""}


def _jit_toolchains(row: dict[str, Any]) -> tuple[Any, ...]:
    from imgfab.matrix.toolchains import parse_jit_toolchains  # noqa: PLC0415

    try:
        return parse_jit_toolchains(row.get("jit_toolchains"), f"backends.yaml {row.get('backend')}")
    except ValueError as exc:
        raise MatrixError(str(exc), field="compat/backends.yaml") from None


# compat data is validated like recipe data: values reach Dockerfiles, lock files and labels.
# No record value may hold a control character (a newline would start a Dockerfile
# instruction); fields that reach a Dockerfile or a shell must fully match their pattern.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_VERSION = r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}"
_SPECIFIER = r"[<>=!~]{0,3}[ ]*[0-9A-Za-z.*+_-]{1,64}([ ]*,[ ]*[<>=!~]{1,3}[ ]*[0-9A-Za-z.*+_-]{1,64}){0,7}"
_FIELD_PATTERNS: dict[str, str] = {
    "version": _VERSION, "cuda": _VERSION, "min_driver": r"([0-9]{1,4}(\.[0-9]{1,4}){0,2})?",
    "os": r"[a-z][a-z0-9.]{0,31}", "name": r"[A-Za-z0-9][A-Za-z0-9 ._()-]{0,63}",
    "flavors": r"[a-z][a-z0-9-]{0,31}", "runtime_flavor": r"([a-z][a-z0-9-]{0,31})?",
    "toolchain": r"image|payload", "backend_versions": rf"({_SPECIFIER})?",
    # a PEP 508 name with extras (no version: the lock pins it), e.g. cuda-toolkit[nvcc,nvvm]
    "payload_requirements": r"[a-z0-9][a-z0-9._-]{0,63}(\[[a-z0-9][a-z0-9,._-]{0,127}\])?",
    "python": rf"({_SPECIFIER})?", "torch": rf"({_SPECIFIER})?", "tensorrt": rf"({_SPECIFIER})?",
    "compute_capability": r"[0-9]{1,2}\.[0-9]{1,2}",
    "compute_capabilities": r"[0-9]{1,2}\.[0-9]{1,2}",
    "native_compute_capabilities": r"[0-9]{1,2}\.[0-9]{1,2}", "last_driver_branch": r"([0-9]{3,4})?",
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


def tensorrt_pin(requirement: str, trtllm_version: str, compat_dir: Path | None = None) -> str:
    """The newest TensorRT release in ``compat/tensorrt.yaml`` inside ``requirement`` (the
    TensorRT-LLM release's own, e.g. ``~=10.14.1``).

    TensorRT-LLM pins ``tensorrt~=X.Y.Z``; the image pins one exact version so the engine's
    TensorRT version (a cache-key component and a label) is known before the build.
    """
    from packaging.specifiers import SpecifierSet  # noqa: PLC0415
    from packaging.version import InvalidVersion, Version  # noqa: PLC0415

    directory = compat_dir or default_compat_dir()
    with (directory / "tensorrt.yaml").open(encoding="utf-8") as handle:
        rows = yaml.safe_load(handle)["releases"]
    spec = SpecifierSet(requirement)
    fitting = []
    for row in rows:
        try:
            if Version(str(row["version"])) in spec:
                fitting.append(str(row["version"]))
        except InvalidVersion:
            continue
    if not requirement or not fitting:
        raise CompatibilityError(
            f"TensorRT-LLM {trtllm_version} is incompatible with compat/tensorrt.yaml: "
            f"no TensorRT release satisfies {requirement or 'an empty requirement'}",
            field="backend.version", fix="run `imgfab compat refresh`")
    return max(fitting, key=Version)


__all__ = ["Matrix", "load_matrix", "default_compat_dir", "compare_versions", "tensorrt_pin"]
