"""The nearest fix for a recipe no stack fits: the recipe change (driver, policy, OS, backend
version, precision) that makes the fewest, smallest changes and lets a candidate through,
weighed per constraint, and the recipe field each rejection is filed under.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imgfab.matrix.compat import BackendRelease, Gpu, Matrix
from imgfab.recipe import Quantization, Recipe
from imgfab.in_image.rules import (FORWARD_COMPAT, MINOR_COMPAT, MINOR_COMPAT_LIMITS, STRICT,
                                   compare_versions, major_minor, parse_version)
from imgfab.stack.candidates import (_DTYPE_PRECISION, _OS_ORDER, RELEASE_CONSTRAINTS, Rejection,
                                     _python_ok, _torch_pin, evaluate, payload_floors, payload_of)


def _field_for(constraint: str) -> str:
    return {"version": "backend.version", "gpu": "target.gpu", "arch": "target.gpu", "precision": "engine.quantization",
            "dtype": "engine.dtype", "kv-cache": "engine.kv_cache_dtype",
            "python": "image.os", "image": "image.os", "driver": "target.driver",
            "torch": "backend.version", "payload": "backend.version", "gpu-driver": "target.driver",
            "advisory": "backend.accept_advisories"}.get(constraint, "recipe")


@dataclass(frozen=True, order=True)
class _Fix:
    """One way to make the recipe resolve; ordered by (weight, EOL tag, driver needed, newer release)."""

    weight: int
    eol: bool  # a supported nvidia/cuda tag beats an end-of-life one
    driver: tuple[int, ...]
    newer_first: tuple[int, ...]
    text: str = field(compare=False)


# The methods a recipe can name (engine.quantization), besides none.
_QUANTIZATIONS = tuple(q.value for q in Quantization if q.value != "none")

# How heavy each recipe change is: a pin, an OS, a policy or a dtype is an edit; a driver upgrade
# touches every host of the fleet, and another quantization another checkpoint, so each weighs two.
_WEIGHTS = {"version": 1, "os": 1, "policy": 1, "dtype": 1, "kv-cache": 1, "driver": 2,
            "quantization": 2}


def _precision_variants(recipe: Recipe, matrix: Matrix, backend: str
                        ) -> list[tuple[list[tuple[str, str]], tuple[str, ...]]]:
    """The recipe's precisions and every single or combined relaxation of them: (changes,
    precisions to check). bf16 → fp16 (engine.dtype: float16), fp8 KV cache → auto, the
    quantization → none or another method the backend has rules for."""
    quant = recipe.engine.quantization
    dtype = _DTYPE_PRECISION[recipe.engine.dtype]
    kv = recipe.engine.kv_cache_dtype == "fp8"
    quants = [(quant, [])]
    if quant != "none":
        quants.append(("none", [("quantization", "engine.quantization: none")]))
    methods = sorted({r.precision for r in matrix.precisions if r.backend == backend}
                     - {"bf16", "fp16", "kv_fp8", quant})
    quants += [(m, [("quantization", f"engine.quantization: {m}")]) for m in methods
               if m in _QUANTIZATIONS]
    dtypes = [(dtype, [])] + ([("fp16", [("dtype", "engine.dtype: float16")])] if dtype == "bf16" else [])
    kvs = [(kv, [])] + ([(False, [("kv-cache", "engine.kv_cache_dtype: auto")])] if kv else [])
    variants = []
    for q, qc in quants:
        for d, dc in dtypes:
            for k, kc in kvs:
                names = tuple(p for p in (q, d, "kv_fp8" if k else "none") if p not in ("none", "auto"))
                variants.append((qc + dc + kc, names))
    return variants


def _forward_need(matrix: Matrix, driver: str, cuda: str) -> tuple[str, str] | None:
    """Under forward-compat: None when the host's branch runs ``cuda`` by NVIDIA's table, else
    (the lowest listed branch above the host's, what the table says); ("", "") when none is."""
    branch = str(parse_version(driver)[0])
    listed = sorted((b.branch for b in matrix.driver_branches if major_minor(cuda) in b.forward_compat_cuda),
                    key=int)
    if branch in listed:
        return None
    above = [b for b in listed if int(b) > int(branch)]
    if not above:
        return ("", "")
    package = "cuda-compat-" + major_minor(cuda).replace(".", "-")
    return (above[0], f"NVIDIA's forward-compatibility table lists {package} on "
                      f"{', '.join('R' + b for b in listed)}")


def _nearest_fix(recipe: Recipe, matrix: Matrix, gpu: Gpu,
                 failures_by_release: list[tuple[BackendRelease, list[Rejection]]], driver: str) -> str:
    """The smallest recipe change that makes some candidate fit, searched over combinations.

    Every release × OS × image patch is tried with every relaxation at once: widen the version
    pin, change image.os, switch strict → minor-compat, raise the fleet driver (to the payload's
    floor and the GPU's own minimum together; under forward-compat, to a branch NVIDIA's
    forward-compatibility table lists for the payload's CUDA), and relax the precision (bf16 →
    float16, fp8 KV cache → auto, another quantization). A candidate whose payload has no code
    for the GPU, no torch row or no Python match is not fixable by these and is skipped, and
    so is a driver the GPU's architecture is past (NVIDIA's last branch for it). The fix with
    the fewest/lightest changes wins, then the lowest driver, then the newest release.
    """
    policy = recipe.target.driver_policy
    spec = SpecifierSet(recipe.backend.version or "")
    best: _Fix | None = None
    ceiling = int(gpu.last_driver_branch) if gpu.last_driver_branch else None
    for release, _ in failures_by_release:
        variant = None
        for precision_changes, precisions in _precision_variants(recipe, matrix, release.backend):
            _, failures = evaluate(matrix, release, gpu=gpu, precisions=precisions, driver="9999",
                                   policy=STRICT, os_names=_OS_ORDER)
            if not any(f.constraint in RELEASE_CONSTRAINTS for f in failures):
                variant = precision_changes
                break
        if variant is None:
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
                options: list[tuple[str, str, str]] = []  # (policy, driver needed, its text)
                if policy == FORWARD_COMPAT and gpu.datacenter:
                    need = _forward_need(matrix, driver, floors["cuda"])
                    if need is None:
                        options.append((policy, "0", ""))
                    elif need[0]:
                        options.append((policy, need[0], need[1]))
                    options.append((STRICT, floors[STRICT], ""))
                else:
                    options.append((policy if policy != FORWARD_COMPAT else STRICT,
                                    floors.get(policy) or floors[STRICT], ""))
                if policy in (STRICT, FORWARD_COMPAT) and floors[MINOR_COMPAT]:
                    options.append((MINOR_COMPAT, floors[MINOR_COMPAT], ""))
                for chosen_policy, floor, text in options:
                    need = max((floor, gpu.min_driver or "0"), key=parse_version)
                    if ceiling is not None and parse_version(need)[0] > ceiling:
                        continue  # no driver that new drives this GPU
                    changes: list[tuple[str, str]] = list(variant)
                    if Version(release.version) not in spec:
                        changes.append(("version", f"backend.version: '=={release.version}'"))
                    if recipe.image.os and recipe.image.os != os_name:
                        changes.append(("os", f"image.os: {os_name}"))
                    if chosen_policy != policy:
                        limits = f" ({MINOR_COMPAT_LIMITS})" if chosen_policy == MINOR_COMPAT else ""
                        changes.append(("policy", f"target.driver_policy: {chosen_policy}{limits}"))
                    if compare_versions(driver, need) < 0:
                        changes.append(("driver", f"move target.driver to branch R{parse_version(need)[0]}"
                                        + (f" (≥ {need})" if need != floor else "") + f" ({text})"
                                        if text else f"raise target.driver to ≥ {need}"))
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
    unsupported = next((f for _, failures in failures_by_release for f in failures
                        if f.constraint == "gpu"), None)
    if unsupported is not None:
        return _unsupported_gpu_fix(recipe, matrix, gpu, unsupported)
    for _, failures in failures_by_release:
        for failure in failures:
            if failure.constraint in ("precision", "dtype", "kv-cache", "gpu-driver") and failure.fix:
                return failure.fix
    return f"run `imgfab matrix --gpu {gpu.name} --driver {driver}` to see what fits this host"


def _unsupported_gpu_fix(recipe: Recipe, matrix: Matrix, gpu: Gpu, unsupported: Rejection) -> str:
    """The fix for a GPU the recipe's backend does not support at all: the nearest GPU it
    supports (the rejection's own fix), or another backend whose newest release runs ``gpu``
    with the recipe's precision or its lightest relaxation (bf16 → float16 on a T4)."""
    for backend in sorted(set(matrix.profiles) - {recipe.backend.name}):
        for release in matrix.backend_releases(backend):
            for changes, precisions in _precision_variants(recipe, matrix, backend):
                _, failures = evaluate(matrix, release, gpu=gpu, precisions=precisions, driver="9999",
                                       policy=STRICT, os_names=_OS_ORDER)
                if any(f.constraint in RELEASE_CONSTRAINTS for f in failures):
                    continue
                drop = [f for f, given in (("backend.version", recipe.backend.version),
                                           ("backend.trtllm_path", recipe.backend.trtllm_path)) if given]
                also = "".join(f" and {text}" for _, text in changes)
                dropped = f", without {' and '.join(drop)}" if drop else ""
                return (f"{unsupported.fix}; or backend.name: {backend}{also}{dropped} ({backend} "
                        f"{release.version} runs {gpu.name})")
    return unsupported.fix
