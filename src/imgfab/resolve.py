"""Recipe × Matrix × Host → Stack. Pure: no I/O, deterministic.

:func:`resolve` returns the newest :class:`Stack` that satisfies every constraint, or raises
:class:`~imgfab.errors.CompatibilityError` listing every candidate with the constraint that
eliminated it and the nearest recipe change that would work.

Constraints, checked in this order for each candidate (backend release × OS × CUDA patch):
backend version pin, GPU architecture vs the wheels' kernels, precision vs compute capability,
Python of the OS vs the wheels, the ``nvidia/cuda`` images, the host driver floor.
"""

from __future__ import annotations

from dataclasses import dataclass, field, asdict
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imgfab.compat import BackendRelease, CudaToolkit, Gpu, Matrix
from imgfab.errors import CompatibilityError, RecipeError
from imgfab.recipe import Recipe
from imgfab.toolchain import runtime_plan
from imgfab.rules import (MINOR_COMPAT, MINOR_COMPAT_LIMITS, STRICT, check_arch, check_driver,
                          check_precision, compare_versions, nvidia_require_cuda, parse_version)

# OS preference when the recipe does not name one: newest first.
_OS_ORDER = ("ubuntu24.04", "ubuntu22.04")
# Order in which a candidate's failures are reported.
_PRIORITY = ("version", "arch", "precision", "torch", "driver", "python", "image")


@dataclass(frozen=True)
class Host:
    """What is known of the hosts: the oldest driver in the fleet (or one host's exact driver)."""

    driver: str
    gpu: str | None = None


@dataclass(frozen=True)
class Rejection:
    candidate: str
    constraint: str  # version | arch | precision | python | image | driver | torch
    reason: str
    fix: str = ""


@dataclass(frozen=True)
class Stack:
    """One fully pinned stack. Field values go into the lock file, labels and templates."""

    backend: str
    backend_version: str
    backend_path: str  # vllm | pytorch | engine
    cuda: str
    cuda_minor: str
    os: str
    python: str
    builder_image: str
    runtime_image: str
    runtime_flavor: str
    runtime_packages: tuple[str, ...]
    runtime_toolchain: tuple[str, ...]  # build tools serving needs at run time (verify allows them)
    jit: tuple[str, ...]  # run-time compilers the kernels need here (compat/backends.yaml)
    torch: str
    tensorrt: str
    gpu: str
    compute_capability: str
    sm: str
    archs: tuple[str, ...]
    arch_exact: bool
    precision: str
    precision_min_cc: str
    precision_max_cc: str
    kv_cache_dtype: str
    tensor_parallel: int
    pipeline_parallel: int
    driver_policy: str
    driver_floor: str
    strict_floor: str
    compat_floor: str
    nvidia_require_cuda: str
    fleet_driver: str
    notes: tuple[str, ...]
    sources: tuple[str, ...]
    unconfirmed: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, tuple):
                data[key] = list(value)
        return data


@dataclass
class Resolution:
    stack: Stack
    rejections: list[Rejection] = field(default_factory=list)


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
    """The exact torch version the release installs: newest torch row inside its specifier."""
    if not release.torch:
        return ""
    spec = SpecifierSet(release.torch)
    fitting = [v for v in matrix.torch if Version(v) in spec]
    return str(max(fitting, key=Version)) if fitting else ""


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


def evaluate(matrix: Matrix, release: BackendRelease, *, gpu: Gpu, precisions: tuple[str, ...],
             driver: str, policy: str, os_names: tuple[str, ...]
             ) -> tuple[dict[str, Any] | None, list[Rejection]]:
    """Check one release on one GPU/driver. Returns (stack fields, []) or (None, failures).

    All failing constraints are returned (not just the first), so the caller can find the
    smallest recipe change that would make a candidate fit.
    """
    label = f"{release.backend} {release.version}"
    failures: list[Rejection] = []

    arch = check_arch(gpu.compute_capability, list(release.cuda_archs), exact=False, gpu=gpu.name)
    if release.cuda_archs and not arch.ok:
        failures.append(Rejection(label, "arch", arch.reason,
                                  f"a {release.backend} release that ships sm_{gpu.sm[2:]} kernels"))
    for name in precisions:
        rule = matrix.precision_rule(release.backend, name)
        if rule is None:
            continue
        verdict = check_precision(name, gpu.compute_capability, min_cc=rule.min_compute_capability,
                                  max_cc=rule.max_compute_capability,
                                  excluded=rule.excluded_compute_capabilities,
                                  supported=rule.supported, backend=release.backend, gpu=gpu.name)
        if not verdict.ok:
            failures.append(Rejection(label, "precision", verdict.reason, verdict.fix))

    torch = _torch_pin(matrix, release)
    if release.torch and not torch:
        failures.append(Rejection(label, "torch", f"no torch row in compat/torch.yaml satisfies {release.torch}"))

    # Arch, precision and torch failures hold on every OS; the rest are per OS and CUDA patch
    # and only matter if no OS works.
    blocking = list(failures)
    best_driver_failure: Rejection | None = None
    profile = matrix.profiles[release.backend]
    for os_name in os_names:
        os_release = matrix.os_releases.get(os_name)
        if os_release is None:
            continue
        why = _python_ok(os_release.python, release)
        if why:
            failures.append(Rejection(f"{label} on {os_name}", "python", why,
                                      "image.os: an OS whose Python the wheels support"))
            continue
        for toolkit in matrix.patches(release.cuda):
            image = matrix.image(toolkit.version, os_name)
            needed = {"devel", profile.runtime_flavor}
            if image is None or not needed <= set(image.flavors):
                continue
            floors = _floors(matrix, toolkit)
            floor = floors[policy]
            if not floor:
                failures.append(Rejection(label, "driver", f"no {policy} driver floor known for CUDA {toolkit.version}"))
                continue
            verdict = check_driver(driver, floor=floor, policy=policy, cuda=toolkit.version,
                                   strict_floor=floors[STRICT], compat_floor=floors[MINOR_COMPAT])
            if not verdict.ok:
                if best_driver_failure is None:
                    best_driver_failure = Rejection(f"{label} (CUDA {toolkit.version}, {os_name})",
                                                    "driver", verdict.reason, verdict.fix)
                continue
            if blocking:
                return None, blocking
            return {"toolkit": toolkit, "image": image, "os": os_release, "torch": torch,
                    "floors": floors, "floor": floor}, []
        if not any(matrix.image(t.version, os_name) for t in matrix.patches(release.cuda)):
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


def _floors(matrix: Matrix, toolkit: CudaToolkit) -> dict[str, str]:
    compat = matrix.minor_compat.get(parse_version(toolkit.version)[0])
    return {STRICT: toolkit.min_driver, MINOR_COMPAT: compat.min_driver if compat else ""}


def resolve(recipe: Recipe, matrix: Matrix, host: Host | None = None) -> Resolution:
    """Pick the newest stack that fits; raise CompatibilityError naming every rejected candidate."""
    gpu = matrix.gpu(recipe.target.gpu)
    if gpu is None:
        known = ", ".join(g.name for g in matrix.gpus)
        raise RecipeError(f"unknown GPU {recipe.target.gpu!r}", field="target.gpu",
                          fix=f"one of: {known}")
    driver = host.driver if host else recipe.target.driver_floor
    policy = recipe.target.driver_policy
    spec = SpecifierSet(recipe.backend.version or "")
    precision = precision_of(recipe)
    os_names = (recipe.image.os,) if recipe.image.os else _OS_ORDER

    rejections: list[Rejection] = []
    failures_by_release: list[tuple[BackendRelease, list[Rejection]]] = []
    for release in matrix.backend_releases(recipe.backend.name):
        if Version(release.version) not in spec:
            rejections.append(Rejection(f"{release.backend} {release.version}", "version",
                                        f"outside backend.version {recipe.backend.version}"))
            failures_by_release.append((release, [rejections[-1]]))
            continue
        fields, failures = evaluate(matrix, release, gpu=gpu, precisions=precisions_to_check(recipe),
                                    driver=driver, policy=policy, os_names=os_names)
        if fields is not None:
            stack = _stack(recipe, matrix, release, gpu, precision, driver, policy, fields)
            return Resolution(stack=stack, rejections=rejections)
        rejections.append(failures[0])
        failures_by_release.append((release, failures))

    if not failures_by_release:
        raise CompatibilityError(f"the matrix has no {recipe.backend.name} release",
                                 field="backend.name")
    fix = _nearest_fix(recipe, matrix, gpu, precision, failures_by_release, driver)
    first = rejections[0]
    raise CompatibilityError(
        f"no {recipe.backend.name} stack fits {gpu.name} with driver {driver} ({policy}); "
        f"{len(rejections)} candidates rejected, newest: {first.candidate}: {first.reason}",
        field=_field_for(first.constraint), fix=fix,
        rejections=[(r.candidate, f"{r.constraint}: {r.reason}") for r in rejections])


def _field_for(constraint: str) -> str:
    return {"version": "backend.version", "arch": "target.gpu", "precision": "engine.quantization",
            "python": "image.os", "image": "image.os", "driver": "target.driver",
            "torch": "backend.version"}.get(constraint, "recipe")


def _nearest_fix(recipe: Recipe, matrix: Matrix, gpu: Gpu, precision: str,
                 failures_by_release: list[tuple[BackendRelease, list[Rejection]]], driver: str) -> str:
    """The smallest recipe change: the newest release held back by one relaxable constraint.

    Preference: widen a version pin; switch a strict policy to minor-compat when that keeps the
    driver; raise the fleet driver floor; change the precision.
    """
    only = {kind: [(r, f) for r, f in failures_by_release if {x.constraint for x in f} == {kind}]
            for kind in ("version", "driver", "precision")}
    if only["version"]:
        release = only["version"][0][0]
        return f"widen backend.version to admit {release.version} (e.g. '=={release.version}')"
    if only["driver"] and recipe.target.driver_policy == STRICT:
        for release, _ in only["driver"]:
            for toolkit in matrix.patches(release.cuda):
                compat = _floors(matrix, toolkit)[MINOR_COMPAT]
                if compat and compare_versions(driver, compat) >= 0:
                    return (f"target.driver_policy: minor-compat ({release.backend} "
                            f"{release.version} on CUDA {toolkit.version} runs on driver ≥ "
                            f"{compat} with {MINOR_COMPAT_LIMITS})")
    if only["driver"]:
        policy = recipe.target.driver_policy
        floors = [(_floors(matrix, t)[policy], release, t) for release, _ in only["driver"]
                  for t in matrix.patches(release.cuda) if _floors(matrix, t)[policy]]
        floor, release, toolkit = min(floors, key=lambda f: parse_version(f[0]))
        return (f"raise target.driver to ≥ {floor} (the lowest upgrade: {release.backend} "
                f"{release.version} on CUDA {toolkit.version})")
    for _, failures in failures_by_release:
        for failure in failures:
            if failure.constraint == "precision" and failure.fix:
                return failure.fix
    return f"run `imgfab matrix --gpu {gpu.name} --driver {driver}` to see what fits this host"


def _stack(recipe: Recipe, matrix: Matrix, release: BackendRelease, gpu: Gpu, precision: str,
           driver: str, policy: str, fields: dict[str, Any]) -> Stack:
    toolkit: CudaToolkit = fields["toolkit"]
    image = fields["image"]
    profile = matrix.profiles[release.backend]
    engine = recipe.backend.trtllm_path == "engine"
    rule = matrix.precision_rule(release.backend, precision)
    plan = runtime_plan(profile, compute_capability=gpu.compute_capability,
                        kv_cache_dtype=recipe.engine.kv_cache_dtype, precision=precision)
    if plan.flavor not in image.flavors:
        raise CompatibilityError(
            f"{release.backend} {release.version} on {gpu.name} needs a run-time JIT toolchain "
            f"({', '.join(plan.jit)}: {'; '.join(plan.reasons)}) that only the nvidia/cuda "
            f"{plan.flavor} flavor carries, and nvidia/cuda {toolkit.version} {image.os} has no "
            f"{plan.flavor} tag in the matrix",
            field="engine.kv_cache_dtype" if recipe.engine.kv_cache_dtype != "auto" else "target.gpu",
            fix="engine.kv_cache_dtype: auto" if recipe.engine.kv_cache_dtype != "auto"
            else f"add the {toolkit.version}-{plan.flavor}-{image.os} tag to compat/cuda_images.yaml")
    notes = []
    if policy == MINOR_COMPAT:
        notes.append(f"driver floor {fields['floor']} relies on CUDA {toolkit.version.split('.')[0]}.x "
                     f"{MINOR_COMPAT_LIMITS}; strict floor would be {fields['floors'][STRICT]}")
    if engine:
        notes.append(f"TensorRT engine is compiled for sm_{gpu.sm[2:]} only and runs on no other GPU")
    unconfirmed = [u for u in matrix.unconfirmed
                   if u.startswith((f"{release.backend} {release.version}:", f"cuda {toolkit.version}:",
                                    f"gpu {gpu.name}:"))]
    if not profile.confirmed:
        unconfirmed.append(f"backends {release.backend}: {profile.reason}")
    unconfirmed += plan.unconfirmed
    notes += [f"runtime carries {name} (nvidia/cuda {plan.flavor}): {reason}"
              for name, reason in zip(plan.jit, plan.reasons)]
    sources = sorted({release.source, toolkit.source, image.source, gpu.source, profile.source}
                     | ({rule.source} if rule else set()) | set(plan.sources))
    torch = fields["torch"]
    return Stack(
        backend=release.backend, backend_version=release.version,
        backend_path=recipe.backend.trtllm_path or "vllm",
        cuda=toolkit.version, cuda_minor=release.cuda, os=image.os, python=fields["os"].python,
        builder_image=image.ref("devel"), runtime_image=image.ref(plan.flavor),
        runtime_flavor=plan.flavor, runtime_packages=plan.packages,
        runtime_toolchain=plan.toolchain, jit=plan.jit, torch=torch, tensorrt=release.tensorrt,
        gpu=gpu.name, compute_capability=gpu.compute_capability, sm=gpu.sm,
        archs=(gpu.compute_capability,) if engine else release.cuda_archs, arch_exact=engine,
        precision=precision,
        precision_min_cc=(rule.min_compute_capability or "") if rule else "",
        precision_max_cc=(rule.max_compute_capability or "") if rule else "",
        kv_cache_dtype=recipe.engine.kv_cache_dtype,
        tensor_parallel=recipe.target.count, pipeline_parallel=recipe.target.pipeline_parallel,
        driver_policy=policy, driver_floor=fields["floor"], strict_floor=fields["floors"][STRICT],
        compat_floor=fields["floors"][MINOR_COMPAT],
        nvidia_require_cuda=nvidia_require_cuda(toolkit.version, policy), fleet_driver=driver,
        notes=tuple(notes), sources=tuple(sources), unconfirmed=tuple(unconfirmed))


def fits_host(matrix: Matrix, gpu_name: str, driver: str, policy: str = STRICT,
              precision: str = "auto") -> list[tuple[BackendRelease, dict[str, Any] | None, list[Rejection]]]:
    """For `imgfab matrix`: every release of every backend evaluated on one host."""
    gpu = matrix.gpu(gpu_name)
    if gpu is None:
        raise RecipeError(f"unknown GPU {gpu_name!r}", field="--gpu",
                          fix="one of: " + ", ".join(g.name for g in matrix.gpus))
    out = []
    for backend in sorted(matrix.profiles):
        for release in matrix.backend_releases(backend):
            fields, failures = evaluate(matrix, release, gpu=gpu,
                                        precisions=(precision,) if precision != "auto" else (),
                                        driver=driver, policy=policy, os_names=_OS_ORDER)
            out.append((release, fields, failures))
    return out
