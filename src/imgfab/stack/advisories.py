"""Known advisories on a resolved stack: which published advisory (compat/advisories.yaml) holds
the picked backend or torch release, and the nearest recipe change that gives a fixed one.

:func:`advisory_notes` is pure like the resolver: it re-resolves the recipe with one change at a
time (drop the version pin, another ``target.driver_policy``, a newer ``target.driver``) through
the ``resolve_quietly`` callable it is given, and names the first change whose stack is outside
the advisory. Example note (an H100 fleet on R560 under strict picks vLLM 0.10.1.1):

    vllm 0.10.1.1 is inside GHSA-2pc9-4j83-qjmr (CVE-2026-22807; high 8.8): code execution ...;
    affected >=0.10.1,<0.14.0, fixed in 0.14.0; target.driver_policy: minor-compat gives vllm 0.19.1

A critical advisory is a decision, not a default (issue 34): :func:`refused_hits` are the critical
ones the recipe does not name in ``backend.accept_advisories``, which the resolver refuses (and
so prefers an older release outside them), and :func:`refusal_fix` names the nearest change out.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from imgfab.errors import CompatibilityError
from imgfab.in_image.rules import FORWARD_COMPAT, MINOR_COMPAT, STRICT
from imgfab.matrix.compat import Matrix
from imgfab.recipe import Recipe

# A driver newer than any release needs: "raise the driver" is tried as the last change.
_ANY_DRIVER = "9999.0"


def _variants(recipe: Recipe) -> Iterator[tuple[str, Recipe, str | None]]:
    """(what changes, the changed recipe, host driver or None), nearest change first. A text
    with ``{floor}`` is completed with the driver floor of the stack the change resolves to."""
    policy = recipe.target.driver_policy
    others = [p for p in (MINOR_COMPAT, FORWARD_COMPAT, STRICT) if p != policy]
    pinned = recipe.backend.version is not None
    unpinned = recipe.model_copy(update={"backend": recipe.backend.model_copy(update={"version": None})})
    if pinned:
        yield f"dropping backend.version {recipe.backend.version!r}", unpinned, None
    for base, prefix in ((recipe, ""),) + (((unpinned, "dropping backend.version and "),) if pinned else ()):
        for other in others:
            changed = base.model_copy(update={"target": base.target.model_copy(update={"driver_policy": other})})
            yield f"{prefix}target.driver_policy: {other}", changed, None
        yield prefix + "target.driver ≥ {floor}", base, _ANY_DRIVER


def picked_hits(matrix: Matrix, stack: Any, *, severity: str | None = None) -> list[tuple[str, str, Any]]:
    """(package, version, advisory) for each advisory holding ``stack``'s backend or torch
    release; only those of ``severity`` when given."""
    picked = [(stack.backend, stack.backend_version)] + ([("torch", stack.torch)] if stack.torch else [])
    return [(package, version, advisory) for package, version in picked
            for advisory in matrix.advisories_for(package, version)
            if severity is None or advisory.severity == severity]


def refused_hits(matrix: Matrix, stack: Any, accepted: tuple[str, ...]) -> list[tuple[str, str, Any]]:
    """(package, version, advisory) for each critical advisory holding ``stack``'s backend or
    torch release that ``accepted`` (the recipe's ``backend.accept_advisories``) does not name."""
    return [hit for hit in picked_hits(matrix, stack, severity="critical") if not hit[2].named_in(accepted)]


def unknown_acceptances(matrix: Matrix, accepted: tuple[str, ...]) -> list[str]:
    """The ids of ``accepted`` that name no advisory of compat/advisories.yaml (a typo would
    otherwise accept nothing, silently)."""
    return [name for name in accepted if not any(a.named_in((name,)) for a in matrix.advisories)]


# What forward compatibility costs, said where it is the way out of a critical advisory.
_FORWARD_COMPAT_NOTE = ("; forward compatibility runs the newer CUDA on the fleet's driver "
                        "through the image's cuda-compat package, on data-center GPUs only")


def refusal_fix(recipe: Recipe, matrix: Matrix,
                resolve_quietly: Callable[[Recipe, str | None], Any],
                refused: tuple[str, ...] = ()) -> str:
    """For a stack refused for its critical advisories (``refused``: their ids): the nearest
    recipe change (the same ones as the notes: the version pin, the driver policy, a newer
    driver) whose stack has no critical advisory on its backend or torch, or else how to
    accept the risk by name."""
    for text, changed, driver in _variants(recipe):
        try:
            found = resolve_quietly(changed, driver)
        except CompatibilityError:
            continue
        if found is None or picked_hits(matrix, found, severity="critical"):
            continue
        if driver is not None:
            text = text.format(floor=found.driver_floor)
        return (f"{text} gives {found.backend} {found.backend_version}"
                + (f" with torch {found.torch}" if found.torch else "") + ", outside every critical advisory"
                + (_FORWARD_COMPAT_NOTE if f"driver_policy: {FORWARD_COMPAT}" in text else ""))
    names = ", ".join(refused) or "CVE-…"
    return ("no single recipe change gives a stack outside the critical advisories on this GPU; "
            f"backend.accept_advisories: [{names}] accepts the risk, named")


def stack_advisories(matrix: Matrix, stack: Any) -> list[str]:
    """The notes of ``stack`` that name an advisory holding its backend or torch release (what
    ``init`` and ``validate`` print), in the stack's order."""
    heads = tuple(f"{package} {version} is inside {advisory.label()}:"
                  for package, version, advisory in picked_hits(matrix, stack))
    return [note for note in stack.notes if heads and note.startswith(heads)]


def locked_hits(matrix: Matrix, pins: dict[str, str]) -> list[tuple[str, str, Any]]:
    """(package, version, advisory) for each locked pin (name → version) inside an advisory, in
    the order of the pins' names."""
    return [(name, pins[name], advisory) for name in sorted(pins)
            for advisory in matrix.advisories_for(name, pins[name])]


def lock_findings(matrix: Matrix, packages: dict[str, str], *, accepted: tuple[str, ...]
                  ) -> tuple[list[str], list[str]]:
    """(notes, blocking) for a lock's whole locked set (name → version): one note per advisory
    holding a pin; the critical ones that ``accepted`` (``backend.accept_advisories``) does
    not name block."""
    notes, blocking = [], []
    for name, version, advisory in locked_hits(matrix, packages):
        taken = advisory.named_in(accepted)
        notes.append(f"{name} {version} (locked) is inside {advisory.label()}: {advisory.summary}; "
                     f"affected {advisory.affected}, fixed in {advisory.fixed}"
                     + ("" if advisory.confirmed else " (advisory range unconfirmed)")
                     + ("; accepted by backend.accept_advisories" if taken else ""))
        if advisory.severity == "critical" and not taken:
            blocking.append(f"{name} {version} ({advisory.id}, fixed in {advisory.fixed})")
    return notes, blocking


def advisory_notes(recipe: Recipe, matrix: Matrix, stack: Any,
                   resolve_quietly: Callable[[Recipe, str | None], Any]
                   ) -> tuple[list[str], list[str]]:
    """(notes, unconfirmed) for every advisory holding ``stack``'s backend or torch release.

    ``resolve_quietly(recipe, driver)`` returns the stack ``recipe`` resolves to (on a host with
    ``driver`` when given), without advisory notes, or None when nothing fits."""
    hits = picked_hits(matrix, stack)
    if not hits:
        return [], []
    tried: list[tuple[str, Any]] = []
    variants = _variants(recipe)

    def alternatives() -> Iterator[tuple[str, Any]]:
        yield from tried
        for text, changed, driver in variants:
            try:
                found = resolve_quietly(changed, driver)
            except CompatibilityError:
                found = None
            if found is None:
                continue
            if driver is not None:
                text = text.format(floor=found.driver_floor)
            tried.append((text, found))
            yield text, found

    notes, unconfirmed = [], []
    for package, version, advisory in hits:
        fix = next(((text, found) for text, found in alternatives()
                    if not advisory.affects(package, _version_of(found, package))), None)
        tail = (f"{fix[0]} gives {package} {_version_of(fix[1], package)}" if fix else
                f"no single recipe change gives a fixed release on {stack.gpu}")
        notes.append(f"{package} {version} is inside {advisory.label()}: {advisory.summary}; affected "
                     f"{advisory.affected}, fixed in {advisory.fixed}; {tail}"
                     + ("" if advisory.confirmed else " (advisory range unconfirmed)")
                     + ("; accepted by backend.accept_advisories"
                        if advisory.named_in(recipe.backend.accept_advisories) else ""))
        if not advisory.confirmed:
            unconfirmed.append(f"advisory {advisory.id}: {advisory.note}")
    return notes, unconfirmed


def _version_of(stack: Any, package: str) -> str:
    return stack.torch if package == "torch" else stack.backend_version
