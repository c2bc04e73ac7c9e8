"""The nearest fix for a recipe no stack fits: the recipe change (driver, policy, OS, backend
version, precision) that makes the fewest, smallest changes and lets a candidate through,
weighed per constraint, and the recipe field each rejection is filed under.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imgfab.matrix.compat import BackendRelease, Gpu, Matrix
from imgfab.recipe import Recipe
from imgfab.in_image.rules import (MINOR_COMPAT, MINOR_COMPAT_LIMITS, STRICT, compare_versions,
                                   parse_version)
from imgfab.stack.candidates import (_OS_ORDER, Rejection, _python_ok, _torch_pin, evaluate,
                                     payload_floors, payload_of, precisions_to_check)


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
