"""Lock-time checks of a resolved payload: one CUDA major, no two distributions writing one file
with different bytes (but the reviewed ones), torch built for the stack's CUDA major, each file
from the index its name is pinned to. Each failure raises CompatibilityError naming the packages.
"""

from __future__ import annotations

import re
from urllib.parse import urlparse


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
                          allowed: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> None:
    """Two distributions installing one path with different bytes (one overwrites the other).

    ``allowed`` lists reviewed ``(path, packages)`` pairs (compat/payload.yaml)."""
    reviewed = {(path, tuple(sorted(names))) for path, names in allowed}
    clashes = sorted((path, who) for path, who in _collisions(packages).items()
                     if (path, tuple(sorted(n for n, _ in who))) not in reviewed)
    if clashes:
        shown = "; ".join(f"{path} ({' '.join(sorted(n for n, _ in who))})" for path, who in clashes[:5])
        more = f" and {len(clashes) - 5} more" if len(clashes) > 5 else ""
        raise CompatibilityError(f"distributions install the same file with different bytes: {shown}{more}",
                                 field="lock", fix="drop one of them, or pin both to one CUDA major")


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


def check_packages(packages: list[LockedPackage], request: PayloadRequest, cuda: str,
                   index_url: str | None = None) -> None:
    """Every lock-time check; the first to fail raises :class:`CompatibilityError`."""
    check_indexes(packages, request, index_url)
    check_cuda_majors(packages, request.other_majors_allowed)
    check_torch_cuda(packages, request.cuda_major, cuda)
    check_file_collisions(packages, request.collisions_allowed)
