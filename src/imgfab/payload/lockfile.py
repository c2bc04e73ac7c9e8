"""The lock file: what decides a payload (PayloadRequest, its fingerprint), the locked packages,
the layer plan, and the text of recipes/<name>.lock (format_lock writes it, Lock reads it).

Pure: no network, no uv; imgfab.payload.lock resolves and writes, imgfab.payload.checks judges.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path


from imgfab.errors import RecipeError
from imgfab.in_image import stage
from imgfab.payload.lockparse import ParsedLock, parse_lock, read_lock_text, requirements_text


# 2: bytecode counted; 3: cubins for other GPUs cut; 4: reviewed collisions cut;
# 5: the fingerprint covers the whole file (lock_fingerprint), not only the inputs;
# 6: resolved under the backend release's date bound (uv --exclude-newer, imgfab.payload.era)
LOCK_FORMAT = 6


LAYER_LIMIT = 2_000_000_000  # bytes uncompressed per payload layer (the 2 GB)


# Layers are planned from RECORD sizes (plus a bytecode estimate), which miss what the build
# adds; 5 % headroom keeps the measured layer under LAYER_LIMIT.
PLAN_LIMIT = LAYER_LIMIT * 95 // 100


_DEFAULT_INDEX = "https://pypi.org/simple"


# Content groups, least often changed first: (group, names it takes). First match wins;
# what matches none is "rest". Each group is split into ≤ LAYER_LIMIT layers.
GROUPS: tuple[tuple[str, str], ...] = (
    # The CUDA compiler and headers (the cuda-toolkit[cccl,crt,nvcc,nvvm] wheels a JIT toolchain
    # locks): a group of their own, which the runtime leaves out when the builder compiled the
    # kernels they were locked for (compat/backends.yaml aot_specs): the runtime carries no nvcc.
    ("toolkit", r"^nvidia-(cuda-nvcc|nvvm|cuda-crt|cuda-cccl)$"),
    ("cuda", r"^nvidia-"),
    ("torch", r"^(torch|torchaudio|torchvision)$"),
    ("compilers", r"^(triton|llvmlite|numba|cuda-bindings|cuda-pathfinder|cuda-python|ninja|xgrammar)$"),
    ("rest", r""),
    # What moves with a vLLM release although vLLM does not pin it exactly: 0.19.0 -> 0.19.1
    # also moved transformers 4.57.6 -> 5.24.0, huggingface-hub, tokenizers and
    # compressed-tensors (bench/README.md). Kept out of "rest" so that a patch bump re-sends
    # this small layer, not the 0.25 GB (compressed) of everything else.
    ("models", r"^(transformers|tokenizers|huggingface-hub|hf-xet|safetensors|compressed-tensors"
               r"|mistral-common|gguf|sentencepiece|tiktoken)$"),
    ("vllm", r"^(vllm|flashinfer-.*|xformers|tensorrt-llm)$"),
)


_CUDA_WHEEL = re.compile(r"^nvidia-.*-cu(\d+)$")


@dataclass(frozen=True)
class IndexPin:
    url: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class PayloadRequest:
    """What decides a payload: the top-level pins, the target interpreter and the indexes."""

    recipe: str
    stack_line: str
    pins: tuple[str, ...]
    python: str
    platform: str
    cuda_major: str
    indexes: tuple[IndexPin, ...]
    default_index: str
    installer: str = ""  # "uv==X --hash=... --hash=..." the builder installs the lock with
    collisions_allowed: tuple[tuple[str, tuple[str, ...]], ...] = ()
    serves: tuple[str, ...] = ()  # compute capabilities whose cubins stay (the recipe's GPU)
    gpu: str = ""  # the recipe's GPU, for the header
    # reviewed nvidia-*-cuNN wheels of another CUDA major that this stack's payload may hold
    # (compat/payload.yaml cuda_major_exceptions, for this backend and CUDA major)
    other_majors_allowed: tuple[str, ...] = ()
    # uv --exclude-newer: the backend release's upload time + the grace (imgfab.payload.era),
    # and the header's account of it ("2026-05-02T05:50:15Z (vllm 0.19.1 uploaded ...)")
    exclude_newer: str = ""
    era: str = ""
    # uv constraints (-c) bounding families the backend's tree leaves open to the stack's CUDA
    # major (compat/payload.yaml constraints): cuda-python>=13.0.0,<14 ...
    constraints: tuple[str, ...] = ()
    # every compat/payload.yaml constraints row: (CUDA major, family names, requirements), so a
    # refusal can name the bound that answers a conflict (not part of the fingerprint)
    families: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = ()

    def fingerprint(self) -> str:
        data = {"format": LOCK_FORMAT, "pins": self.pins, "python": self.python,
                "exclude_newer": self.exclude_newer,
                "platform": self.platform, "cuda_major": self.cuda_major,
                "indexes": [[i.url, list(i.names)] for i in self.indexes],
                "default_index": self.default_index, "installer": self.installer, "plan_limit": PLAN_LIMIT,
                "collisions_allowed": self.collisions_allowed, "layer_limit": LAYER_LIMIT,
                "groups": GROUPS, "serves": self.serves}
        if self.other_majors_allowed:  # absent for stacks no exception concerns (their locks keep their fingerprint)
            data["other_majors_allowed"] = self.other_majors_allowed
        if self.constraints:  # likewise: a stack no constraint concerns keeps its fingerprint
            data["constraints"] = self.constraints
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:32]

    def index_of(self, name: str) -> str:
        for pin in self.indexes:
            if stage.normalize(name) in pin.names:
                return pin.url
        return self.default_index


@dataclass
class LockedPackage:
    name: str
    version: str
    hashes: list[str]
    urls: list[str]
    installed: int = 0  # bytes, from the RECORD (after cuts), plus the bytecode estimate
    files: dict[str, str] = field(default_factory=dict)  # RECORD path → hash
    cuts: dict[str, int] = field(default_factory=dict)  # cut kind → bytes
    cut_archs: set[str] = field(default_factory=set)  # "sm100f": architectures of its cubins cut
    requires: list[str] = field(default_factory=list)  # torch and the backend: Requires-Dist lines


def lock_fingerprint(request: PayloadRequest, text: str) -> str:
    """The ``# fingerprint:`` of a lock: the inputs (:meth:`PayloadRequest.fingerprint`) and
    every other line of ``text``, header and pins, so an edited line makes the lock stale.

    Everything in it is public: offline this detects an edit, not a forger who recomputes it
    (``imgfab lock --check --online`` compares the pinned hashes with the index's)."""
    lines = text.split("\n")
    for number, line in enumerate(lines):
        if line.startswith("# fingerprint: "):
            del lines[number]
            break
    covered = "\n".join([request.fingerprint(), *lines])
    return hashlib.sha256(covered.encode()).hexdigest()[:32]


@dataclass
class Lock:
    """A parsed lock: header fields and ``{name: (version, hashes)}``.

    ``installer`` and ``index`` are what the header records; the builder never reads them.
    What it installs with comes from ``request`` (compat/payload.yaml and the recipe), bound
    by :meth:`bind` once the lock was checked against it: see :meth:`requirements`."""

    fingerprint: str
    packages: dict[str, tuple[str, list[str]]]
    unhashed: list[str]
    refused: str
    text: str
    installer: str = ""
    index: str = ""  # the first index the header names
    cubins_cut: tuple[str, ...] = ()  # "sm100f" ...: architectures whose cubins the stage cuts
    parsed: ParsedLock = field(default_factory=ParsedLock)
    request: PayloadRequest | None = None  # bound: what the builder installs with

    def serving_archs(self, archs: tuple[str, ...]) -> tuple[str, ...]:
        """``archs`` (an image's kernel architectures) without those a cut cubin was built
        for: once its kernels are gone, the image no longer serves such a GPU fully."""
        cut = [stage.arch_label(a) for a in self.cubins_cut]
        return tuple(a for a in archs if not any(stage.runs_on(sm, suffix, a) for sm, suffix in cut))

    def layers(self) -> list[str]:
        """The payload layer groups, in the order the runtime copies them (venv first)."""
        return [stage.BASE_GROUP] + [layer.group for layer in self.parsed.layers]

    def bind(self, request: PayloadRequest) -> Lock:
        """This lock, to be installed with ``request``'s installer, index and served GPUs."""
        return replace(self, request=request)

    def _bound(self) -> PayloadRequest:
        if self.request is None:
            raise RecipeError("the lock was not checked against compat/payload.yaml and the recipe",
                              field="lock", fix="load it with imgfab.payload.lock.load_for_build or committed_lock")
        return self.request

    def requirements(self) -> str:
        """The builder's requirements.lock: the pins and hashes, re-written by imgfab."""
        request = self._bound()
        return requirements_text(self.parsed, recipe=request.recipe, fingerprint=self.fingerprint,
                                 serves=request.serves,
                                 collisions_allowed=tuple(path for path, _ in request.collisions_allowed))

    def builder_installer(self) -> str:
        """The installer line the builder pip-installs (compat/payload.yaml's, not the header's)."""
        return self._bound().installer

    def builder_index(self) -> str:
        """The index the builder installs from unless --pip-index-url says otherwise."""
        request = self._bound()
        return request.indexes[0].url if request.indexes else request.default_index

    @classmethod
    def read(cls, path: Path) -> Lock:
        """The lock file at ``path``, read within its bounds
        (:func:`imgfab.payload.lockparse.read_lock_text`) and parsed strictly."""
        return cls.parse(read_lock_text(path), path.name)

    @classmethod
    def parse(cls, text: str, source: str = "lock") -> Lock:
        """Parse strictly (:func:`imgfab.payload.lockparse.parse_lock`); RecipeError names
        ``source``, the line and the fix."""
        parsed = parse_lock(text, source)
        packages = {e.name: (e.version, list(e.hashes)) for e in parsed.entries}
        unhashed = sorted(n for n, (_, hashes) in packages.items() if not hashes)
        return cls(parsed.first("fingerprint"), packages, unhashed, parsed.first("refused"),
                   text, parsed.first("installer"), parsed.first("index").split(" ")[0],
                   parsed.cubins_cut, parsed)


def lock_diff(old: Lock | None, new: Lock) -> list[str]:
    """``+ name version`` / ``- name version`` / ``~ name old -> new`` lines, sorted by name."""
    before = {n: v for n, (v, _) in (old.packages.items() if old else ())}
    after = {n: v for n, (v, _) in new.packages.items()}
    lines = []
    for name in sorted(set(before) | set(after)):
        if name not in before:
            lines.append(f"+ {name} {after[name]}")
        elif name not in after:
            lines.append(f"- {name} {before[name]}")
        elif before[name] != after[name]:
            lines.append(f"~ {name} {before[name]} -> {after[name]}")
    return lines


def era_diff(old: Lock | None, new: Lock) -> list[str]:
    """``bound: exclude-newer OLD -> NEW`` when the date bound moved (``none`` for a lock
    written before there was one), else nothing: printed above the pins it moved."""
    before = old.parsed.first("exclude-newer").split(" ")[0] if old else ""
    after = new.parsed.first("exclude-newer").split(" ")[0]
    if old is None or before == after:
        return []
    return [f"bound: exclude-newer {before or 'none'} -> {after or 'none'}"]


def _size(count: int) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e8 else f"{count / 1e6:.1f} MB"


def layer_plan(packages: list[LockedPackage]) -> list[tuple[str, int, list[str]]]:
    """``[(layer, bytes, names)]``: each content group split first-fit-decreasing into
    layers of at most :data:`PLAN_LIMIT` (a larger single package gets a layer of its own)."""
    plan: list[tuple[str, int, list[str]]] = []
    for group, pattern in GROUPS:
        members = [p for p in packages
                   if _group_of(p.name) == group]
        bins: list[tuple[int, list[str]]] = []
        for package in sorted(members, key=lambda p: (-p.installed, p.name)):
            for index, (used, names) in enumerate(bins):
                if used + package.installed <= PLAN_LIMIT:
                    bins[index] = (used + package.installed, names + [package.name])
                    break
            else:
                bins.append((package.installed, [package.name]))
        for index, (used, names) in enumerate(bins, start=1):
            plan.append((f"{group}-{index}", used, sorted(names)))
    return plan


def _group_of(name: str) -> str:
    for group, pattern in GROUPS:
        if pattern and re.match(pattern, name):
            return group
    return "rest"


def format_lock(request: PayloadRequest, packages: list[LockedPackage], *, uv_version: str,
                refused: str = "") -> str:
    """The lock text. Deterministic: sorted names, no dates."""
    head = [f"# imgfab lock for recipe {request.recipe}: written by `imgfab lock`, do not edit.",
            "# fingerprint: ",
            f"# stack: {request.stack_line}",
            f"# target: Python {request.python}, {request.platform}",
            f"# requested: {' '.join(request.pins)}"]
    for pin in request.indexes:
        head.append(f"# index: {pin.url} (only: {' '.join(pin.names)})")
    head.append(f"# index: {request.default_index} (every other name; uv --index-strategy first-index)")
    if request.installer:
        head.append(f"# installer: {request.installer}")
    head.append(f"# resolver: uv {uv_version} pip compile --python-version {request.python} "
                f"--python-platform {request.platform} --only-binary :all:")
    if request.exclude_newer:
        head.append(f"# exclude-newer: {request.era or request.exclude_newer}")
    if request.constraints:
        head.append(f"# constraints: {' '.join(request.constraints)} (compat/payload.yaml constraints for "
                    f"CUDA {request.cuda_major}; uv -c: they bound a name, never add one)")
    if refused:
        head.append(f"# refused: {refused}")
        return _fingerprinted(request, "\n".join(head) + "\n")
    total = sum(p.installed for p in packages)
    head.append(f"# installed: {_size(total)} in {len(packages)} distributions (their RECORDs after the cuts "
                "below, .py counted twice for their bytecode)")
    if request.serves:
        head.append(f"# serves: {' '.join(request.serves)} (the recipe's {request.gpu or 'GPU'}: a cubin file "
                    "no such GPU can run is cut, and the image's arch label drops the GPUs it was for)")
        archs = sorted(set().union(*(p.cut_archs for p in packages)), key=stage.arch_label)
        if archs:
            head.append(f"# cubins-cut: {' '.join(archs)} (from the file names; imgfab-stage checks "
                        "each one's ELF header and fails on a disagreement)")
    for kind, what in (("static", "static libraries (*.a), never read when serving"),
                       ("cache", "__pycache__ shipped in wheels, rewritten by the interpreter"),
                       ("arch", "cubins no GPU the image serves can run")):
        owners = sorted((p for p in packages if p.cuts.get(kind)), key=lambda p: (-p.cuts[kind], p.name))
        amount = sum(p.cuts[kind] for p in owners)
        biggest = ", ".join(f"{p.name} {_size(p.cuts[kind])}" for p in owners[:4])
        head.append(f"# cut: {what}: {_size(amount)}" + (f" ({biggest})" if biggest else ""))
    head.append("# cut: CUDA libraries of a second CUDA major: 0 B (refused at lock time, one major only)")
    collided = reviewed_collisions(packages, request.collisions_allowed)
    if collided:
        head.append(f"# collisions-cut: {' '.join(collided)} (reviewed in compat/payload.yaml; two distributions "
                    "install it with different bytes, so which one is left is an installer race)")
    head.append("# kept: bytecode, compiled by imgfab-stage (unchecked-hash): import vllm 8.9 s -> 2.5 s "
                "for 0.34 GB (bench/README.md)")
    for layer, used, names in layer_plan(packages):
        note = " single package over the limit" if used > PLAN_LIMIT else ""
        head.append(f"# layer {layer} ({_size(used)}{note}): {' '.join(names)}")
    body = []
    for package in sorted(packages, key=lambda p: p.name):
        if package.hashes:
            hashes = " \\\n".join(f"    --hash={h}" for h in sorted(package.hashes))
            body.append(f"{package.name}=={package.version} \\\n{hashes}")
        else:
            body.append(f"{package.name}=={package.version}  # unhashed: index unreachable")
    return _fingerprinted(request, "\n".join(head) + "\n\n" + "\n".join(body) + "\n")


def _fingerprinted(request: PayloadRequest, text: str) -> str:
    return text.replace("# fingerprint: \n", f"# fingerprint: {lock_fingerprint(request, text)}\n", 1)


def _collisions(packages: list[LockedPackage]) -> dict[str, list[tuple[str, str]]]:
    """``{path: [(package, digest), ...]}`` for paths two distributions install with different bytes."""
    owners: dict[str, list[tuple[str, str]]] = {}
    for package in packages:
        for path, digest in package.files.items():
            if ".dist-info/" not in path:
                owners.setdefault(os.path.normpath(path), []).append((package.name, digest))
    return {path: who for path, who in owners.items() if len(who) > 1 and len({d for _, d in who}) > 1}


def reviewed_collisions(packages: list[LockedPackage], allowed: tuple[tuple[str, tuple[str, ...]], ...]) -> list[str]:
    """The reviewed colliding paths this payload really has: imgfab-stage cuts them, since which
    distribution's bytes the installer left there is a race (they differ between builds)."""
    reviewed = {(path, tuple(sorted(names))) for path, names in allowed}
    return sorted(path for path, who in _collisions(packages).items()
                  if (path, tuple(sorted(n for n, _ in who))) in reviewed)
