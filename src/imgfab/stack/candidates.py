"""One backend release against one host: what its payload brings (torch, the CUDA runtime the
wheels pin, the kernel architectures measured in them), the driver floors that follow, and
every constraint it passes or fails (Rejection). Pure over the matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imgfab.matrix.compat import BackendRelease, CudaToolkit, Gpu, Matrix, TorchRelease
from imgfab.recipe import Recipe
from imgfab.in_image.rules import (FORWARD_COMPAT, MINOR_COMPAT, STRICT, check_coverage,
                                   check_driver, check_driver_ceiling, check_forward_compat,
                                   check_precision,
                                   compare_versions, major_minor, parse_version)


# OS preference when the recipe does not name one: newest first.
_OS_ORDER = ("ubuntu24.04", "ubuntu22.04")


# Order in which a candidate's failures are reported.
_PRIORITY = ("version", "gpu", "arch", "gpu-driver", "precision", "dtype", "kv-cache", "torch", "payload",
             "driver", "python", "image", "advisory")
# Constraints that hold for the release on every OS and image patch (no relaxation of OS,
# policy or driver fixes them).
RELEASE_CONSTRAINTS = ("gpu", "arch", "torch", "precision", "dtype", "kv-cache")


@dataclass(frozen=True)
class Rejection:
    candidate: str
    constraint: str  # version | gpu | arch | gpu-driver | precision | dtype | kv-cache | torch | payload | driver | python | image | advisory
    reason: str
    fix: str = ""


def _python_ok(python: str, release: BackendRelease) -> str:
    """Empty if ``python`` (e.g. '3.10') can install the release, else the reason."""
    if release.python and Version(python + ".0") not in SpecifierSet(release.python):
        return f"Python {python} is outside {release.backend} {release.version}'s requires-python {release.python}"
    if release.python_versions and python not in release.python_versions:
        return (f"{release.backend} {release.version} ships wheels for Python "
                f"{', '.join(release.python_versions)} only, not {python}")
    tags = release.wheel_tags
    if tags:
        cp = "cp" + python.replace(".", "")
        fits = False
        for tag in tags:
            interp = tag.split("-")[0]
            if "-abi3-" in tag and interp.startswith("cp"):
                fits = fits or compare_versions(python, f"{interp[2]}.{interp[3:]}") >= 0
            elif interp == cp or interp.startswith("py3"):
                fits = True
        if not fits:
            return f"no {release.backend} {release.version} wheel for Python {python} (wheels: {', '.join(tags)})"
    return ""


def _torch_pin(matrix: Matrix, release: BackendRelease) -> str:
    """The exact torch version the release installs: the newest torch row inside its specifier
    that comes from the index the release installs torch from (``torch_index``: PyPI, or the
    PyTorch cu130 index that TensorRT-LLM 1.1/1.2 ask for)."""
    if not release.torch:
        return ""
    spec = SpecifierSet(release.torch)
    fitting = [v for v, row in matrix.torch.items()
               if row.index == release.torch_index and spec.contains(Version(v), prereleases=True)]
    return str(max(fitting, key=Version)) if fitting else ""


@dataclass(frozen=True)
class Payload:
    """What the wheels bring: CUDA runtimes (component, toolkit) and code per CUDA library."""

    runtimes: tuple[tuple[str, CudaToolkit, str], ...]  # (who brings it, toolkit whose driver it needs, pin)
    libraries: tuple[tuple[str, list[str], list[str]], ...]  # (name, sass, ptx)
    unknown: tuple[str, ...]  # runtimes that map to no toolkit row


def payload_of(matrix: Matrix, release: BackendRelease, torch: str,
               image_toolkit: CudaToolkit | None, uses_image_cuda: bool) -> Payload:
    """The payload of one candidate: torch's pinned runtime, the image toolkit if it is linked."""
    runtimes: list[tuple[str, CudaToolkit, str]] = []
    unknown: list[str] = []
    libraries: list[tuple[str, list[str], list[str]]] = []
    row: TorchRelease | None = matrix.torch.get(torch) if torch else None
    if row is not None:
        toolkit = matrix.runtime_toolkit(row.cuda_runtime) if row.cuda_runtime else None
        if toolkit is not None:
            runtimes.append((f"torch {torch} (CUDA runtime {row.cuda_runtime})", toolkit, row.cuda_runtime))
        else:
            unknown.append(f"torch {torch} CUDA runtime {row.cuda_runtime or 'unknown'}")
        libraries.append((f"torch {torch}", list(row.sass), list(row.ptx)))
    if uses_image_cuda and image_toolkit is not None:
        runtimes.append((f"the image's CUDA toolkit {image_toolkit.version}", image_toolkit,
                         image_toolkit.version))
    archs = sorted(set(release.fatbin_sass) | set(release.cuda_archs), key=parse_version)
    libraries.append((f"{release.backend} {release.version}", archs, list(release.fatbin_ptx)))
    return Payload(runtimes=tuple(runtimes), libraries=tuple(libraries), unknown=tuple(unknown))


def covered_archs(payload: Payload) -> tuple[str, ...]:
    """The image's ``archs`` label: the backend's architectures that every other CUDA library of
    the payload also runs (SASS by binary compatibility, or PTX); libraries of unknown code are
    skipped. E.g. vLLM 0.10.1 (…, 9.0, 10.0, 12.0) with torch 2.7.1 (…, 9.0) → (…, 9.0)."""
    from imgfab.in_image.rules import binary_runs_on, ptx_runs_on

    *others, (_, backend_sass, _) = payload.libraries
    known = [(sass, ptx) for _, sass, ptx in others if sass or ptx]
    return tuple(a for a in backend_sass
                 if all(binary_runs_on(a, sass) or ptx_runs_on(a, ptx) for sass, ptx in known))


def _newest(runtimes: tuple[tuple[str, CudaToolkit, str], ...]) -> tuple[str, CudaToolkit, str] | None:
    return max(runtimes, key=lambda r: parse_version(r[1].version)) if runtimes else None


_DTYPE_PRECISION = {"bfloat16": "bf16", "float16": "fp16", "auto": "auto"}


def precision_of(recipe: Recipe) -> str:
    """The image's headline precision: the quantization, else the activation dtype."""
    if recipe.engine.quantization != "none":
        return recipe.engine.quantization
    return _DTYPE_PRECISION[recipe.engine.dtype]


def precisions_to_check(recipe: Recipe) -> tuple[str, ...]:
    """Every precision the GPU must support: quantization, dtype and kv-cache dtype."""
    wanted = [recipe.engine.quantization, _DTYPE_PRECISION[recipe.engine.dtype],
              "kv_fp8" if recipe.engine.kv_cache_dtype == "fp8" else "none"]
    return tuple(p for p in wanted if p not in ("none", "auto"))


# Which recipe setting a precision comes from: dtype rules and kv-cache rules are refused under
# their own constraint (and field), quantization methods under "precision".
_DTYPE_RULES = ("bf16", "fp16")


def precision_constraint(name: str) -> str:
    """The constraint a failed precision rule is filed under: ``dtype`` (engine.dtype),
    ``kv-cache`` (engine.kv_cache_dtype) or ``precision`` (engine.quantization)."""
    if name in _DTYPE_RULES:
        return "dtype"
    if name == "kv_fp8":
        return "kv-cache"
    return "precision"


def _passes(matrix: Matrix, release: BackendRelease, name: str, gpu: Gpu) -> bool:
    rule = matrix.precision_rule(release.backend, name, release.version)
    return rule is None or check_precision(
        name, gpu.compute_capability, min_cc=rule.min_compute_capability,
        max_cc=rule.max_compute_capability, excluded=rule.excluded_compute_capabilities,
        supported=rule.supported).ok


def nearest_supported_gpu(matrix: Matrix, gpu: Gpu, floor: str) -> Gpu | None:
    """The GPU of the matrix nearest ``gpu`` among those of compute capability ``floor`` or
    newer on x86_64 hosts (the only ones imgfab builds for): the lowest compute capability, then
    the memory closest to ``gpu``'s, then the name. E.g. T4 (7.5, 16 GiB), floor 8.0 →
    A100-40GB (8.0, 40 GiB) before A100-80GB. None when no GPU reaches the floor."""
    fits = [g for g in matrix.gpus
            if g.cpu_arch == "x86_64" and compare_versions(g.compute_capability, floor) >= 0]
    return min(fits, default=None, key=lambda g: (parse_version(g.compute_capability),
                                                   abs(g.memory_gib - gpu.memory_gib), g.name))


def gpu_support_rejection(matrix: Matrix, release: BackendRelease, gpu: Gpu) -> Rejection | None:
    """A ``gpu`` rejection when ``release``'s backend does not support ``gpu`` at all
    (backends.yaml ``gpu_support``: its compute capability is below the backend's oldest
    supported one), its fix naming the nearest GPU that is supported; else None."""
    support = matrix.gpu_support.get(release.backend)
    if support is None or compare_versions(gpu.compute_capability, support.min_compute_capability) >= 0:
        return None
    floor = support.min_compute_capability
    nearest = nearest_supported_gpu(matrix, gpu, floor)
    fix = (f"target.gpu: {nearest.name} (compute capability {nearest.compute_capability}, the nearest "
           f"GPU {release.backend} supports)" if nearest else
           f"target.gpu: a GPU of compute capability ≥ {floor}")
    return Rejection(f"{release.backend} {release.version}", "gpu",
                     f"{release.backend} does not support {gpu.name} ({gpu.architecture}, compute "
                     f"capability {gpu.compute_capability}): its support starts at compute "
                     f"capability {floor}", fix)


def evaluate(matrix: Matrix, release: BackendRelease, *, gpu: Gpu, precisions: tuple[str, ...],
             driver: str, policy: str, os_names: tuple[str, ...]
             ) -> tuple[dict[str, Any] | None, list[Rejection]]:
    """Check one release on one GPU/driver. Returns (stack fields, []) or (None, failures).

    All failing constraints are returned (not just the first), so the caller can find the
    smallest recipe change that would make a candidate fit.
    """
    label = f"{release.backend} {release.version}"
    failures: list[Rejection] = []
    torch = _torch_pin(matrix, release)
    profile = matrix.profiles[release.backend]
    uses_image_cuda = profile.runtime_flavor == "devel"

    unsupported = gpu_support_rejection(matrix, release, gpu)
    if unsupported is not None:
        failures.append(unsupported)
    coverage = check_coverage(gpu.compute_capability,
                              list(payload_of(matrix, release, torch, None, False).libraries), gpu=gpu.name)
    if not coverage.ok:
        failures.append(Rejection(label, "arch", coverage.reason,
                                  f"a {release.backend} release whose payload carries sm_{gpu.sm[2:]} code"))
    if gpu.min_driver and compare_versions(driver, gpu.min_driver) < 0:
        failures.append(Rejection(label, "gpu-driver",
                                  f"{gpu.name} ({gpu.architecture}) needs driver ≥ {gpu.min_driver} "
                                  f"(R{gpu.min_driver.split('.')[0]}); host driver {driver} does not drive it",
                                  f"raise target.driver to ≥ {gpu.min_driver}"))
    if gpu.last_driver_branch:
        ceiling = check_driver_ceiling(driver, gpu.compute_capability,
                                       ceilings={gpu.compute_capability: gpu.last_driver_branch},
                                       gpu=f"{gpu.name} ({gpu.architecture})")
        if not ceiling.ok:
            failures.append(Rejection(label, "gpu-driver", ceiling.reason,
                                      f"set target.driver to the fleet's R{gpu.last_driver_branch} "
                                      f"(or older) driver: no newer branch drives {gpu.name}"))
    for name in precisions:
        rule = matrix.precision_rule(release.backend, name, release.version)
        if rule is None:
            continue
        verdict = check_precision(name, gpu.compute_capability, min_cc=rule.min_compute_capability,
                                  max_cc=rule.max_compute_capability,
                                  excluded=rule.excluded_compute_capabilities,
                                  supported=rule.supported, backend=f"{release.backend} {release.version}",
                                  gpu=gpu.name)
        if not verdict.ok:
            constraint = precision_constraint(name)
            fix = verdict.fix
            reason = verdict.reason
            if rule.fallback and rule.min_compute_capability and \
                    compare_versions(gpu.compute_capability, rule.min_compute_capability) < 0:
                # The floor is the fallback's, not native compute's: say both (vLLM runs fp8
                # below 8.9 weight-only through FP8 Marlin, and refuses it only below that).
                reason += (f" ({release.backend} {release.version} runs it {rule.fallback} from "
                           f"{rule.min_compute_capability}; native {rule.native_text()})")
            if name == "bf16" and _passes(matrix, release, "fp16", gpu):
                # vLLM's own refusal: "You can use float16 instead by explicitly setting the
                # `dtype` flag" (vllm/platforms/cuda.py check_if_supports_dtype).
                fix = "engine.dtype: float16 (use float16 by setting dtype; bf16 needs compute capability ≥ " \
                      f"{rule.min_compute_capability})"
            elif name == "kv_fp8":
                fix = "engine.kv_cache_dtype: auto"
            failures.append(Rejection(label, constraint, reason, fix))

    if release.torch and not torch:
        failures.append(Rejection(label, "torch", f"no torch row from {release.torch_index} in "
                                                  f"compat/torch.yaml satisfies {release.torch}"))

    # Arch, precision and torch failures hold on every OS; the rest are per OS and CUDA patch
    # and only matter if no OS works.
    blocking = list(failures)
    best_driver_failure: Rejection | None = None
    for os_name in os_names:
        os_release = matrix.os_releases.get(os_name)
        if os_release is None:
            continue
        why = _python_ok(os_release.python, release)
        if why:
            failures.append(Rejection(f"{label} on {os_name}", "python", why,
                                      "image.os: an OS whose Python the wheels support"))
            continue
        check = matrix.payload_check(release.backend, release.version, os_release.python)
        if check is not None and not check.installs:
            failures.append(Rejection(f"{label} on {os_name}", "payload",
                                      f"{label} cannot install cleanly on Python {os_release.python}: "
                                      f"{check.reason} (imgfab compat refresh --payloads, {check.checked})",
                                      _installing_fix(matrix, release, os_release.python)))
            continue
        needed = {"devel", profile.runtime_flavor}
        candidates = [(t, matrix.image(t.version, os_name)) for t in matrix.patches(release.cuda)]
        candidates = [(t, i) for t, i in candidates if i is not None and needed <= set(i.flavors)]
        # Supported tags first (newest first), end-of-life tags only when nothing supported fits.
        candidates.sort(key=lambda c: c[1].eol)
        for toolkit, image in candidates:
            payload = payload_of(matrix, release, torch, toolkit, uses_image_cuda)
            floors = payload_floors(matrix, toolkit, payload)
            if policy == FORWARD_COMPAT:
                cuda = floors["cuda"]
                verdict = check_forward_compat(
                    driver, cuda=cuda, datacenter=gpu.datacenter, gpu=gpu.name,
                    branches=[(b.branch, list(b.forward_compat_cuda)) for b in matrix.driver_branches])
                # The floor label is the oldest branch that runs this CUDA by forward compatibility.
                listed = [b.branch for b in matrix.driver_branches if major_minor(cuda) in b.forward_compat_cuda]
                floor = min(listed, key=parse_version) if listed else floors[STRICT]
            else:
                floor = floors[policy]
                if not floor:
                    failures.append(Rejection(label, "driver", f"no {policy} driver floor known for CUDA {toolkit.version}"))
                    continue
                verdict = check_driver(driver, floor=floor, policy=policy, cuda=floors["cuda"],
                                       strict_floor=floors[STRICT], compat_floor=floors[MINOR_COMPAT])
            if not verdict.ok:
                if best_driver_failure is None:
                    best_driver_failure = Rejection(f"{label} (CUDA {toolkit.version}, {os_name})",
                                                    "driver", verdict.reason + floors["why"], verdict.fix)
                continue
            if blocking:
                return None, blocking
            return {"toolkit": toolkit, "image": image, "os": os_release, "torch": torch,
                    "floors": floors, "floor": floor, "payload": payload,
                    "eol_only": image.eol}, []
        if not candidates:
            failures.append(Rejection(f"{label} on {os_name}", "image",
                                      f"no nvidia/cuda {release.cuda}.x {os_name} image with "
                                      f"flavors devel+{profile.runtime_flavor}"))
    if best_driver_failure is not None:
        failures.append(best_driver_failure)
    if not failures:
        failures.append(Rejection(label, "image", f"no buildable nvidia/cuda {release.cuda}.x image"))
    # The most telling failure first: a driver miss on one OS says more than a Python miss on another.
    failures.sort(key=lambda f: _PRIORITY.index(f.constraint))
    return None, failures


def _installing_fix(matrix: Matrix, release: BackendRelease, python: str) -> str:
    """The release to pin instead of one whose payload does not install: the newest older one
    of the same backend recorded as installing for ``python``; else what would make it install."""
    older = [c for c in matrix.payload_checks
             if c.backend == release.backend and c.python == python and c.installs
             and Version(c.version) < Version(release.version)]
    if older:
        newest = max(older, key=lambda c: Version(c.version))
        return (f"backend.version: =={newest.version} (the newest {release.backend} release "
                "recorded as installing cleanly)")
    return ("bound the conflicting family in compat/payload.yaml constraints, or pin an older "
            "backend.version")


def payload_floors(matrix: Matrix, toolkit: CudaToolkit, payload: Payload) -> dict[str, str]:
    """Driver floors of one candidate: strict = the newest runtime in the payload's Table 3
    driver; minor-compat = the branch floor of that runtime's major. ``cuda`` names the runtime
    the floors come from, ``why`` a clause saying so for rejections."""
    newest = _newest(payload.runtimes)
    if newest is None:  # nothing known of the payload's runtime: fall back to the image patch
        floors = _floors(matrix, toolkit)
        return {**floors, "cuda": toolkit.version, "from": f"the image's CUDA {toolkit.version}",
                "runtime": "", "pin": "", "why": ""}
    who, runtime_toolkit, pin = newest
    floors = _floors(matrix, runtime_toolkit)
    return {**floors, "cuda": runtime_toolkit.version, "from": who, "runtime": runtime_toolkit.version,
            "pin": pin,
            "why": f" (the payload's newest CUDA runtime: {who} → CUDA {runtime_toolkit.version})"}


def _floors(matrix: Matrix, toolkit: CudaToolkit) -> dict[str, str]:
    compat = matrix.minor_compat.get(parse_version(toolkit.version)[0])
    return {STRICT: toolkit.min_driver, MINOR_COMPAT: compat.min_driver if compat else ""}
