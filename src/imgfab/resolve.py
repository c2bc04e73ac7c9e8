"""Recipe × Matrix × Host → Stack. Pure: no I/O, deterministic.

:func:`resolve` returns the newest :class:`Stack` that satisfies every constraint, or raises
:class:`~imgfab.errors.CompatibilityError` listing every candidate with the constraint that
eliminated it and the nearest recipe change that would work.

Constraints, checked in this order for each candidate (backend release × OS × CUDA patch):
backend version pin, GPU architecture vs the code of every CUDA library in the payload (torch
and the backend: the intersection), the GPU's own driver minimum, precision vs compute
capability (per backend version range), Python of the OS vs the wheels, the ``nvidia/cuda``
images (supported tags before end-of-life ones), the host driver floor.

The strict driver floor is the driver of the newest CUDA runtime in the payload: the cudart
that torch's wheel pins (``compat/torch.yaml`` ``cuda_runtime`` → ``compat/cuda.yaml``
``runtimes``), plus the image's toolkit when the backend runs on a ``devel`` image (it links
the system CUDA). The ``nvidia/cuda`` base patch of a ``base`` image is not in the payload.
"""

from __future__ import annotations

from dataclasses import dataclass, field, asdict
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imgfab.compat import BackendRelease, CudaToolkit, Gpu, Matrix, TorchRelease
from imgfab.errors import CompatibilityError, RecipeError
from imgfab.recipe import Recipe
from imgfab.rules import (FORWARD_COMPAT, MINOR_COMPAT, MINOR_COMPAT_LIMITS, STRICT, check_coverage,
                          check_driver, check_forward_compat, check_precision, compare_versions,
                          major_minor, nvidia_require_cuda, parse_version)
from imgfab.toolchain import PayloadToolchainUnavailable, runtime_plan

# OS preference when the recipe does not name one: newest first.
_OS_ORDER = ("ubuntu24.04", "ubuntu22.04")
# Order in which a candidate's failures are reported.
_PRIORITY = ("version", "arch", "gpu-driver", "precision", "torch", "driver", "python", "image")


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
    jit_compiles: tuple[str, ...]  # what serving compiles at start, "name: what" per toolchain
    cuda_home: str  # where the run-time nvcc lives ("" when nothing needs one)
    payload_toolchain: tuple[str, ...]  # payload pins the run-time toolchain adds to the lock
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
    payload_runtime: str  # the newest CUDA runtime the payload brings, e.g. "12.8.90"
    payload_runtime_toolkit: str  # the toolkit release that first ships it, e.g. "12.8.1"
    payload_runtime_from: str  # which component brings it, e.g. "torch 2.10.0 (nvidia-cuda-runtime)"
    torch_index: str
    torch_archs: tuple[str, ...]  # SASS (and "+PTX" entries) measured in torch's CUDA library
    backend_archs: tuple[str, ...]  # SASS measured in the backend's own CUDA library
    image_eol: bool
    cuda_compat: str  # "drop": the runtime stage removes /usr/local/cuda/compat; "keep": forward-compat
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
    from imgfab.rules import binary_runs_on, ptx_runs_on

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
            failures.append(Rejection(label, "precision", verdict.reason, verdict.fix))

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


def resolve(recipe: Recipe, matrix: Matrix, host: Host | None = None) -> Resolution:
    """Pick the newest stack that fits; raise CompatibilityError naming every rejected candidate."""
    gpu = matrix.gpu(recipe.target.gpu)
    if gpu is None:
        known = ", ".join(g.name for g in matrix.gpus)
        raise RecipeError(f"unknown GPU {recipe.target.gpu!r}", field="target.gpu",
                          fix=f"one of: {known}")
    refuse_cpu_arch(gpu, "target.gpu")
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
    # Headline: the newest candidate the recipe admits, else the newest of all.
    first = next((r for r in rejections if r.constraint != "version"), rejections[0])
    raise CompatibilityError(
        f"no {recipe.backend.name} stack fits {gpu.name} with driver {driver} ({policy}); "
        f"{len(rejections)} candidates rejected, newest: {first.candidate}: {first.reason}",
        field=_field_for(first.constraint), fix=fix,
        rejections=[(r.candidate, f"{r.constraint}: {r.reason}") for r in rejections])


def refuse_cpu_arch(gpu: Gpu, where: str) -> None:
    """One line for a GPU whose hosts are not x86_64: every image row in the matrix is linux/amd64."""
    if gpu.cpu_arch != "x86_64":
        raise RecipeError(
            f"{gpu.name} hosts are {gpu.cpu_arch} (Grace superchip) and imgfab builds linux/amd64 "
            f"images only: the matrix records x86_64 wheels (torch, vLLM, TensorRT-LLM) and amd64 "
            f"nvidia/cuda tags, whose kernel lists and CUDA runtimes differ on aarch64",
            field=where, fix="target an x86_64 GPU host (e.g. H100-SXM, B200)")


def _field_for(constraint: str) -> str:
    return {"version": "backend.version", "arch": "target.gpu", "precision": "engine.quantization",
            "python": "image.os", "image": "image.os", "driver": "target.driver",
            "torch": "backend.version", "gpu-driver": "target.driver"}.get(constraint, "recipe")


@dataclass(frozen=True, order=True)
class _Fix:
    """One way to make the recipe resolve; ordered by (weight, EOL tag, driver needed, newer release)."""

    weight: int
    eol: bool  # a supported nvidia/cuda tag beats an end-of-life one
    driver: tuple[int, ...]
    newer_first: tuple[int, ...]
    text: str = field(compare=False)


# How heavy each recipe change is: a pin, an OS or a policy is an edit; a driver upgrade touches
# every host of the fleet, so it weighs two edits.
_WEIGHTS = {"version": 1, "os": 1, "policy": 1, "driver": 2}


def _nearest_fix(recipe: Recipe, matrix: Matrix, gpu: Gpu, precision: str,
                 failures_by_release: list[tuple[BackendRelease, list[Rejection]]], driver: str) -> str:
    """The smallest recipe change that makes some candidate fit, searched over combinations.

    Every release × OS × image patch is tried with every relaxation at once: widen the version
    pin, change image.os, switch strict → minor-compat, raise the fleet driver (to the payload's
    floor and the GPU's own minimum together). A candidate whose payload has no code for the GPU,
    no torch row or no Python match is not fixable by these and is skipped. The fix with the
    fewest/lightest changes wins, then the lowest driver, then the newest release. A precision
    failure that no relaxation fixes falls back to its own fix.
    """
    policy = recipe.target.driver_policy
    spec = SpecifierSet(recipe.backend.version or "")
    precisions = precisions_to_check(recipe)
    best: _Fix | None = None
    for release, _ in failures_by_release:
        fields, failures = evaluate(matrix, release, gpu=gpu, precisions=precisions, driver="9999",
                                    policy=STRICT, os_names=_OS_ORDER)
        if any(f.constraint in ("arch", "torch", "precision") for f in failures):
            continue
        torch = _torch_pin(matrix, release)
        profile = matrix.profiles[release.backend]
        for os_name in _OS_ORDER:
            os_release = matrix.os_releases.get(os_name)
            if os_release is None or _python_ok(os_release.python, release):
                continue
            for toolkit in matrix.patches(release.cuda):
                image = matrix.image(toolkit.version, os_name)
                if image is None or not {"devel", profile.runtime_flavor} <= set(image.flavors):
                    continue
                payload = payload_of(matrix, release, torch, toolkit, profile.runtime_flavor == "devel")
                floors = payload_floors(matrix, toolkit, payload)
                options = [(policy, floors.get(policy) or floors[STRICT])]
                if policy == STRICT and floors[MINOR_COMPAT]:
                    options.append((MINOR_COMPAT, floors[MINOR_COMPAT]))
                for chosen_policy, floor in options:
                    need = max((floor, gpu.min_driver or "0"), key=parse_version)
                    changes: list[tuple[str, str]] = []
                    if Version(release.version) not in spec:
                        changes.append(("version", f"backend.version: '=={release.version}'"))
                    if recipe.image.os and recipe.image.os != os_name:
                        changes.append(("os", f"image.os: {os_name}"))
                    if chosen_policy != policy:
                        changes.append(("policy", f"target.driver_policy: {chosen_policy} "
                                                  f"({MINOR_COMPAT_LIMITS})"))
                    if compare_versions(driver, need) < 0:
                        changes.append(("driver", f"raise target.driver to ≥ {need}"))
                    if not changes:
                        continue
                    why = (f"{release.backend} {release.version}"
                           + (f", torch {torch}" if torch else "")
                           + f", CUDA {toolkit.version} image, {os_name}; floor from {floors['from']}")
                    fix = _Fix(weight=sum(_WEIGHTS[k] for k, _ in changes), eol=image.eol,
                               driver=parse_version(need) if compare_versions(driver, need) < 0 else (0,),
                               newer_first=tuple(-p for p in Version(release.version).release),
                               text=" and ".join(t for _, t in changes) + f" ({why})")
                    best = fix if best is None or fix < best else best
    if best is not None:
        return best.text
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
    rule = matrix.precision_rule(release.backend, precision, release.version)
    payload: Payload = fields["payload"]
    floors = fields["floors"]
    torch_row = matrix.torch.get(fields["torch"]) if fields["torch"] else None
    try:
        plan = runtime_plan(profile, backend_version=release.version,
                            compute_capability=gpu.compute_capability,
                            kv_cache_dtype=recipe.engine.kv_cache_dtype, precision=precision,
                            cuda_major=toolkit.version.split(".")[0])
    except PayloadToolchainUnavailable as exc:
        raise CompatibilityError(f"{release.backend} {release.version} on {gpu.name}: {exc}",
                                 field="backend.version",
                                 fix="add a toolchain: image row for this release to "
                                     "compat/backends.yaml, or pin another backend.version") from None
    payload_toolchain = _payload_toolchain(plan, torch_row, release)
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
    if floors.get("runtime") and floors["from"].startswith("the image's"):
        notes.append(f"strict driver floor {floors[STRICT]}: {release.backend} links the image's CUDA "
                     f"{toolkit.version} ({plan.flavor} image), the newest runtime in the payload")
    elif floors.get("runtime"):
        notes.append(f"strict driver floor {floors[STRICT]} comes from {floors['from']} → CUDA "
                     f"{floors['runtime']}, not from the base image's CUDA {toolkit.version}")
    for missing in payload.unknown:
        notes.append(f"{missing} maps to no CUDA release in compat/cuda.yaml runtimes; floor from the image")
    if policy == MINOR_COMPAT:
        notes.append(f"driver floor {fields['floor']} relies on CUDA {floors['cuda'].split('.')[0]}.x "
                     f"{MINOR_COMPAT_LIMITS}; strict floor would be {floors[STRICT]}")
    if policy == FORWARD_COMPAT:
        notes.append(f"forward-compat: runs on driver {driver} through the image's cuda-compat package "
                     f"(/usr/local/cuda/compat kept); datacenter GPUs only; strict floor would be {floors[STRICT]}")
        branch = next((b for b in matrix.driver_branches if b.branch == driver.split(".")[0]), None)
        if branch is not None and branch.end_of_life:
            notes.append(f"driver branch R{branch.branch} ({branch.kind}) reaches end of life {branch.end_of_life}")
    if fields.get("eol_only"):
        notes.append(f"only an end-of-life tag fits: {image.ref(plan.flavor)} (NVIDIA deletes "
                     "end-of-life tags six months after end of life; mirror it)")
    for name in precisions_to_check(recipe):
        weight_rule = matrix.precision_rule(release.backend, name, release.version)
        native = weight_rule.native_min_compute_capability if weight_rule else None
        if native and compare_versions(gpu.compute_capability, native) < 0:
            notes.append(f"{name} on {gpu.sm.replace('sm', 'sm_')} runs weight-only ({weight_rule.fallback}); "
                         f"native {name.upper() if name == 'nvfp4' else name} needs compute capability ≥ {native}")
    if engine:
        notes.append(f"TensorRT engine is compiled for sm_{gpu.sm[2:]} only and runs on no other GPU")
    runtime = floors.get("runtime", "")
    unconfirmed = [u for u in matrix.unconfirmed
                   if u.startswith((f"{release.backend} {release.version}:", f"cuda {toolkit.version}:",
                                    f"gpu {gpu.name}:", f"torch {fields['torch']}:"))
                   or (runtime and u.startswith(f"cuda {runtime}:"))
                   or (torch_row is not None and u.startswith(f"cudart {torch_row.cuda_runtime}:"))]
    if not profile.confirmed:
        unconfirmed.append(f"backends {release.backend}: {profile.reason}")
    unconfirmed += plan.unconfirmed
    notes += [f"runtime carries {name} ({origin}): {reason}"
              for name, origin, reason in zip(plan.jit, plan.origins, plan.reasons)]
    sources = sorted({release.source, toolkit.source, image.source, gpu.source, profile.source}
                     | ({rule.source} if rule else set()) | set(plan.sources)
                     | ({torch_row.source} | ({torch_row.fatbin_source} if torch_row.fatbin_source else set())
                        if torch_row else set())
                     | ({matrix.toolkits[runtime].source} if runtime in matrix.toolkits else set())
                     | ({matrix.runtimes[torch_row.cuda_runtime].source}
                        if torch_row and torch_row.cuda_runtime in matrix.runtimes else set()))
    torch = fields["torch"]
    return Stack(
        backend=release.backend, backend_version=release.version,
        backend_path=recipe.backend.trtllm_path or "vllm",
        cuda=toolkit.version, cuda_minor=release.cuda, os=image.os, python=fields["os"].python,
        builder_image=image.ref("devel"), runtime_image=image.ref(plan.flavor),
        runtime_flavor=plan.flavor, runtime_packages=plan.packages,
        runtime_toolchain=plan.toolchain, jit=plan.jit, jit_compiles=plan.compiles,
        cuda_home=plan.cuda_home, payload_toolchain=payload_toolchain,
        torch=torch, tensorrt=release.tensorrt,
        gpu=gpu.name, compute_capability=gpu.compute_capability, sm=gpu.sm,
        archs=(gpu.compute_capability,) if engine else covered_archs(payload), arch_exact=engine,
        precision=precision,
        precision_min_cc=(rule.min_compute_capability or "") if rule else "",
        precision_max_cc=(rule.max_compute_capability or "") if rule else "",
        kv_cache_dtype=recipe.engine.kv_cache_dtype,
        tensor_parallel=recipe.target.count, pipeline_parallel=recipe.target.pipeline_parallel,
        driver_policy=policy, driver_floor=fields["floor"], strict_floor=floors[STRICT],
        compat_floor=floors[MINOR_COMPAT],
        nvidia_require_cuda=nvidia_require_cuda(floors["cuda"], policy), fleet_driver=driver,
        payload_runtime=floors.get("pin", ""),
        payload_runtime_toolkit=runtime, payload_runtime_from=floors.get("from", "") if runtime else "",
        torch_index=torch_row.index if torch_row else "",
        torch_archs=(tuple(torch_row.sass) + tuple(f"{a}+PTX" for a in torch_row.ptx)) if torch_row else (),
        backend_archs=release.fatbin_sass, image_eol=image.eol,
        cuda_compat="keep" if policy == FORWARD_COMPAT else "drop",
        notes=tuple(notes), sources=tuple(sources), unconfirmed=tuple(unconfirmed))


def _payload_toolchain(plan: Any, torch_row: Any, release: BackendRelease) -> tuple[str, ...]:
    """The plan's payload requirements pinned to the CUDA toolkit torch pins: its
    ``cuda_runtime`` is the ``cuda-toolkit[...]==X`` release of its METADATA (torch >= 2.11)."""
    if not plan.payload_requirements:
        return ()
    if torch_row is None or "cuda-toolkit[" not in torch_row.source:
        raise CompatibilityError(
            f"{release.backend} {release.version}: its run-time toolchain comes from the payload's "
            f"cuda-toolkit wheels, but its torch {torch_row.version if torch_row else '(none)'} "
            "pins no cuda-toolkit release to match", field="backend.version",
            fix="use a torch that pins cuda-toolkit (2.11+), or a toolchain: image row")
    return tuple(sorted(f"{req}=={torch_row.cuda_runtime}" for req in plan.payload_requirements))


def fits_host(matrix: Matrix, gpu_name: str, driver: str, policy: str = STRICT,
              precision: str = "auto") -> list[tuple[BackendRelease, dict[str, Any] | None, list[Rejection]]]:
    """For `imgfab matrix`: every release of every backend evaluated on one host."""
    gpu = matrix.gpu(gpu_name)
    if gpu is None:
        raise RecipeError(f"unknown GPU {gpu_name!r}", field="--gpu",
                          fix="one of: " + ", ".join(g.name for g in matrix.gpus))
    refuse_cpu_arch(gpu, "--gpu")
    out = []
    for backend in sorted(matrix.profiles):
        for release in matrix.backend_releases(backend):
            fields, failures = evaluate(matrix, release, gpu=gpu,
                                        precisions=(precision,) if precision != "auto" else (),
                                        driver=driver, policy=policy, os_names=_OS_ORDER)
            out.append((release, fields, failures))
    return out
