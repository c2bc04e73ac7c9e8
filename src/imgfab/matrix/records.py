"""The records of the compatibility matrix and the helpers that read them from ``compat/*.yaml``.

One frozen dataclass per kind of fact (each :class:`Sourced`: where it comes from, whether it is
confirmed), the YAML reading helpers every loader shares (:func:`_read`, :func:`_records`, …) and
:func:`validate_record`, which checks a record's values before they can reach a Dockerfile.
:mod:`imgfab.matrix.compat`, :mod:`imgfab.matrix.gpus` and :mod:`imgfab.matrix.advisories` build
on this module, which imports none of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from imgfab.errors import MatrixError
from imgfab.in_image.rules import compare_versions

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Sourced:
    source: str
    confirmed: bool


@dataclass(frozen=True)
class CudaToolkit(Sourced):
    version: str
    min_driver: str
    # the nvidia-cuda-runtime the release's cuda-toolkit metapackage pins (torch >= 2.11 pins the
    # metapackage): 13.0.3 pins cudart 13.0.96, which 13.0.2 shipped first ("" when not recorded)
    cudart: str = ""


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
class NvmlName:
    """One product name as NVML reports it, and where that string was seen."""

    name: str
    source: str
    confirmed: bool
    note: str = ""


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
    # The total memory NVML / nvidia-smi report for this GPU, in MiB (0 = none recorded: the fit
    # then counts matrix.gpus.FALLBACK_FRACTION of memory_gib), and where it was seen.
    reported_mib: int = 0
    reported_mib_source: str = ""
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
    # What runtime_toolchain holds only for Triton's launcher builds: dropped where the builder
    # compiles the launchers (compat/triton_launchers.yaml).
    triton_toolchain: tuple[str, ...] = ()
    # The releases whose kernel JIT monitor the runtime sets to fail (--jit-monitor-mode error).
    jit_monitor_versions: str = ""
    jit_monitor_source: str = ""


@dataclass(frozen=True)
class BackendGpuSupport(Sourced):
    """The oldest GPU a backend supports at all (backends.yaml ``gpu_support``): a GPU whose
    compute capability is below ``min_compute_capability`` is not a target of that backend."""

    backend: str
    min_compute_capability: str
    note: str = ""


@dataclass(frozen=True)
class DriverBranch(Sourced):
    """A datacenter driver branch and the CUDA majors it runs under forward compatibility."""

    branch: str  # "535"
    kind: str  # lts | production | feature
    forward_compat_cuda: tuple[str, ...]  # CUDA majors.minors the cuda-compat package supports
    end_of_life: str = ""


@dataclass(frozen=True)
class TensorRTRelease(Sourced):
    """A TensorRT release and the CUDA major it is built for (the ``tensorrt_cuXX`` package its
    ``tensorrt`` metapackage requires; "" on an unconfirmed row whose metapackage names none)."""

    version: str
    cuda_major: str


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


def _records(data: dict[str, Any], key: str, path: str, *, required: bool = True) -> list[dict[str, Any]]:
    """The rows of table ``key`` of compat file ``path`` (``cuda.yaml``). Every row is a mapping
    with a ``source``; a row without one is a MatrixError naming the file, the table and the row,
    never a row left out. A table that is absent is an error too, unless not ``required``."""
    rows = data.get(key)
    if rows is None and not required:
        return []
    if not isinstance(rows, list):
        raise MatrixError(f"'{key}' must be a list of records", field=f"compat/{path}")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise MatrixError(f"{key}[{index}] is not a record", field=f"compat/{path}",
                              fix="write the row as a mapping of fields")
        if not row.get("source"):
            first = next(iter(row.items()), None)
            named = f" ({first[0]} {str(first[1])[:40]!r})" if first else ""
            raise MatrixError(f"{key}[{index}]{named} has no source", field=f"compat/{path}",
                              fix="give the row a source (a URL, or owner/repo@tag:path; "
                                  "confirmed: false where it was not read)")
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
    "min_compute_capability": r"[0-9]{1,2}\.[0-9]{1,2}",
    "compute_capabilities": r"[0-9]{1,2}\.[0-9]{1,2}",
    "native_compute_capabilities": r"[0-9]{1,2}\.[0-9]{1,2}", "last_driver_branch": r"([0-9]{3,4})?",
    "cuda_archs": r"[0-9]{1,2}\.[0-9]{1,2}[af]?", "python_versions": r"[0-9]\.[0-9]{1,2}",
    "wheel_tags": r"[A-Za-z0-9._]{1,40}-[A-Za-z0-9._]{1,40}-[A-Za-z0-9._]{1,80}",
    "base_image": r"([a-z0-9][a-z0-9._/:@-]{0,255})?",
    # Debian package names (Policy 5.6.1), and the tool names verify knows
    "system_packages": r"[a-z0-9][a-z0-9+.-]{0,127}", "runtime_packages": r"[a-z0-9][a-z0-9+.-]{0,127}",
    "builder_packages": r"[a-z0-9][a-z0-9+.-]{0,127}", "runtime_toolchain": r"[a-z0-9][a-z0-9+.-]{0,127}",
    "triton_toolchain": r"[a-z0-9][a-z0-9+.-]{0,127}", "jit_monitor_versions": rf"({_SPECIFIER})?",
    "weights_required": r"[A-Za-z0-9._*|,-]{1,256}", "backend": r"[a-z][a-z0-9-]{0,31}",
    "precision": r"[a-z][a-z0-9_]{0,31}", "cuda_major": r"([0-9]{1,3})?",
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

