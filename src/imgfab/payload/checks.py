"""Lock-time checks of a resolved payload: one CUDA major, no two distributions writing one file
with different bytes (but the reviewed ones), torch built for the stack's CUDA major, each file
from the index its name is pinned to, every pin inside the ranges the backend's own wheel declares.
Each failure raises CompatibilityError naming the packages.
"""

from __future__ import annotations

import re
from urllib.parse import urlparse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from imgfab.in_image import stage
from imgfab.errors import CompatibilityError
from imgfab.payload.lockfile import _CUDA_WHEEL, LockedPackage, PayloadRequest, _collisions


def check_cuda_majors(packages: list[LockedPackage], allowed: tuple[str, ...] = ()) -> None:
    """One CUDA major among the ``nvidia-*-cuNN`` wheels; ``allowed`` names reviewed wheels of
    another major (compat/payload.yaml cuda_major_exceptions) that are left out of the count."""
    majors: dict[str, list[str]] = {}
    for package in packages:
        match = _CUDA_WHEEL.match(package.name)
        if match and package.name not in allowed:
            majors.setdefault(match.group(1), []).append(package.name)
    if len(majors) > 1:
        listed = "; ".join(f"cu{m}: {' '.join(sorted(n))}" for m, n in sorted(majors.items()))
        raise CompatibilityError(f"the payload mixes CUDA wheels of {len(majors)} majors ({listed})",
                                 field="lock", fix="pin torch from the index of the stack's CUDA "
                                 "major (compat/payload.yaml indexes)")


def check_file_collisions(packages: list[LockedPackage],
                          allowed: tuple[tuple[str, tuple[str, ...]], ...] = (), *,
                          families: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (),
                          cuda_major: str = "") -> None:
    """Two distributions installing one path with different bytes (one overwrites the other).

    ``allowed`` lists reviewed ``(path, packages)`` pairs (compat/payload.yaml). The refusal's
    fix names what answers the conflict: the compat/payload.yaml constraints row whose family
    holds every clashing name (``families``: (CUDA major, names, requirements)), else the
    release to pin or the review to add."""
    reviewed = {(path, tuple(sorted(names))) for path, names in allowed}
    clashes = sorted((path, who) for path, who in _collisions(packages).items()
                     if (path, tuple(sorted(n for n, _ in who))) not in reviewed)
    if clashes:
        shown = "; ".join(f"{path} ({' '.join(sorted(n for n, _ in who))})" for path, who in clashes[:5])
        more = f" and {len(clashes) - 5} more" if len(clashes) > 5 else ""
        versions = {p.name: p.version for p in packages}
        names = sorted({n for _, who in clashes for n, _ in who})
        raise CompatibilityError(f"distributions install the same file with different bytes: {shown}{more}",
                                 field="lock", fix=_collision_fix(names, versions, families, cuda_major))


def _collision_fix(names: list[str], versions: dict[str, str],
                   families: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...], cuda_major: str) -> str:
    pinned = " and ".join(f"{n} {versions[n]}" for n in names if n in versions)
    for major, family, requirements in families:
        if major == cuda_major and set(names) <= set(family):
            return (f"{pinned} are one family split across releases: bound it to the CUDA {major} line "
                    f"with compat/payload.yaml constraints ({', '.join(requirements)})")
    if any(set(names) <= set(family) for _, family, _ in families):
        rows = sorted({major for major, family, _ in families if set(names) <= set(family)})
        return (f"{pinned} are one family split across releases: add a compat/payload.yaml constraints "
                f"row for CUDA {cuda_major} (rows exist for CUDA {', '.join(rows)})")
    return (f"pin backend.version to an older release (compat/payloads.yaml records which install "
            f"cleanly), or, if {pinned} may overwrite each other, review the paths in compat/payload.yaml "
            "file_collisions_allowed")


def torch_cuda_major(package: LockedPackage) -> str | None:
    """The CUDA major a torch wheel was built for: its local version (``+cu130``), else the
    ``nvidia-*-cuNN`` / ``cuda-toolkit==NN.*`` wheels it requires; ``cpu`` for none."""
    local = re.search(r"\+(cu(\d+?)\d|cpu)$", package.version)
    if local:
        return "cpu" if local.group(1) == "cpu" else local.group(2)
    for line in package.requires:
        name = stage.normalize(re.split(r"[\s=<>!~;\[(]", line.strip(), maxsplit=1)[0])
        match = _CUDA_WHEEL.match(name) or re.match(r"^cuda-toolkit\b.*==\s*(\d+)\.", line)
        if match:
            return match.group(1)
    return "cpu" if package.requires else None


def check_torch_cuda(packages: list[LockedPackage], cuda_major: str, cuda: str) -> None:
    for package in packages:
        if package.name != "torch":
            continue
        major = torch_cuda_major(package)
        if major is not None and major != cuda_major:
            build = "a CPU-only build" if major == "cpu" else f"a CUDA {major} build"
            evidence = ", ".join(r.split(";")[0].strip() for r in package.requires
                                 if r.startswith("nvidia-nccl") or r.startswith("nvidia-cuda-runtime"))
            raise CompatibilityError(
                f"torch {package.version} from {_host(package.urls)} is {build}"
                + (f" ({evidence})" if evidence else "") + f", the stack is CUDA {cuda}",
                field="lock", fix="pin torch from the index of the stack's CUDA major "
                "(compat/payload.yaml indexes)")


def check_indexes(packages: list[LockedPackage], request: PayloadRequest, index_url: str | None) -> None:
    """Each file comes from the index its name is pinned to (dependency confusion)."""
    if index_url:
        return
    wrong = []
    for package in packages:
        expected = urlparse(request.index_of(package.name)).netloc
        hosts = {urlparse(u).netloc for u in package.urls}
        allowed = {expected, "files.pythonhosted.org"} if expected == "pypi.org" else {expected}
        if hosts - allowed:
            wrong.append(f"{package.name} ({' '.join(sorted(hosts))}, pinned to {expected})")
    if wrong:
        raise CompatibilityError(f"names taken from the wrong index: {'; '.join(wrong)}", field="lock",
                                 fix="fix compat/payload.yaml indexes")


def _host(urls: list[str]) -> str:
    return " ".join(sorted({f"{urlparse(u).scheme}://{urlparse(u).netloc}" for u in urls})) or "no index"


# The packages whose wheel METADATA says what the rest of the payload must be.
BACKENDS = ("vllm", "tensorrt-llm")


def marker_environment(python: str, platform: str) -> dict[str, str]:
    """PEP 508 marker values of the image's interpreter: CPython ``python`` on Linux, the
    machine of the uv ``platform`` (``x86_64-manylinux_2_39`` → ``x86_64``), no extra."""
    return {"os_name": "posix", "sys_platform": "linux", "platform_system": "Linux",
            "platform_machine": platform.split("-", 1)[0], "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "python_version": python,
            "python_full_version": f"{python}.0", "extra": ""}


def check_declared_ranges(packages: list[LockedPackage], request: PayloadRequest) -> None:
    """Every locked pin inside the range the backend's own wheel declares for it (its
    METADATA ``Requires-Dist``, read at lock time into ``requires``; requirements behind an
    extra or a marker false for the image's interpreter do not apply).

    uv honours these ranges when it resolves; a pin outside one comes from a pin of the stack
    (torch, the JIT toolchain, a what-if ``extra_pins``) forced past them, or from metadata that
    differs between the index and the wheel. Refused naming the package, the pin and the range."""
    environment = marker_environment(request.python, request.platform)
    locked = {p.name: p for p in packages}
    pinned = {stage.normalize(pin.split("==", 1)[0]) for pin in request.pins}
    for backend in (locked[name] for name in BACKENDS if name in locked):
        for line in backend.requires:
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                raise CompatibilityError(f"{backend.name} {backend.version} declares an unreadable "
                                         f"requirement {line!r}", field="lock",
                                         fix="report it; the lock cannot be checked against it") from None
            name = stage.normalize(requirement.name)
            if name not in locked or (requirement.marker is not None
                                      and not requirement.marker.evaluate(environment)):
                continue
            try:
                inside = requirement.specifier.contains(Version(locked[name].version), prereleases=True)
            except InvalidVersion:
                inside = False
            if not inside:
                whose = "a pin of the stack" if name in pinned else "what uv resolved"
                raise CompatibilityError(
                    f"{name} {locked[name].version} is incompatible with {backend.name} {backend.version}: "
                    f"the lock pins {name}=={locked[name].version} ({whose}), {backend.name} "
                    f"{backend.version} declares {name}{requirement.specifier} (its wheel's Requires-Dist)",
                    field="lock", fix=f"pin {name} inside {requirement.specifier}, or pick the "
                    f"{backend.name} release that declares {name}=={locked[name].version}")


def check_packages(packages: list[LockedPackage], request: PayloadRequest, cuda: str,
                   index_url: str | None = None) -> None:
    """Every lock-time check; the first to fail raises :class:`CompatibilityError`."""
    check_declared_ranges(packages, request)
    check_indexes(packages, request, index_url)
    check_cuda_majors(packages, request.other_majors_allowed)
    check_torch_cuda(packages, request.cuda_major, cuda)
    check_file_collisions(packages, request.collisions_allowed, families=request.families,
                          cuda_major=request.cuda_major)
