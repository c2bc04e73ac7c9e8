"""What the probe reads: the image's facts (its labels, /opt/imgfab/image.json) and the host's
(NVML for the driver and GPUs, the libcuda this process loaded, torch for a CUDA matmul).

Standard library only (NVML and torch are the image's own, imported guarded): copied into every
image beside :mod:`imgfab.in_image.probe`, which judges these facts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol

from imgfab.in_image import fit, rules


_LABEL = "org.imgfab."


class ImageFactsError(ValueError):
    """image.json is missing, not JSON, or a label in it is absent or malformed."""


@dataclass(frozen=True)
class ImageFacts:
    """What an image says about itself, parsed from its ``org.imgfab.*`` labels."""

    backend: str
    backend_version: str
    cuda: str
    driver_floor: str
    driver_policy: str
    strict_floor: str | None
    compat_floor: str | None
    gpu: str
    archs: tuple[str, ...]
    arch_exact: bool
    precision: str
    precision_min_cc: str | None
    precision_max_cc: str | None
    tp: int
    pp: int
    shm_min_bytes: int
    model_mount: str
    weights_required: tuple[tuple[str, ...], ...]
    cuda_runtime: str = ""  # the payload's newest CUDA runtime (toolkit release), label cuda.runtime
    driver_ceilings: tuple[tuple[str, str], ...] = ()  # (cc, NVIDIA's last branch), label driver.ceilings
    fit_serving: str = ""  # how the model is served, for the fit check (label fit.serving; fit.py)
    fit_facts: str = ""  # the model facts the recipe declared (label fit.facts; fit.py)

    @classmethod
    def from_labels(cls, labels: dict[str, Any]) -> ImageFacts:
        """Parse and validate labels; raises :class:`ImageFactsError` naming the bad label."""
        if not isinstance(labels, dict):
            raise ImageFactsError(f"expected a JSON object of labels, got {type(labels).__name__}")

        def get(key: str, default: str | None = None) -> str:
            value = labels.get(_LABEL + key, default)
            if value is None:
                raise ImageFactsError(f"label {_LABEL}{key} is missing")
            if not isinstance(value, str):
                raise ImageFactsError(f"label {_LABEL}{key} is not a string: {value!r}")
            return value.strip()

        def version(key: str, *, optional: bool = False) -> str | None:
            text = get(key, "" if optional else None)
            if optional and not text:
                return None
            try:
                rules.parse_version(text)
            except ValueError:
                raise ImageFactsError(f"label {_LABEL}{key} is not a version: {text!r}") from None
            return text

        def integer(key: str, default: str | None = None) -> int:
            text = get(key, default)
            if not text.isdigit():
                raise ImageFactsError(f"label {_LABEL}{key} is not a whole number: {text!r}")
            return int(text)

        policy = get("driver.policy")
        if policy not in rules.POLICIES:
            raise ImageFactsError(f"label {_LABEL}driver.policy is {policy!r}, "
                                  f"expected one of {', '.join(rules.POLICIES)}")
        # Empty when the matrix row had no confirmed kernel list (an unconfirmed fact):
        # the arch check then says it was skipped, never that it passed.
        archs = tuple(a.strip() for a in get("archs").split(",") if a.strip())
        for arch in archs:
            try:
                rules.parse_version(arch.rstrip("af"))
            except ValueError:
                raise ImageFactsError(f"label {_LABEL}archs has a bad entry: {arch!r}") from None
        exact = get("arch.exact").lower()
        if exact not in ("true", "false"):
            raise ImageFactsError(f"label {_LABEL}arch.exact is {exact!r}, expected true or false")
        try:  # absent on images built before the label existed: no ceiling known
            ceilings = tuple(sorted(rules.parse_ceilings(get("driver.ceilings", "")).items()))
        except ValueError as exc:
            raise ImageFactsError(f"label {_LABEL}driver.ceilings: {exc}") from None
        required = tuple(
            tuple(p.strip() for p in entry.split("|") if p.strip())
            for entry in get("weights.required", "").split(",") if entry.strip()
        )
        return cls(
            backend=get("backend"),
            backend_version=get("backend.version"),
            cuda=version("cuda") or "",
            driver_floor=version("driver.floor") or "",
            driver_policy=policy,
            strict_floor=version("driver.strict_floor", optional=True),
            compat_floor=version("driver.compat_floor", optional=True),
            gpu=get("gpu", ""),
            archs=archs,
            arch_exact=exact == "true",
            precision=get("precision"),
            precision_min_cc=version("precision.min_cc", optional=True),
            precision_max_cc=version("precision.max_cc", optional=True),
            tp=integer("tp"),
            pp=integer("pp"),
            shm_min_bytes=integer("shm.min_bytes"),
            model_mount=get("model.mount", ""),
            weights_required=required,
            cuda_runtime=version("cuda.runtime", optional=True) or "",
            driver_ceilings=ceilings,
            fit_serving=get("fit.serving", ""),
            fit_facts=get("fit.facts", ""),
        )


def load_image_facts(path: str) -> ImageFacts:
    """Read ``path`` (image.json, within :func:`imgfab.in_image.fit.load_json`'s bounds);
    raises :class:`ImageFactsError` with one line."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise ImageFactsError(f"{path} not found") from None
    except OSError as exc:
        raise ImageFactsError(f"{path} cannot be read: {exc}") from None
    try:
        labels = fit.load_json(raw, path)
    except fit.FactsError as exc:
        raise ImageFactsError(str(exc)) from None
    return ImageFacts.from_labels(labels)


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as NVML reports it."""

    index: int
    name: str
    compute_capability: str
    memory_bytes: int | None = None  # total memory, None when NVML did not say


@dataclass
class HostFacts:
    """What NVML said about the host; ``error`` set when NVML could not be used."""

    driver: str | None = None
    gpus: list[GpuFacts] = field(default_factory=list)
    error: str | None = None
    via: str = "NVML"  # what read it: NVML, or nvidia-smi (imgfab.ops.host)


class Nvml(Protocol):
    """The few ``pynvml`` functions the probe uses (tests pass recorded answers)."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...


def load_nvml() -> Nvml | None:
    """``pynvml`` if importable, else None."""
    try:
        import pynvml  # noqa: PLC0415 - optional, imported only when the probe runs
    except ImportError:
        return None
    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _total_memory(nvml: Nvml, handle: Any) -> int | None:
    """The GPU's total memory in bytes; None when NVML cannot say (it changes no verdict)."""
    try:
        total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    except Exception:  # NVMLError_NotSupported on some vGPU profiles, an old binding
        return None
    return total if total > 0 else None


def read_host(nvml: Nvml | None) -> HostFacts:
    """Ask NVML for the driver version and every visible GPU; never raises."""
    if nvml is None:
        return HostFacts(error="NVML is not available (python package nvidia-ml-py missing)")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return HostFacts(error=f"NVML did not start ({exc}): no NVIDIA driver visible")
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion()).strip()
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(GpuFacts(index, _text(nvml.nvmlDeviceGetName(handle)).strip(),
                                 f"{major}.{minor}", _total_memory(nvml, handle)))
        return HostFacts(driver=driver, gpus=gpus)
    except Exception as exc:
        return HostFacts(error=f"NVML query failed: {exc}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # shutdown failure changes no verdict
            pass


class CudaRunner(Protocol):
    """Runs the matmul check on one CUDA device (tests pass recorded answers)."""

    def device_count(self) -> int: ...

    def matmul_error(self, device: str) -> float:
        """Largest |gpu - cpu| / max|cpu| of a fixed matmul on ``device``; raises on failure."""
        ...


class TorchCuda:
    """:class:`CudaRunner` over ``torch``."""

    SIZE = 256

    def __init__(self, torch: Any):
        self.torch = torch

    def device_count(self) -> int:
        if not self.torch.cuda.is_available():
            return 0
        return int(self.torch.cuda.device_count())

    def matmul_error(self, device: str) -> float:
        torch = self.torch
        generator = torch.Generator().manual_seed(0)
        a = torch.randn(self.SIZE, self.SIZE, generator=generator, dtype=torch.float32)
        b = torch.randn(self.SIZE, self.SIZE, generator=generator, dtype=torch.float32)
        expected = a @ b
        got = (a.to(device) @ b.to(device)).to("cpu")
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        scale = float(expected.abs().max())
        return float((got - expected).abs().max()) / scale


def load_cuda_runner() -> tuple[CudaRunner | None, str | None]:
    """``(runner, None)``; ``(None, None)`` when torch is absent; ``(None, error)`` when broken.

    Absent means the module ``torch`` itself is not installed; any other failure while
    importing it (a missing CUDA library, an ABI clash) is a broken image.
    """
    try:
        import torch  # noqa: PLC0415 - optional, heavy, imported only for the cuda check
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            return None, None
        return None, f"import torch failed: {exc}"
    except Exception as exc:
        return None, f"import torch failed: {type(exc).__name__}: {exc}"
    return TorchCuda(torch), None


@dataclass(frozen=True)
class CudaMode:
    """The kernel driver and the user-mode libcuda this process really loaded."""

    kernel_driver: str | None  # /proc/driver/nvidia/version, e.g. "580.95.05"
    libcuda_path: str  # realpath of the libcuda mapped into this process
    libcuda_version: str | None  # from its file name, libcuda.so.<version>
    libcuda_cuda: str | None  # cuDriverGetVersion of the loaded libcuda, e.g. "13.0"
    error: str = ""

    @property
    def mode(self) -> str:
        if "/compat/" in self.libcuda_path:
            return rules.FORWARD_COMPAT
        return "native"


def read_cuda_mode(proc_version: str = "/proc/driver/nvidia/version",
                   maps: str = "/proc/self/maps") -> CudaMode | None:
    """Load libcuda the way CUDA applications do (``libcuda.so.1`` through the ld cache, where the
    NVIDIA Container Toolkit's enable-cuda-compat hook puts ``/usr/local/cuda/compat`` first when
    it is newer than the host driver) and say which file it was. None when no libcuda loads."""
    import ctypes
    import re

    kernel = None
    try:
        with open(proc_version, encoding="utf-8", errors="replace") as handle:
            found = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)", handle.read())
            kernel = found.group(1) if found else None
    except OSError:
        pass
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    cuda = None
    if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value:
        cuda = f"{version.value // 1000}.{version.value % 1000 // 10}"
    path = ""
    try:
        with open(maps, encoding="utf-8", errors="replace") as handle:
            path = next((line.split()[-1] for line in handle if "libcuda.so" in line.split()[-1]), "")
    except OSError:
        pass
    real = os.path.realpath(path) if path else ""
    match = re.search(r"libcuda\.so\.(\d+(?:\.\d+)+)$", real)
    return CudaMode(kernel_driver=kernel, libcuda_path=real, libcuda_version=match.group(1) if match else None,
                    libcuda_cuda=cuda)
