"""``imgfab compat refresh --payloads``: lock every vLLM release of the matrix the way ``imgfab
lock`` would, and record in ``compat/payloads.yaml`` whether its payload installs cleanly.

Each release is locked for a representative stack (:data:`PROBE_GPU`, one GPU, the newest
driver the matrix knows, strict policy): the stack's own pins, Python, wheel platform, JIT
toolchain, compat/payload.yaml constraints and era bound, then uv and every wheel's RECORD
(:func:`imgfab.payload.lock.resolve_packages`, :func:`~imgfab.payload.lock.inspect_packages`)
and the lock's checks (:func:`~imgfab.payload.checks.check_packages`). A refusal is recorded
with its reason; the resolver rejects such a release (constraint ``payload``), so a recipe
moves to the newest release that installs, and says why.

A row is kept while the lock inputs' fingerprint (pins, era bound, constraints, installer, ...)
is unchanged, so a second run checks only releases that are new or whose inputs moved.
TensorRT-LLM releases are not checked: their wheels are on NVIDIA's index (compat/payload.yaml
indexes), which the lock refuses when it does not answer, for another reason than the payload.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

from imgfab.errors import CompatibilityError
from imgfab.matrix.compat import Matrix, default_compat_dir, load_matrix
from imgfab.matrix.payloads import PAYLOADS_FILE, PayloadCheck, load_payload_checks
from imgfab.matrix.refresh import _scalar, write_atomically
from imgfab.recipe import parse_recipe

# The stack each release is locked for: a data-center Hopper GPU every vLLM release in the
# matrix serves, so the payload includes the JIT toolchain wheels the releases that sample with
# FlashInfer bring (compat/backends.yaml). Other GPUs change `serves` and the cubin cuts, not
# which distributions are resolved.
PROBE_GPU = "H100-SXM"
CHECKED_BACKENDS = ("vllm",)

_HEADER = """\
# Whether each backend release's payload installs cleanly: `imgfab compat refresh --payloads`
# locked it as `imgfab lock` would (uv under the release's era bound with compat/payload.yaml's
# constraints, every wheel's RECORD read, the lock's checks) for a one-GPU H100-SXM stack on the
# newest driver the matrix knows, and wrote one row per release and image Python. The resolver
# rejects a release whose row says `installs: false` (constraint `payload`), naming `reason`.
# `fingerprint` is the lock inputs' (imgfab.payload.lockfile.PayloadRequest.fingerprint): a row
# whose inputs moved is checked again. Generated; do not edit by hand.
checks:
"""
_FIELDS = ("backend", "version", "python", "cuda_major", "installs", "reason", "packages",
           "constraints", "fingerprint", "checked", "source", "confirmed")


@dataclass(frozen=True)
class Outcome:
    """One release's verdict, or why it was not checked (``skipped``)."""

    version: str
    check: PayloadCheck | None
    skipped: str = ""
    kept: bool = False  # an unchanged row carried over


def probe_recipe(backend: str, version: str, driver: str) -> Any:
    """The recipe each release is locked for (see :data:`PROBE_GPU`)."""
    return parse_recipe({
        "name": f"payload-check-{backend}-{version}".replace(".", "-"),
        "model": {"id": "Qwen/Qwen2-7B-Instruct", "revision": "f2826a00ceef68f0f2b946d945ecc0477ce4450c",
                  "mount_path": "/models/m"},
        "target": {"gpu": PROBE_GPU, "count": 1, "driver": f">={driver}"},
        "backend": {"name": backend, "version": f"=={version}"},
        "engine": {"dtype": "bfloat16", "max_seq_len": 4096},
        "serve": {"max_model_len": 4096},
        "image": {"repository": "payload-check/probe"},
    }, source="payload check")


def newest_driver(matrix: Matrix) -> str:
    """The newest driver any CUDA toolkit of the matrix needs: every release's strict floor."""
    from imgfab.in_image.rules import parse_version

    return max((t.min_driver for t in matrix.toolkits.values() if t.min_driver), key=parse_version)


def check_release(matrix: Matrix, backend: str, version: str, *, compat_dir: Path, uv: str,
                  previous: dict[tuple[str, str, str], PayloadCheck], today: str,
                  progress: Any = None) -> Outcome:
    """Lock ``backend`` ``version`` for the probe stack and say whether it installs cleanly.

    Network failures raise (an environment failure, never recorded as a verdict)."""
    from imgfab.payload.checks import check_packages
    from imgfab.payload.lock import _uv_version, inspect_packages, payload_request, resolve_packages
    from imgfab.stack.resolve import resolve

    recipe = probe_recipe(backend, version, newest_driver(matrix))
    try:
        stack = resolve(recipe, matrix, advisories=False).stack
    except CompatibilityError as error:
        return Outcome(version, None, skipped=f"no {PROBE_GPU} stack: {error.message}")
    request = payload_request(recipe, stack, compat_dir)
    if not request.exclude_newer:
        return Outcome(version, None, skipped="no uploaded: time in the matrix (no era bound)")
    fingerprint = request.fingerprint()
    old = previous.get((backend, version, request.python))
    if old is not None and old.fingerprint == fingerprint:
        return Outcome(version, old, kept=True)
    if progress is not None:
        progress.step(f"{backend} {version}: resolving {' '.join(request.pins)} with uv")
    reason, count = "", 0
    try:
        packages = resolve_packages(request, uv=uv)
        count = len(packages)
        inspect_packages(packages, serves=request.serves, progress=progress)
        check_packages(packages, request, stack.cuda, None)
    except CompatibilityError as error:
        reason = error.message
    source = (f"imgfab compat refresh --payloads: uv {_uv_version(uv)} pip compile of "
              f"{' '.join(request.pins)} for Python {request.python} {request.platform}, "
              f"exclude-newer {request.exclude_newer}, constraints "
              f"{' '.join(request.constraints) or 'none'}, from {request.default_index}; "
              f"every wheel's RECORD read and the lock's checks run ({today})")
    return Outcome(version, PayloadCheck(
        backend=backend, version=version, python=request.python, cuda_major=request.cuda_major,
        installs=not reason, reason=reason, packages=count, constraints=request.constraints,
        fingerprint=fingerprint, checked=today, source=source, confirmed=True))


def render_checks(checks: list[PayloadCheck]) -> str:
    """compat/payloads.yaml's text: rows sorted by backend, release and Python."""
    from packaging.version import Version

    lines = [_HEADER.rstrip("\n")]
    for check in sorted(checks, key=lambda c: (c.backend, Version(c.version), c.python)):
        row = {name: getattr(check, name) for name in _FIELDS}
        for index, name in enumerate(_FIELDS):
            if name == "reason" and not row[name]:
                continue
            value = row[name]
            text = str(value) if isinstance(value, int) and not isinstance(value, bool) else _scalar(value)
            lines.append(f"  {'- ' if index == 0 else '  '}{name}: {text}")
    return "\n".join(lines) + "\n"


def refresh_payloads(compat_dir: Path | None = None, *, versions: tuple[str, ...] = (),
                     uv: str | None = None, progress: Any = None,
                     today: Callable[[], str] = lambda: date.today().isoformat()) -> list[str]:
    """Check the releases (``versions``, default every vLLM release of the matrix), rewrite
    ``compat/payloads.yaml`` once all are done, and return one line per release checked."""
    from imgfab.payload.lock import uv_binary

    directory = Path(compat_dir or default_compat_dir())
    matrix = load_matrix(directory)
    existing = load_payload_checks(directory)
    previous = {(c.backend, c.version, c.python): c for c in existing}
    uv = uv or uv_binary()
    stamp = today()
    lines: list[str] = []
    kept = dict(previous)
    # Each release is resolved as if nothing were recorded: a release a row rejects is checked again.
    unrecorded = replace(matrix, payload_checks=[])
    for backend in CHECKED_BACKENDS:
        releases = [r.version for r in matrix.backend_releases(backend)]
        for version in (v for v in releases if not versions or v in versions):
            outcome = check_release(unrecorded, backend, version, compat_dir=directory, uv=uv,
                                    previous=previous, today=stamp, progress=progress)
            if outcome.check is None:
                lines.append(f"{backend} {version}: not checked: {outcome.skipped}")
                continue
            check = outcome.check
            kept[(check.backend, check.version, check.python)] = check
            verdict = (f"installs ({check.packages} distributions)" if check.installs
                       else f"does not install cleanly: {check.reason}")
            lines.append(f"{check.label()}: {verdict}{' (unchanged)' if outcome.kept else ''}")
    write_atomically(directory / PAYLOADS_FILE, render_checks(list(kept.values())))
    return lines
