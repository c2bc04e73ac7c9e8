"""Pick the right published image for a host: `imgfab select`.

:func:`choose` is pure: published images (tag, digest, labels) × a host (driver, GPU) → the
newest image whose platform (linux/amd64 on an x86_64 host), driver floor, GPU architecture
and precision fit, plus a verdict for every other image. It applies the same
:mod:`imgfab.in_image.rules` the resolver and the in-image probe use.
"Newest" is the highest backend version, then the highest CUDA version, then the tag name:
the registry API gives no reliable push time.
"""

from __future__ import annotations

import platform as _platform
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from imgfab.errors import MatrixError, RecipeError
from imgfab.in_image.facts import HostFacts
from imgfab.in_image.rules import Verdict, parse_version
from imgfab.matrix.compat import Matrix
from imgfab.matrix.gpus import memory_gib
from imgfab.stack.verdicts import (IMAGE_PLATFORM, P, driver_verdict, gpu_verdicts, image_platform,
                                   is_imgfab_image, label_problem, platform_of_machine,
                                   platform_verdict)

__all__ = ["HostGpu", "Published", "Candidate", "choose", "choose_verified", "evaluate", "host_gpu",
           "what_host_needs",
           "driver_verdict", "gpu_verdicts", "is_imgfab_image", "label_problem"]


# A verdict line quotes labels a registry supplied: no terminal escapes, and a bounded length.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
REASON_MAX = 500


def _printable(text: str, limit: int) -> str:
    clean = " ".join(_CONTROL.sub(" ", text).split())
    return clean if len(clean) <= limit else clean[:limit] + "…"


@dataclass(frozen=True)
class HostGpu:
    """The host as select sees it: driver version, one GPU model's compute capability, and the
    platform an image must be built for (``linux/amd64``, ``linux/arm64``)."""

    driver: str
    gpu: str
    compute_capability: str
    platform: str
    seen: str = ""  # what the host reported, when the GPU or driver was read from it
    platform_seen: str = ""  # where the platform came from: the GPU's row, or this machine


def host_gpu(matrix: Matrix, read_host: Callable[[], HostFacts], *, driver: str | None = None,
             gpu: str | None = None, machine: Callable[[], str] = _platform.machine) -> HostGpu:
    """``--driver``/``--gpu``, or this host's (``read_host``: NVML or nvidia-smi) for each one
    omitted: its driver, and its first GPU resolved through ``compat/gpus.yaml`` by the name
    and memory it reports (:meth:`Matrix.host_gpu`).

    The platform: with ``gpu``, the CPU that GPU's hosts have (its row's ``cpu_arch``: GH200
    and GB200 are aarch64 Grace superchips, so ``linux/arm64``); without, this machine's
    (``machine``, :func:`platform.machine`).

    Raises RecipeError (exit 2) when the host cannot be read or its GPU is not in the matrix,
    and MatrixError (exit 1) when the matrix gives that GPU another compute capability than the
    host reports.
    """
    seen = ""
    reported = None
    if driver is None or gpu is None:
        facts = read_host()
        if facts.error or not facts.gpus:
            raise RecipeError(f"cannot read this host's GPU ({facts.error or 'no GPU visible'})",
                              field="--driver/--gpu", fix="pass --driver and --gpu explicitly")
        reported = facts.gpus[0]
        size = f", {memory_gib(reported.memory_bytes):.1f} GiB" if reported.memory_bytes else ""
        seen = f"{facts.via}: GPU{reported.index} {reported.name}{size}, driver {facts.driver}"
        driver = driver or facts.driver
        if not driver:
            raise RecipeError(f"this host reports no driver version ({facts.via})",
                              field="--driver", fix="pass --driver")
        try:
            parse_version(driver)
        except ValueError:
            raise RecipeError(f"this host reports driver {driver!r}, not a version ({facts.via})",
                              field="--driver", fix="pass --driver") from None
    if gpu is None:
        assert reported is not None
        found = matrix.host_gpu(reported.name, reported.memory_bytes, field="--gpu")
        if reported.compute_capability and reported.compute_capability != found.compute_capability:
            raise MatrixError(f"compat/gpus.yaml gives {found.name} compute capability "
                              f"{found.compute_capability}, but this host's {reported.name} reports "
                              f"{reported.compute_capability}", field="compat/gpus.yaml",
                              fix="correct the record (or pass --gpu to override)")
        cpu = machine()
        where = f"this machine is {cpu}"
    else:
        found = matrix.host_gpu(gpu, field="--gpu")
        cpu = found.cpu_arch
        where = f"{found.name} hosts are {cpu}, compat/gpus.yaml cpu_arch"
    return HostGpu(driver=driver, gpu=found.name, compute_capability=found.compute_capability,
                   platform=platform_of_machine(cpu), seen=seen, platform_seen=where)


@dataclass(frozen=True)
class Published:
    """One published image: its tag, manifest digest and config labels."""

    repository: str  # host/repo
    tag: str
    digest: str
    labels: dict[str, str]
    # Why the registry could not describe this image (its manifest or config), if it could not.
    error: str | None = None
    # The image config's os/architecture ('' when it has none): the platform of an image built
    # before the org.imgfab.platform label.
    config_platform: str = ""

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"


@dataclass
class Candidate:
    image: Published
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return bool(self.verdicts) and all(v.ok for v in self.verdicts)

    @property
    def labels(self) -> dict[str, Any]:
        """The image's config labels ({} when the registry gave something else)."""
        return self.image.labels if isinstance(self.image.labels, dict) else {}

    def reason(self) -> str:
        """Why it was rejected (or ``fits``): one line, control characters dropped, at most
        :data:`REASON_MAX` characters, whatever the labels hold."""
        failed = [v.line() for v in self.verdicts if not v.ok]
        return _printable("; ".join(failed), REASON_MAX) if failed else "fits"

    def rejection(self) -> dict[str, str]:
        """The first rule it failed as resolve's rejections name one: ``constraint`` (the
        check: driver, gpu, arch, label, ...) and ``fix``; both empty when it fits."""
        failed = next((v for v in self.verdicts if not v.ok), None)
        if failed is None:
            return {"constraint": "", "fix": ""} if self.verdicts else \
                {"constraint": "image", "fix": "publish images with imgfab's labels"}
        return {"constraint": _printable(failed.check, 60), "fix": _printable(failed.fix, REASON_MAX)}

    @property
    def pull_requires(self) -> str:
        """What the pulling host needs for the image's layers (org.imgfab.pull.requires, e.g.
        ``docker>=23.0|containerd>=1.5`` for zstd); '' when any engine pulls them."""
        return _printable(str(self.labels.get(f"{P}.pull.requires", "")), 80)

    def pull_note(self) -> str:
        """One line on what pulling the image needs ('' when nothing)."""
        if not self.pull_requires:
            return ""
        compression = _printable(str(self.labels.get(f"{P}.layers.compression", "")), 16) or "its"
        needs = " or ".join(self.pull_requires.split("|"))
        return f"{self.tag}: {compression} layers: the pulling host needs {needs}"

    @property
    def toolchain(self) -> str:
        """The C compiler the image's runtime carries as its declared fallback
        (org.imgfab.toolchain, comma-separated packages: Triton builds its launcher stubs with it
        at a first start, issue 33); '' when the builder compiled them (or the label is absent)."""
        return _printable(str(self.labels.get(f"{P}.toolchain", "")), 80)

    def toolchain_note(self) -> str:
        """One line on the run-time compiler the image carries ('' when none)."""
        if not self.toolchain:
            return ""
        return (f"{self.tag}: the runtime carries a C compiler ({', '.join(self.toolchain.split(','))}) "
                "as its declared fallback: Triton compiles its launchers at each first start "
                "(compat/triton_launchers.yaml has no confirmed row for this stack)")

    @property
    def tag(self) -> str:
        """The image's tag as printed: the registry chose it, so it is made printable."""
        return _printable(self.image.tag, 130)

    @property
    def platform(self) -> str:
        """The platform it was judged by (:func:`image_platform`), made printable; '' when
        unknown."""
        return _printable(image_platform(self.labels, self.image.config_platform), 60)


def _version_key(text: str) -> tuple[int, ...]:
    try:
        return parse_version(text)
    except (ValueError, TypeError, AttributeError):
        return ()


def evaluate(image: Published, host: HostGpu) -> Candidate:
    """Every rule an image must pass on this host, as verdicts (none raises)."""
    candidate = Candidate(image)
    if image.error is not None:
        candidate.verdicts.append(Verdict(False, "registry", image.error))
        return candidate
    problem = label_problem(image.labels)
    if problem is not None:
        candidate.verdicts.append(Verdict(False, "labels", problem))
        return candidate
    if not is_imgfab_image(image.labels):
        candidate.verdicts.append(Verdict(False, "labels", "not an imgfab image (no driver floor label)"))
        return candidate
    # The platform first: an image of another CPU architecture dies with `exec format error`
    # whatever its GPU rules say (the rest is still judged, and listed).
    candidate.verdicts.append(platform_verdict(image_platform(image.labels, image.config_platform),
                                               host.platform, host.platform_seen))
    try:
        verdicts = [driver_verdict(image.labels, host.driver),
                    *gpu_verdicts(image.labels, host.gpu, host.compute_capability, driver=host.driver)]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # one image's bad label
        verdicts = [Verdict(False, "labels", f"unreadable org.imgfab labels: {str(exc)[:120]}")]
    candidate.verdicts += verdicts
    return candidate


def choose(images: list[Published], host: HostGpu, *, model: str | None = None,
           backend: str | None = None) -> tuple[Candidate | None, list[Candidate]]:
    """(the newest fitting image or None, every candidate evaluated, newest first).

    ``model`` filters on the recipe name or model id label; ``backend`` on the backend label.
    """
    def wanted(image: Published) -> bool:
        if image.error is not None or label_problem(image.labels) is not None:
            return model is None and backend is None  # judged (and rejected) unless filtered
        name = image.labels.get(f"{P}.recipe.name", "")
        if model is not None and not (name.startswith(model) or image.labels.get(f"{P}.model.id") == model):
            return False
        return backend is None or image.labels.get(f"{P}.backend") == backend

    selected = [image for image in images if wanted(image)]
    candidates = [evaluate(image, host) for image in selected]
    def newest(c: Candidate) -> tuple[Any, ...]:
        return (_version_key(c.labels.get(f"{P}.backend.version", "")),
                _version_key(c.labels.get(f"{P}.cuda", "")), c.image.tag)

    candidates.sort(key=newest, reverse=True)
    best = next((c for c in candidates if c.fits), None)
    return best, candidates


def choose_verified(images: list[Published], host: HostGpu,
                    verify: Callable[[Published], list[str]], *, model: str | None = None,
                    backend: str | None = None) -> tuple[Candidate | None, list[Candidate]]:
    """:func:`choose`, then the trust check: the fitting candidates, newest first, are
    verified with ``verify`` (problems, empty when its signature and attestations verify)
    until one passes; each one that fails is a rejected candidate with the problems as its
    reason. Candidates that do not fit are not verified (they are rejected already)."""
    _, candidates = choose(images, host, model=model, backend=backend)
    for candidate in candidates:
        if not candidate.fits:
            continue
        problems = verify(candidate.image)
        if problems:
            candidate.verdicts.append(Verdict(False, "signature", "; ".join(problems),
                                              fix="push a signed, attested image under this tag"))
            continue
        candidate.verdicts.append(Verdict(True, "signature", "signature and attestations verify"))
        return candidate, candidates
    return None, candidates


def what_host_needs(candidates: list[Candidate], host: HostGpu) -> str:
    """The smallest host change that would make some image fit (e.g. 'driver ≥ 570.124.06')."""
    floors = []
    for candidate in candidates:
        failed = {v.check for v in candidate.verdicts if not v.ok}
        if failed == {"driver"}:
            floors.append(candidate.image.labels[f"{P}.driver.floor"])
    if floors:
        lowest = min(floors, key=_version_key)
        return f"driver ≥ {lowest}"
    if candidates and all("platform" in {v.check for v in c.verdicts if not v.ok} for c in candidates):
        return (f"an image built for {host.platform}, which imgfab does not build (it builds "
                f"{IMAGE_PLATFORM} only): run on a host whose CPU is x86_64")
    if any({v.check for v in c.verdicts if not v.ok} == {"signature"} for c in candidates):
        return "an image that fits and whose signature and attestations verify with the trusted key"
    if candidates:
        return f"an image built for {host.gpu} (compute capability {host.compute_capability})"
    return "an image published for this model/backend"



def advisory_lines(matrix: Matrix, best: Candidate, candidates: list[Candidate]) -> list[str]:
    """One line per advisory (compat/advisories.yaml) holding the chosen image's backend or
    torch release, naming the newest other fitting image outside it, if any.

    E.g. "vllm 0.10.1.1 is inside GHSA-2pc9-4j83-qjmr (...), fixed in 0.14.0; fitting image
    outside it: vllm0.19.1-cu12.8.2-sm90-fp8-… (vllm 0.19.1)". An advisory the image's
    ``org.imgfab.advisories.accepted`` label names is said to be accepted by its recipe."""
    def picked(c: Candidate) -> list[tuple[str, str]]:
        found = [(c.labels.get(f"{P}.backend", ""), c.labels.get(f"{P}.backend.version", "")),
                 ("torch", c.labels.get(f"{P}.torch", ""))]
        return [(name, version) for name, version in found if name and _version_key(version)]

    def inside(c: Candidate, advisory: Any, package: str) -> bool:
        return any(name == package and advisory.affects(name, version) for name, version in picked(c))

    accepted = tuple(filter(None, best.labels.get(f"{P}.advisories.accepted", "").split(",")))
    lines = []
    for package, version in picked(best):
        for advisory in matrix.advisories_for(package, version):
            other = next((c for c in candidates if c.fits and c is not best
                          and any(n == package for n, _ in picked(c)) and not inside(c, advisory, package)),
                         None)
            where = (f"fitting image outside it: {other.tag} ({package} "
                     f"{dict(picked(other))[package]})" if other else
                     "no other image that fits this host is outside it")
            # said before the summary: a long line is cut at REASON_MAX, never the acceptance
            taken = " (accepted by its recipe: backend.accept_advisories)" if advisory.named_in(accepted) else ""
            lines.append(_printable(f"{package} {version} is inside {advisory.label()}{taken}: {advisory.summary}; "
                                    f"affected {advisory.affected}, fixed in {advisory.fixed}; {where}"
                                    + ("" if advisory.confirmed else " (advisory range unconfirmed)"),
                                    REASON_MAX))
    return lines
