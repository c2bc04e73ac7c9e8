"""Load the compatibility matrix from ``compat/*.yaml`` into a :class:`Matrix`.

The data is flat, sorted and sourced (see ``compat/README.md``). Loading validates the shape
of every record (a malformed file raises :class:`~imgfab.errors.MatrixError`), and drops at load
time every backend release that cannot be built here — no CUDA toolkit or ``nvidia/cuda``
image for its CUDA, no TensorRT release for its CUDA major — recording why in
:attr:`Matrix.dropped`, so the resolver never offers it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from imgfab.errors import CompatibilityError, MatrixError
from imgfab.in_image.rules import compare_versions, major_minor, parse_version
from imgfab.matrix.advisories import Advisory, load_advisories
from imgfab.matrix.gpus import check_nvml_names, match_gpu, parse_nvml_names, parse_reported_mib
from imgfab.matrix.payloads import PayloadCheck, load_payload_checks
# The record types and the YAML helpers live in imgfab.matrix.records; they are importable from
# here as before.
from imgfab.matrix.triton import TritonLaunchers, load_triton_launchers
from imgfab.matrix.records import (Architecture, BackendGpuSupport, BackendProfile, BackendRelease, CudaImage, CudaRuntime,
                                   CudaToolkit, DriverBranch, Gpu, MinorCompat, NvmlName, OsRelease,
                                   PrecisionRule, Sourced, TensorRTRelease, TorchRelease, _opt, _read, _records, _sourced,
                                   _str, _tuple, _uploaded, validate_record)


def default_compat_dir() -> Path:
    """The matrix shipped inside the package (``compat/`` of the source tree)."""
    return Path(str(resources.files("imgfab") / "_data" / "compat"))


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
    driver_branches: list[DriverBranch] = field(default_factory=list)
    architectures: dict[str, Architecture] = field(default_factory=dict)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    unconfirmed: list[str] = field(default_factory=list)
    advisories: list[Advisory] = field(default_factory=list)
    tensorrt: list[TensorRTRelease] = field(default_factory=list)  # compat/tensorrt.yaml
    payload_checks: list[PayloadCheck] = field(default_factory=list)  # compat/payloads.yaml
    # backends.yaml gpu_support: backend → the oldest GPU it supports at all
    gpu_support: dict[str, BackendGpuSupport] = field(default_factory=dict)
    triton_launchers: list[TritonLaunchers] = field(default_factory=list)  # compat/triton_launchers.yaml

    def advisories_for(self, package: str, version: str) -> list[Advisory]:
        """The advisories whose affected range holds ``package`` ``version``, in file order."""
        return [a for a in self.advisories if a.affects(package, version)]

    def payload_check(self, backend: str, version: str, python: str) -> PayloadCheck | None:
        """What ``imgfab compat refresh --payloads`` recorded of ``backend`` ``version``'s payload
        for an image of ``python``, or None."""
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
                                        cudart=_opt(row.get("cudart")) or "", **_sourced(row))
        note("cuda", version, row)
    runtimes = {
        _str(row, "cudart", "cuda.yaml runtimes"): CudaRuntime(
            cudart=str(row["cudart"]), toolkit=_str(row, "toolkit", "cuda.yaml runtimes"), **_sourced(row))
        for row in _records(cuda, "runtimes", "cuda.yaml", required=False)
    }
    for row in _records(cuda, "runtimes", "cuda.yaml", required=False):
        note("cudart", str(row.get("cudart")), row)
    driver_branches = [
        DriverBranch(branch=_str(row, "branch", "cuda.yaml driver_branches"), kind=str(row.get("kind", "")),
                     forward_compat_cuda=_tuple(row.get("forward_compat_cuda")),
                     end_of_life=str(row.get("end_of_life") or ""), **_sourced(row))
        for row in _records(cuda, "driver_branches", "cuda.yaml", required=False)
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
                **parse_reported_mib(row, f"gpu {row.get('name')}"),
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

    backends = _read(directory, "backends.yaml")
    profiles = {
        _str(row, "backend", "backends.yaml"): BackendProfile(
            backend=str(row["backend"]), runtime_flavor=_str(row, "runtime_flavor", "backends.yaml"),
            runtime_packages=_tuple(row.get("runtime_packages")),
            runtime_toolchain=_tuple(row.get("runtime_toolchain")),
            builder_packages=_tuple(row.get("builder_packages")),
            weights_required=_str(row, "weights_required", "backends.yaml"),
            reason=str(row.get("reason", "")),
            jit_toolchains=_jit_toolchains(row),
            multinode_requires=_tuple(row.get("multinode_requires")),
            triton_toolchain=_tuple(row.get("triton_toolchain")),
            jit_monitor_versions=str(row.get("jit_monitor_versions") or ""),
            jit_monitor_source=str(row.get("jit_monitor_source") or ""), **_sourced(row))
        for row in _records(backends, "backends", "backends.yaml")
    }
    gpu_support = {
        _str(row, "backend", "backends.yaml gpu_support"): BackendGpuSupport(
            backend=str(row["backend"]),
            min_compute_capability=_str(row, "min_compute_capability", "backends.yaml gpu_support"),
            note=str(row.get("note", "")), **_sourced(row))
        for row in _records(backends, "gpu_support", "backends.yaml", required=False)
    }

    for record in (*toolkits.values(), *minor_compat.values(), *images, *os_releases.values(),
                   *architectures.values(), *gpus, *(entry for gpu in gpus for entry in gpu.nvml_names),
                   *precisions, *torch.values(), *releases, *profiles.values(), *gpu_support.values(),
                   *(jit for profile in profiles.values() for jit in profile.jit_toolchains)):
        validate_record(record)
    check_nvml_names(gpus)
    matrix = Matrix(toolkits=toolkits, minor_compat=minor_compat, images=images,
                    os_releases=os_releases, gpus=gpus, precisions=precisions, torch=torch,
                    releases=[], profiles=profiles, runtimes=runtimes,
                    driver_branches=driver_branches, architectures=architectures,
                    unconfirmed=unconfirmed, tensorrt=load_tensorrt(directory), gpu_support=gpu_support)
    matrix.advisories = load_advisories(directory)
    matrix.payload_checks = load_payload_checks(directory)
    matrix.triton_launchers = load_triton_launchers(directory)
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



def _buildable(matrix: Matrix, releases: list[BackendRelease]) -> tuple[list[BackendRelease], list[tuple[str, str]]]:
    """Keep releases that can be built: their CUDA has a toolkit row and an nvidia/cuda image,
    and a TensorRT-LLM release's TensorRT requirement has a release for that CUDA major."""
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
        if release.backend == "tensorrt-llm" and not _tensorrt_fitting(release.tensorrt, release.cuda, matrix.tensorrt):
            dropped.append((label, f"no TensorRT release for CUDA {cuda_minor.split('.')[0]} in "
                                   f"compat/tensorrt.yaml satisfies {release.tensorrt or 'its empty requirement'}"))
            continue
        kept.append(release)
    from packaging.version import Version

    kept.sort(key=lambda r: (r.backend, Version(r.version)))
    return kept, dropped


def load_tensorrt(directory: Path) -> list[TensorRTRelease]:
    """The releases of ``directory/tensorrt.yaml``, in file order. Each needs a source, a PEP 440
    version and the CUDA major it is built for (empty only on a row that is not confirmed); a
    malformed row raises MatrixError naming it."""
    from packaging.version import InvalidVersion, Version  # noqa: PLC0415

    found = []
    for index, row in enumerate(_records(_read(directory, "tensorrt.yaml"), "releases", "tensorrt.yaml")):
        release = TensorRTRelease(version=_str(row, "version", f"tensorrt.yaml releases[{index}]"),
                                  cuda_major=str(row.get("cuda_major") or ""), **_sourced(row))
        where = f"releases[{index}] ({release.version!r})"
        try:
            Version(release.version)
        except InvalidVersion:
            raise MatrixError(f"{where}: version is not a PEP 440 version", field="compat/tensorrt.yaml",
                              fix="the version as PyPI lists it") from None
        if not release.cuda_major and release.confirmed:
            raise MatrixError(f"{where} is confirmed but names no cuda_major", field="compat/tensorrt.yaml",
                              fix="the CUDA major of the tensorrt_cuXX package its metapackage requires")
        validate_record(release)
        found.append(release)
    return found


def _tensorrt_fitting(requirement: str, cuda: str, releases: list[TensorRTRelease]) -> list[str]:
    """The versions of ``releases`` inside ``requirement`` built for the major of ``cuda`` (none
    for an empty or unparsable requirement)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet  # noqa: PLC0415
    from packaging.version import Version  # noqa: PLC0415

    if not requirement:
        return []
    try:
        spec = SpecifierSet(requirement)
    except InvalidSpecifier:
        return []
    major = cuda.split(".")[0]
    return [r.version for r in releases if r.cuda_major == major and Version(r.version) in spec]


def tensorrt_pin(requirement: str, trtllm_version: str, cuda: str, releases: list[TensorRTRelease]) -> str:
    """The newest TensorRT of ``releases`` (:func:`load_tensorrt`) inside ``requirement`` (the
    TensorRT-LLM release's own, e.g. ``~=10.14.1``) and built for the major of ``cuda``, the
    stack's CUDA: a TensorRT built for another major would not load its CUDA libraries.

    TensorRT-LLM pins ``tensorrt~=X.Y.Z``; the image pins one exact version so the engine's
    TensorRT version (a cache-key component and a label) is known before the build. Raises
    CompatibilityError when no release fits (the matrix drops such TensorRT-LLM releases at load).
    """
    from packaging.version import Version  # noqa: PLC0415

    fitting = _tensorrt_fitting(requirement, cuda, releases)
    if not fitting:
        raise CompatibilityError(
            f"TensorRT-LLM {trtllm_version} is incompatible with compat/tensorrt.yaml: "
            f"no TensorRT release for CUDA {cuda.split('.')[0]} satisfies "
            f"{requirement or 'an empty requirement'}",
            field="backend.version", fix="run `imgfab compat refresh`")
    return max(fitting, key=Version)


__all__ = ["Architecture", "BackendGpuSupport", "BackendProfile", "BackendRelease", "CudaImage", "CudaRuntime", "CudaToolkit",
           "DriverBranch", "Gpu", "Matrix", "MinorCompat", "NvmlName", "OsRelease", "PrecisionRule", "Sourced",
           "TensorRTRelease", "TorchRelease", "compare_versions", "default_compat_dir", "load_matrix",
           "load_tensorrt", "tensorrt_pin", "validate_record"]
