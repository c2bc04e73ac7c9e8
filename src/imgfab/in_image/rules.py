"""Compatibility rules shared by the resolver, the in-image probe, `select` and `doctor`.

Standard library only: this file is copied into every image (as ``imgfab/in_image/rules.py`` beside the
probe), so the rule an image is checked against at start is the very code that chose its stack.

Each check returns a :class:`Verdict`; none raises on a failed check.

>>> check_driver("535.104.05", floor="570.124.06", policy="strict", cuda="12.8.1").ok
False
>>> binary_runs_on("8.6", ["8.0", "9.0"])
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STRICT = "strict"
MINOR_COMPAT = "minor-compat"
FORWARD_COMPAT = "forward-compat"
POLICIES = (STRICT, MINOR_COMPAT, FORWARD_COMPAT)

# What forward compatibility is (NVIDIA CUDA Compatibility guide, "Forward Compatibility"): the
# image's cuda-compat libcuda (/usr/local/cuda/compat) replaces the host's user-mode driver, on
# datacenter GPUs and the driver branches NVIDIA lists for that CUDA only.
FORWARD_COMPAT_LIMITS = (
    "forward compatibility: the image's cuda-compat libcuda runs over the host's kernel driver; "
    "datacenter GPUs and the supported driver branches only"
)

# What CUDA minor-version compatibility does not give (NVIDIA CUDA Compatibility guide,
# "Minor Version Compatibility" limitations). Printed wherever an image relies on it.
MINOR_COMPAT_LIMITS = (
    "minor-version compatibility: PTX newer than the driver cannot be JIT-compiled, and "
    "features that need a newer driver fail at run time"
)

_VERSION = re.compile(r"^\d+(\.\d+)*$")


def parse_version(text: str) -> tuple[int, ...]:
    """``"535.104.05"`` → ``(535, 104, 5)``. Raises ValueError on anything else."""
    text = text.strip()
    if not _VERSION.match(text):
        raise ValueError(f"not a dotted numeric version: {text!r}")
    return tuple(int(part) for part in text.split("."))


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as ``a`` is older, equal or newer than ``b`` (missing parts count as 0)."""
    pa, pb = parse_version(a), parse_version(b)
    width = max(len(pa), len(pb))
    pa += (0,) * (width - len(pa))
    pb += (0,) * (width - len(pb))
    return (pa > pb) - (pa < pb)


def major_minor(version: str) -> str:
    """``"12.8.1"`` → ``"12.8"``."""
    parts = parse_version(version)
    return f"{parts[0]}.{parts[1] if len(parts) > 1 else 0}"


@dataclass(frozen=True)
class Verdict:
    """Outcome of one check: ``reason`` says what was seen, ``fix`` what would make it pass."""

    ok: bool
    check: str
    reason: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.check}: {self.reason}"
        return f"{text}; fix: {self.fix}" if (self.fix and not self.ok) else text


def nvidia_require_cuda(cuda: str, policy: str) -> str:
    """The ``NVIDIA_REQUIRE_CUDA`` value that makes the container runtime enforce ``policy``.

    The NVIDIA container runtime compares ``cuda>=X.Y`` with the CUDA version the host driver
    reports. Strict: the image's own CUDA minor. Minor-version compatibility: the major's
    first release (``X.0``), whose driver floor is the branch floor the resolver applied, so
    an image resolved under minor-compat is not refused by its own guard.
    """
    major = parse_version(cuda)[0]
    if policy == STRICT:
        return f"cuda>={major_minor(cuda)}"
    if policy == MINOR_COMPAT:
        return f"cuda>={major}.0"
    if policy == FORWARD_COMPAT:
        # The host driver's own CUDA is older than the image's by design; the branch check
        # (check_forward_compat) is the guard, and the runtime check is left at the 11.0 floor
        # of forward compatibility's first release.
        return "cuda>=11.0"
    raise ValueError(f"unknown driver policy {policy!r}; expected one of {POLICIES}")


def check_driver(host_driver: str, *, floor: str, policy: str, cuda: str,
                 strict_floor: str | None = None, compat_floor: str | None = None) -> Verdict:
    """Is ``host_driver`` new enough for an image whose driver floor is ``floor``?

    ``floor`` is the floor the image was resolved under (its label). ``strict_floor``, when
    known, is the driver that runs ``cuda`` natively (its release's own floor): under
    minor-compat or forward-compat a host at or above it relies on neither, so its verdict
    names no minor-version limits, and a fix names it beside ``floor``. ``compat_floor``, when
    known, lets a strict image's fix name the minor-compat floor.

    >>> check_driver("580.95.05", floor="525.60.13", policy="minor-compat", cuda="12.8.1",
    ...              strict_floor="570.124.06").reason.split("; ")[1]
    '≥ 570.124.06, the strict floor: the host driver runs CUDA 12.8.1 natively'
    """
    # The floor at which this CUDA needs no compatibility layer, when it is above the image's own.
    native = strict_floor if (policy != STRICT and strict_floor
                              and compare_versions(strict_floor, floor) > 0) else None
    if compare_versions(host_driver, floor) >= 0:
        reason = f"driver {host_driver} ≥ {floor} (CUDA {cuda}, {policy})"
        if native and compare_versions(host_driver, native) >= 0:
            reason += f"; ≥ {native}, the strict floor: the host driver runs CUDA {cuda} natively"
        elif policy == MINOR_COMPAT:
            below = f"below {native}, the strict floor: " if native else ""
            reason += f"; {below}{MINOR_COMPAT_LIMITS}"
        return Verdict(True, "driver", reason)
    fix = f"upgrade the host driver to ≥ {floor}"
    if native:
        fix += f" ({native}, the strict floor, runs CUDA {cuda} natively)"
    if policy == STRICT and compat_floor and compare_versions(host_driver, compat_floor) >= 0:
        fix += (f", or resolve with target.driver_policy: minor-compat "
                f"(CUDA {major_minor(cuda).split('.')[0]}.x floor {compat_floor})")
    return Verdict(False, "driver",
                   f"host driver {host_driver} is older than {floor}, the {policy} floor for "
                   f"CUDA {cuda}", fix)


def parse_ceilings(text: str) -> dict[str, str]:
    """``"6.0:580,7.0:580"`` → ``{"6.0": "580", "7.0": "580"}`` (``""`` → ``{}``): per compute
    capability, NVIDIA's last driver branch for its architecture. Raises ValueError otherwise."""
    found: dict[str, str] = {}
    for item in text.split(",") if text else ():
        cc, _, branch = item.partition(":")
        if not re.fullmatch(r"\d{1,2}\.\d{1,2}", cc) or not re.fullmatch(r"\d{3,4}", branch):
            raise ValueError(f"not a compute-capability:branch pair: {item!r}")
        found[cc] = branch
    return found


def check_driver_ceiling(host_driver: str, compute_capability: str, *, ceilings: dict[str, str],
                         gpu: str = "") -> Verdict:
    """Does NVIDIA still support this GPU on ``host_driver``'s branch?

    ``ceilings`` maps a compute capability to the last driver branch NVIDIA supports its
    architecture on (CUDA Toolkit, Driver, and Architecture Matrix: Volta 7.0 → R580). A
    capability not in it has no announced ceiling.

    >>> check_driver_ceiling("590.48.01", "7.0", ceilings={"7.0": "580"}).ok
    False
    """
    who = f"{gpu} (compute capability {compute_capability})" if gpu else \
        f"compute capability {compute_capability}"
    last = ceilings.get(major_minor(compute_capability))
    branch = parse_version(host_driver)[0]
    if last is None:
        return Verdict(True, "driver", f"{who}: no last driver branch announced")
    if branch > int(last):
        return Verdict(False, "driver",
                       f"{who}: R{last} is NVIDIA's last driver branch for this architecture; "
                       f"host driver {host_driver} (R{branch}) does not support it",
                       f"run this GPU on an R{last} driver or older")
    return Verdict(True, "driver", f"{who}: driver R{branch} ≤ R{last}, its last branch")


def binary_runs_on(compute_capability: str, built_for: list[str]) -> bool:
    """True if a cubin built for one of ``built_for`` runs on ``compute_capability``.

    CUDA binary compatibility: a cubin for sm_XY runs on sm_XZ with Z ≥ Y (same major).
    Arch-specific targets (``9.0a``, ``10.0a``) run only on exactly that capability.
    """
    target_major, target_minor = parse_version(compute_capability)[:2]
    for arch in built_for:
        specific = arch.endswith(("a", "f"))
        major, minor = parse_version(arch.rstrip("af"))[:2]
        if specific and (major, minor) == (target_major, target_minor):
            return True
        if not specific and major == target_major and minor <= target_minor:
            return True
    return False


def check_arch(compute_capability: str, built_for: list[str], *, exact: bool,
               gpu: str = "") -> Verdict:
    """Does the GPU run code built for ``built_for``?

    ``exact`` is for TensorRT engines, which run only on the compute capability they were
    built on; wheels (``exact=False``) follow CUDA binary compatibility.
    """
    label = f"{gpu} (compute capability {compute_capability})" if gpu else \
        f"compute capability {compute_capability}"
    wanted = ", ".join(f"sm_{a.replace('.', '')}" for a in built_for)
    if exact:
        ok = any(compare_versions(compute_capability, a.rstrip("af")) == 0 for a in built_for)
        if ok:
            return Verdict(True, "arch", f"{label} matches the engine ({wanted})")
        return Verdict(False, "arch",
                       f"{label} cannot run a TensorRT engine built for {wanted}",
                       "pull the image built for this GPU, or rebuild with target.gpu set to it")
    if binary_runs_on(compute_capability, built_for):
        return Verdict(True, "arch", f"{label} is covered by kernels for {wanted}")
    return Verdict(False, "arch", f"{label} has no kernels in this build (built for {wanted})",
                   "choose a backend release whose wheels ship kernels for this GPU")


def check_precision(precision: str, compute_capability: str, *, min_cc: str | None,
                    max_cc: str | None = None, excluded: list[str] | tuple[str, ...] = (),
                    supported: bool = True, backend: str = "", gpu: str = "") -> Verdict:
    """Can ``precision`` run on ``compute_capability`` under ``backend``'s support matrix?"""
    who = gpu or f"compute capability {compute_capability}"
    if not supported:
        return Verdict(False, "precision", f"{backend} does not support {precision}",
                       "choose another engine.quantization")
    if min_cc and compare_versions(compute_capability, min_cc) < 0:
        return Verdict(False, "precision",
                       f"{precision} needs compute capability ≥ {min_cc}; {who} is "
                       f"{compute_capability}",
                       "use a GPU that supports it or another engine.quantization")
    if max_cc and compare_versions(compute_capability, max_cc) > 0:
        return Verdict(False, "precision",
                       f"{precision} under {backend} runs only up to compute capability "
                       f"{max_cc}; {who} is {compute_capability}",
                       "choose another engine.quantization")
    if any(compare_versions(compute_capability, c) == 0 for c in excluded):
        return Verdict(False, "precision",
                       f"{backend} excludes {precision} on compute capability "
                       f"{compute_capability} ({who})", "choose another engine.quantization")
    return Verdict(True, "precision", f"{precision} runs on {who} ({compute_capability})")


def ptx_runs_on(compute_capability: str, ptx: list[str] | tuple[str, ...]) -> bool:
    """True if PTX for one of ``ptx`` can be JIT-compiled for ``compute_capability``.

    PTX for compute_XY runs on every capability ≥ X.Y; arch-specific PTX (``9.0a``) only on X.Y.
    """
    for arch in ptx:
        specific = arch.endswith(("a", "f"))
        base = arch.rstrip("af")
        if specific and compare_versions(compute_capability, base) == 0:
            return True
        if not specific and compare_versions(compute_capability, base) >= 0:
            return True
    return False


def check_coverage(compute_capability: str, components: list[tuple[str, list[str], list[str]]],
                   *, gpu: str = "") -> Verdict:
    """Does every component of the payload carry code for the GPU?

    ``components`` are ``(name, sass, ptx)``, e.g. ``("torch 2.7.1", ["8.0", "9.0"], [])``; one
    with neither list is unknown and skipped. Coverage is the intersection: a GPU runs the image
    only if torch, the backend and each kernel library all have SASS for it or PTX below it.
    """
    label = f"{gpu} (compute capability {compute_capability})" if gpu else \
        f"compute capability {compute_capability}"
    missing = []
    for name, sass, ptx in components:
        if not sass and not ptx:
            continue
        if not binary_runs_on(compute_capability, list(sass)) and not ptx_runs_on(compute_capability, ptx):
            code = ", ".join(f"sm_{a.replace('.', '')}" for a in sass) or "none"
            jit = ", ".join(f"compute_{a.replace('.', '')}" for a in ptx) or "none"
            missing.append(f"{name} (SASS {code}; PTX {jit})")
    if missing:
        return Verdict(False, "arch", f"{label} has no code in " + "; ".join(missing),
                       "choose releases whose wheels carry sm_" + compute_capability.replace(".", ""))
    return Verdict(True, "arch", f"{label} is covered by every CUDA library of the payload")


def check_forward_compat(host_driver: str, *, cuda: str, branches: list[tuple[str, list[str]]],
                         datacenter: bool, gpu: str = "") -> Verdict:
    """May an image with CUDA ``cuda`` run on ``host_driver`` through forward compatibility?

    ``branches`` are ``(branch, [CUDA major.minor the compat package supports on it])`` from
    the matrix; forward compatibility needs a datacenter GPU and a listed branch.
    """
    if not datacenter:
        return Verdict(False, "driver", f"{gpu or 'this GPU'} is not a datacenter GPU; CUDA forward "
                       "compatibility does not run on it", "target.driver_policy: strict, and upgrade the driver")
    branch = str(parse_version(host_driver)[0])
    wanted = major_minor(cuda)
    for name, cudas in branches:
        if name == branch and wanted in cudas:
            return Verdict(True, "driver", f"driver branch R{branch} runs CUDA {wanted} through the "
                           f"image's cuda-compat package; {FORWARD_COMPAT_LIMITS}")
    listed = ", ".join(f"R{name}" for name, cudas in branches if wanted in cudas) or "none listed"
    own = next((cudas for name, cudas in branches if name == branch), None)
    package = "cuda-compat-" + wanted.replace(".", "-")
    # The fix follows NVIDIA's table: the branches its package row lists, or the CUDA minors
    # whose packages the host's own branch column lists.
    moves = [f"move the hosts to a branch NVIDIA lists for {package} ({listed})"] if listed != "none listed" else []
    if own:
        moves.append(f"choose a release whose CUDA R{branch} runs by forward compatibility "
                     f"({', '.join(own)})")
    moves.append("or use target.driver_policy: strict with a driver that runs CUDA "
                 f"{wanted} natively" if moves else
                 f"use target.driver_policy: strict with a driver that runs CUDA {wanted} natively")
    return Verdict(False, "driver", f"driver branch R{branch} is not a forward-compatibility branch "
                   f"for CUDA {wanted} (NVIDIA's table lists {package} on: {listed})",
                   ", ".join(moves))
