"""``imgfab lock``: a stack's whole Python payload, pinned with hashes, in ``recipes/<name>.lock``.

The lock is resolved for the image's own Python and wheel platform (``compat/payload.yaml``),
not the host's, by ``uv pip compile --python-version --python-platform`` (uv needs no such
interpreter). Its body is a requirements file (every package ``==`` with its ``--hash``es, for
``uv pip install --require-hashes --no-deps``); its header names the stack, the indexes, the
fingerprint of what decided the payload, the measured size cuts and the layer groups
(``# layer <group> (<size>): <names>``) the build stages the payload into.

Contract:

- :func:`payload_request` — Recipe × Stack (+ compat dir) → :class:`PayloadRequest` (pure).
- :func:`lock_recipe` — resolve, inspect (each wheel's RECORD, read by range requests: see
  :mod:`imgfab.wheelzip`), check and write. Refusals (:class:`~imgfab.errors.CompatibilityError`,
  exit 2) name the packages: CUDA wheels of two majors, two distributions writing one file with
  different bytes, a torch built for another CUDA major, a name taken from the wrong index.
- :func:`check_lock` — offline: is the committed lock present and does its fingerprint match?
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from imgfab import stage
from imgfab.errors import CompatibilityError, NetworkError, RecipeError

LOCK_FORMAT = 4  # 2: bytecode counted; 3: cubins for other GPUs cut; 4: reviewed collisions cut
LAYER_LIMIT = 2_000_000_000  # bytes uncompressed per payload layer (the 2 GB)
# Layers are planned from RECORD sizes (plus a bytecode estimate), which miss what the build
# adds; 5 % headroom keeps the measured layer under LAYER_LIMIT.
PLAN_LIMIT = LAYER_LIMIT * 95 // 100
_DEFAULT_INDEX = "https://pypi.org/simple"
# Content groups, least often changed first: (group, names it takes). First match wins;
# what matches none is "rest". Each group is split into ≤ LAYER_LIMIT layers.
GROUPS: tuple[tuple[str, str], ...] = (
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

    def fingerprint(self) -> str:
        data = {"format": LOCK_FORMAT, "pins": self.pins, "python": self.python,
                "platform": self.platform, "cuda_major": self.cuda_major,
                "indexes": [[i.url, list(i.names)] for i in self.indexes],
                "default_index": self.default_index, "installer": self.installer, "plan_limit": PLAN_LIMIT,
                "collisions_allowed": self.collisions_allowed, "layer_limit": LAYER_LIMIT,
                "groups": GROUPS, "serves": self.serves}
        if self.other_majors_allowed:  # absent for stacks no exception concerns (their locks keep their fingerprint)
            data["other_majors_allowed"] = self.other_majors_allowed
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
    requires: list[str] = field(default_factory=list)  # torch only: Requires-Dist lines


def lock_path(recipe_path: str | Path, recipe_name: str) -> Path:
    return Path(recipe_path).resolve().parent / f"{recipe_name}.lock"


def _payload_data(compat_dir: Path | None) -> dict[str, Any]:
    from imgfab.compat import default_compat_dir  # noqa: PLC0415

    path = (compat_dir or default_compat_dir()) / "payload.yaml"
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def payload_request(recipe: Any, stack: Any, compat_dir: Path | None = None) -> PayloadRequest:
    """The pins and targets of ``stack``'s payload. Pure over the compat data."""
    from imgfab.render import requirement_pins  # noqa: PLC0415

    data = _payload_data(compat_dir)
    platforms = {row["os"]: row for row in data.get("platforms", [])}
    if stack.os not in platforms:
        raise RecipeError(f"no wheel platform for {stack.os} in compat/payload.yaml",
                          field="target", fix="add the OS's glibc to compat/payload.yaml platforms")
    cuda_major = stack.cuda.split(".")[0]
    indexes = tuple(IndexPin(row["url"], tuple(sorted(stage.normalize(n) for n in row["names"])))
                    for row in data.get("indexes", [])
                    if row["backend"] == stack.backend and str(row["cuda_major"]) == cuda_major)
    torch = f", torch {stack.torch}" if stack.torch else ""
    return PayloadRequest(
        recipe=recipe.name,
        stack_line=(f"{stack.backend} {stack.backend_version}{torch}, CUDA {stack.cuda}, "
                    f"{stack.os}, Python {stack.python}"),
        pins=tuple(requirement_pins(stack)), python=stack.python,
        platform=platforms[stack.os]["python_platform"], cuda_major=cuda_major,
        indexes=indexes, default_index=data.get("default_index", _DEFAULT_INDEX),
        installer=_installer_line(data),
        collisions_allowed=tuple(sorted((row["path"], tuple(sorted(stage.normalize(n) for n in row["packages"])))
                                        for row in data.get("file_collisions_allowed", []))),
        serves=(stack.compute_capability,), gpu=stack.gpu,
        other_majors_allowed=tuple(sorted(stage.normalize(row["package"])
                                          for row in data.get("cuda_major_exceptions", [])
                                          if row["backend"] == stack.backend
                                          and str(row["cuda_major"]) == cuda_major)))


def _installer_line(data: dict[str, Any]) -> str:
    row = data.get("installer") or {}
    if not row:
        return ""
    return f"{row['name']}=={row['version']} " + " ".join(f"--hash={h}" for h in sorted(row["hashes"]))


# ---------------------------------------------------------------- the lock file


@dataclass
class Lock:
    """A parsed lock: header fields and ``{name: (version, hashes)}``."""

    fingerprint: str
    packages: dict[str, tuple[str, list[str]]]
    unhashed: list[str]
    refused: str
    text: str
    installer: str = ""
    index: str = ""  # the first index the header names
    cubins_cut: tuple[str, ...] = ()  # "sm100f" ...: architectures whose cubins the stage cuts

    def serving_archs(self, archs: tuple[str, ...]) -> tuple[str, ...]:
        """``archs`` (an image's kernel architectures) without those a cut cubin was built
        for: once its kernels are gone, the image no longer serves such a GPU fully."""
        cut = [stage.arch_label(a) for a in self.cubins_cut]
        return tuple(a for a in archs if not any(stage.runs_on(sm, suffix, a) for sm, suffix in cut))

    def layers(self) -> list[str]:
        """The payload layer groups, in the order the runtime copies them (venv first)."""
        return [stage.BASE_GROUP] + [m.group(1) for m in
                                     map(stage._LAYER_LINE.match, self.text.splitlines()) if m]

    @classmethod
    def parse(cls, text: str) -> Lock:
        header = {}
        for line in text.splitlines():
            match = re.match(r"^# ([a-z-]+): (.*)$", line)
            if match and match.group(1) not in header:
                header[match.group(1)] = match.group(2)
        packages: dict[str, tuple[str, list[str]]] = {}
        current = None
        for line in text.splitlines():
            pin = re.match(r"^([A-Za-z0-9_.-]+)==([^\s\\]+)", line)
            if pin:
                current = stage.normalize(pin.group(1))
                packages[current] = (pin.group(2), [])
            for digest in re.findall(r"--hash=(sha256:[0-9a-f]{64})", line):
                if current:
                    packages[current][1].append(digest)
        unhashed = sorted(n for n, (_, hashes) in packages.items() if not hashes)
        return cls(header.get("fingerprint", ""), packages, unhashed, header.get("refused", ""),
                   text, header.get("installer", ""), header.get("index", "").split(" ")[0],
                   tuple(header.get("cubins-cut", "").split(" (")[0].split()))


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
            f"# fingerprint: {request.fingerprint()}",
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
    if refused:
        head.append(f"# refused: {refused}")
        return "\n".join(head) + "\n"
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
    return "\n".join(head) + "\n\n" + "\n".join(body) + "\n"


# ---------------------------------------------------------------- resolving


def uv_binary() -> str:
    try:
        from uv import find_uv_bin  # noqa: PLC0415
    except ImportError:
        raise RecipeError("uv is not installed", field="imgfab lock",
                          fix="pip install uv (it is in imgfab's test extras)") from None
    return find_uv_bin()


def _uv_version(uv: str) -> str:
    return subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout.split()[1]


def resolve_packages(request: PayloadRequest, *, index_url: str | None = None,
                     uv: str | None = None) -> list[LockedPackage]:
    """Resolve ``request`` with uv into packages with their platform's wheels and hashes.

    ``index_url`` replaces every index (a mirror, or the tests' fake index)."""
    uv = uv or uv_binary()
    indexes = [index_url] if index_url else [p.url for p in request.indexes] + [request.default_index]
    with tempfile.TemporaryDirectory(prefix="imgfab-lock-") as scratch:
        source = Path(scratch) / "requirements.in"
        source.write_text("\n".join(request.pins) + "\n")
        out = Path(scratch) / "pylock.toml"
        argv = [uv, "pip", "compile", str(source), "-o", str(out), "--quiet", "--no-header",
                "--python-version", request.python, "--python-platform", request.platform,
                "--only-binary", ":all:", "--index-strategy", "first-index",
                "--default-index", indexes[-1]]
        for url in indexes[:-1]:
            argv += ["--index", url]
        env = dict(os.environ, UV_NO_CONFIG="1")
        env.setdefault("SSL_CERT_FILE", os.environ.get("IMGFAB_CA_CERT") or "/etc/ssl/certs/ca-certificates.crt")
        result = subprocess.run(argv, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            message = " ".join(line.strip() for line in result.stderr.splitlines()
                               if line.strip() and not line.startswith("warning"))[:600]
            if "Failed to fetch" in message or "error sending request" in message:
                raise NetworkError(f"uv could not reach an index: {message}", field="lock",
                                   fix="check the network, or pass --index-url MIRROR")
            raise CompatibilityError(f"the payload {' '.join(request.pins)} does not resolve for "
                                     f"Python {request.python} on {request.platform}: {message}",
                                     field="lock")
        data = tomllib.loads(out.read_text())
    packages = []
    for entry in data.get("packages", []):
        wheels = entry.get("wheels") or []
        packages.append(LockedPackage(
            name=stage.normalize(entry["name"]), version=str(entry["version"]),
            hashes=sorted(f"sha256:{w['hashes']['sha256']}" for w in wheels),
            urls=[w["url"] for w in wheels]))
    return sorted(packages, key=lambda p: p.name)


def inspect_packages(packages: list[LockedPackage], *, workers: int = 8, serves: tuple[str, ...] = ()) -> None:
    """Fill each package's RECORD files, installed size and cuts (and torch's Requires-Dist);
    ``serves``: the compute capabilities whose cubins stay (:func:`imgfab.stage.cut_kind`)."""
    from imgfab.wheelzip import read_members  # noqa: PLC0415

    def one(package: LockedPackage) -> None:
        if not package.urls:
            return
        suffixes = (".dist-info/RECORD", ".dist-info/METADATA") if package.name == "torch" \
            else (".dist-info/RECORD",)
        members = read_members(package.urls[0], package.hashes[0].split(":", 1)[1], suffixes)
        for row in members[".dist-info/RECORD"].splitlines():
            parts = row.rsplit(",", 2)
            if len(parts) != 3:
                continue
            path, digest, size = parts
            package.files[path] = digest
            count = int(size) if size.isdigit() else 0
            kind = stage.cut_kind(path, serves)
            if kind:
                package.cuts[kind] = package.cuts.get(kind, 0) + count
                if kind == "arch":
                    sm, suffix = stage.cubin_arch(path)  # type: ignore[misc]
                    package.cut_archs.add(f"sm{sm}{suffix}")
            else:
                # imgfab-stage compiles every .py: count its pyc as large as the source (the
                # real vLLM payload: 0.34 GB of pyc for its .py files; cuda-1 planned at 2.00 GB
                # without this measured 2.02 GB).
                package.installed += count * 2 if path.endswith(".py") else count
        if ".dist-info/METADATA" in members:
            package.requires = [line.split(":", 1)[1].strip()
                                for line in members[".dist-info/METADATA"].splitlines()
                                if line.startswith("Requires-Dist:")]

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, packages))


# ---------------------------------------------------------------- lock-time checks


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


# ---------------------------------------------------------------- commands


def _index_answers(url: str, name: str) -> bool:
    import requests  # noqa: PLC0415

    try:
        return requests.get(f"{url.rstrip('/')}/{name}/", timeout=10).status_code < 500
    except requests.RequestException:
        return False


def _unreachable_refusal(request: PayloadRequest, stack: Any, index_url: str | None) -> str:
    """The exact conflict when a pinned index does not answer (empty when all answer)."""
    if index_url:
        return ""
    silent = [pin for pin in request.indexes if not _index_answers(pin.url, pin.names[0])]
    if not silent:
        return ""
    # What the reachable index would give instead: resolve torch alone from it and say why
    # that cannot go in this image.
    # A local version label (2.9.1+cu130) exists only on its own index: what the reachable one
    # gives is the public release of the same version.
    torch_pins = tuple(p for p in request.pins if p.startswith("torch=="))
    alone = PayloadRequest(request.recipe, request.stack_line,
                           tuple(p.split("+", 1)[0] for p in torch_pins),
                           request.python, request.platform, request.cuda_major, (), request.default_index)
    because = "".join(f"{pin} is not on {request.default_index}; " for pin in torch_pins if "+" in pin)
    if alone.pins:
        packages = resolve_packages(alone)
        inspect_packages([p for p in packages if p.name == "torch"])
        torch = next(p for p in packages if p.name == "torch")
        major = torch_cuda_major(torch)
        if major != request.cuda_major:
            evidence = ", ".join(r.split(";")[0].strip() for r in torch.requires
                                 if r.startswith(("nvidia-nccl", "nvidia-cuda-runtime")))
            count = sum(1 for p in packages if _CUDA_WHEEL.match(p.name))
            because += (f"torch {torch.version} on {request.default_index} is a CUDA {major} build "
                       f"({evidence}; {count} nvidia-*-cu{major} wheels in all) and the stack is "
                       f"CUDA {stack.cuda}; ")
    where = " and ".join(f"{' '.join(p.names)} only on {p.url}" for p in silent)
    return (f"{stack.backend} {stack.backend_version} is incompatible with the reachable indexes: "
            f"{because}it needs {where}, which did not answer")


@dataclass
class LockResult:
    path: Path
    lock: Lock
    diff: list[str]
    written: bool


def lock_recipe(recipe_path: str, *, upgrade: bool = False, index_url: str | None = None,
                output: Path | None = None, compat_dir: Path | None = None,
                python: str | None = None, platform: str | None = None,
                extra_pins: dict[str, str] | None = None) -> LockResult:
    """Write (or keep) the lock of one recipe. A fresh lock is kept unless ``upgrade``.

    Raises :class:`CompatibilityError` (exit 2) for a refused payload, after writing a lock
    whose header says ``refused:`` (so ``--check`` knows the refusal is current)."""
    from imgfab.compat import load_matrix  # noqa: PLC0415
    from imgfab.recipe import load_recipe  # noqa: PLC0415
    from imgfab.resolve import resolve  # noqa: PLC0415

    recipe = load_recipe(recipe_path)
    stack = resolve(recipe, load_matrix(compat_dir)).stack
    request = payload_request(recipe, stack, compat_dir)
    if index_url:  # one index for every name (a mirror): the header says so
        request = replace(request, indexes=(), default_index=index_url)
    if python or platform:  # another interpreter than the stack's (the local stack's stand-ins)
        if output is None:
            raise RecipeError("a lock for another Python or platform is not the recipe's lock",
                              field="--python-version/--python-platform", fix="write it with --output FILE")
        request = replace(request, python=python or request.python, platform=platform or request.platform)
    if extra_pins:  # what-if pins (bench: another vLLM patch release); never the recipe's lock
        if output is None:
            raise RecipeError("a lock with other pins is not the recipe's lock", field="pins",
                              fix="write it with --output FILE")
        current = dict(pin.split("==", 1) for pin in request.pins)
        request = replace(request, pins=tuple(sorted(f"{n}=={v}" for n, v in (current | extra_pins).items())))
    path = output or lock_path(recipe_path, recipe.name)
    old = Lock.parse(path.read_text(encoding="utf-8")) if path.is_file() else None
    if old and not upgrade and old.fingerprint == request.fingerprint() and not old.refused:
        return LockResult(path, old, [], False)
    uv = uv_binary()
    refused = _unreachable_refusal(request, stack, index_url)
    packages: list[LockedPackage] = []
    if not refused:
        packages = resolve_packages(request, index_url=index_url, uv=uv)
        inspect_packages(packages, serves=request.serves)
        try:
            check_packages(packages, request, stack.cuda, index_url)
        except CompatibilityError as error:
            refused = error.message
    text = format_lock(request, packages, uv_version=_uv_version(uv), refused=refused)
    new = Lock.parse(text)
    _write(path, text)
    if refused:
        raise CompatibilityError(refused, field=f"lock {recipe.name}",
                                 fix="see compat/payload.yaml indexes; the refusal is recorded in "
                                 f"{path.name}")
    return LockResult(path, new, lock_diff(old, new), True)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


@dataclass
class CheckResult:
    recipe: str
    path: Path
    problem: str  # "" when fresh
    note: str = ""  # refused / unhashed names, for a fresh lock


def check_lock(recipe_path: str, compat_dir: Path | None = None) -> CheckResult:
    """Offline: compare the committed lock's fingerprint with the recipe and matrix."""
    from imgfab.compat import load_matrix  # noqa: PLC0415
    from imgfab.recipe import load_recipe  # noqa: PLC0415
    from imgfab.resolve import resolve  # noqa: PLC0415

    recipe = load_recipe(recipe_path)
    stack = resolve(recipe, load_matrix(compat_dir)).stack
    request = payload_request(recipe, stack, compat_dir)
    path = lock_path(recipe_path, recipe.name)
    if not path.is_file():
        return CheckResult(recipe.name, path, "missing")
    lock = Lock.parse(path.read_text(encoding="utf-8"))
    if lock.fingerprint != request.fingerprint():
        return CheckResult(recipe.name, path, f"stale (its fingerprint {lock.fingerprint[:12] or 'none'}, "
                                              f"the recipe and matrix give {request.fingerprint()[:12]})")
    note = f"refused: {lock.refused}" if lock.refused else ""
    if lock.unhashed:
        note = f"unhashed (index unreachable): {' '.join(lock.unhashed)}"
    return CheckResult(recipe.name, path, "", note)


def load_for_build(recipe_path: str, recipe: Any, stack: Any, lock_file: Path | None = None,
                   compat_dir: Path | None = None) -> Lock:
    """The lock a build installs: ``lock_file`` as given, or the recipe's committed lock,
    which must be fresh. Refused, missing or stale locks are :class:`RecipeError` (exit 2)."""
    if lock_file is not None:
        if not Path(lock_file).is_file():
            raise RecipeError(f"{lock_file} is not a file", field="--lock", fix="give a lock file")
        lock = Lock.parse(Path(lock_file).read_text(encoding="utf-8"))
    else:
        result = check_lock(recipe_path, compat_dir)
        if result.problem:
            raise RecipeError(f"{result.path} is {result.problem}", field="lock",
                              fix=f"run `imgfab lock {recipe_path}` and commit the lock")
        lock = Lock.parse(result.path.read_text(encoding="utf-8"))
    if lock.refused:
        raise CompatibilityError(lock.refused, field=f"lock {recipe.name}",
                                 fix="see compat/payload.yaml indexes")
    if lock.unhashed:
        raise RecipeError(f"the lock pins {' '.join(lock.unhashed)} without hashes", field="lock",
                          fix="lock where their index answers")
    if not lock.packages:
        raise RecipeError("the lock names no packages", field="lock", fix=f"run `imgfab lock {recipe_path}`")
    return lock


def served_stack(stack: Any, lock: Lock | None) -> Any:
    """``stack`` as its image built from ``lock`` serves it: the arch label (``archs``) without
    the GPUs whose cubins the lock's ``# cubins-cut:`` line says the stage removes."""
    if lock is None or not lock.cubins_cut:
        return stack
    return replace(stack, archs=lock.serving_archs(stack.archs))


def committed_lock(recipe_path: str | Path, recipe: Any, stack: Any,
                   compat_dir: Path | None = None) -> Lock | None:
    """The recipe's committed lock when it is fresh and installable; None otherwise."""
    path = lock_path(recipe_path, recipe.name)
    if not path.is_file():
        return None
    lock = Lock.parse(path.read_text(encoding="utf-8"))
    if lock.fingerprint != payload_request(recipe, stack, compat_dir).fingerprint() \
            or lock.refused or lock.unhashed or not lock.packages:
        return None
    return lock
