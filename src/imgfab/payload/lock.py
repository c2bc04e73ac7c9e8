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
  :mod:`imgfab.matrix.wheelzip`), check and write. Refusals (:class:`~imgfab.errors.CompatibilityError`,
  exit 2) name the packages: CUDA wheels of two majors, two distributions writing one file with
  different bytes, a torch built for another CUDA major, a name taken from the wrong index.
- :func:`check_lock` — offline: is the committed lock present and does its fingerprint match?
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from imgfab.in_image import stage
from imgfab.errors import CompatibilityError, HostError, MatrixError, NetworkError, RecipeError
from imgfab.matrix.compat import default_compat_dir, load_tensorrt, tensorrt_pin
from imgfab.payload.era import era_line, exclude_newer
from imgfab.payload.checks import (BACKENDS, check_cuda_majors, check_declared_ranges, check_file_collisions, check_indexes,
                                   check_packages, check_torch_cuda, torch_cuda_major)
from imgfab.payload.lockfile import (_CUDA_WHEEL, _DEFAULT_INDEX, LAYER_LIMIT, PLAN_LIMIT, IndexPin,
                                     Lock, LockedPackage, PayloadRequest, era_diff, format_lock, layer_plan,
                                     lock_diff, lock_fingerprint, reviewed_collisions)

# The names other stations and the tests use, wherever they live in this package.
__all__ = ["LAYER_LIMIT", "PLAN_LIMIT", "Lock", "LockedPackage", "PayloadRequest", "IndexPin",
           "check_cuda_majors", "check_declared_ranges", "check_file_collisions", "check_indexes", "check_lock",
           "check_header", "check_packages", "check_torch_cuda", "committed_lock", "format_lock", "layer_plan",
           "load_for_build", "lock_diff", "lock_fingerprint", "lock_path", "lock_recipe", "payload_request",
           "requirement_pins", "reviewed_collisions", "served_stack", "torch_cuda_major"]


def requirement_pins(stack: Any, compat_dir: Path | None = None) -> list[str]:
    """The payload's top-level pins: the backend and torch exactly, and for TensorRT-LLM the
    TensorRT of ``compat_dir``'s tensorrt.yaml (``imgfab lock`` resolves the rest; where each
    name comes from is compat/payload.yaml's business)."""
    package = {"vllm": "vllm", "tensorrt-llm": "tensorrt-llm"}[stack.backend]
    pins = [f"{package}=={stack.backend_version}"]
    if stack.torch:
        pins.append(f"torch=={stack.torch}")
    if stack.backend == "tensorrt-llm":  # one exact TensorRT: the engine's cache key and label name it
        releases = load_tensorrt(compat_dir or default_compat_dir())
        pins.append(f"tensorrt=={tensorrt_pin(stack.tensorrt, stack.backend_version, stack.cuda, releases)}")
    # The run-time JIT toolchain's wheels, at the CUDA toolkit release torch pins (backends.yaml).
    pins.extend(stack.payload_toolchain)
    # Across nodes: the cluster runtime the backend's wheels do not require (ray for vLLM);
    # unversioned, so the lock's era bound picks the release.
    pins.extend(getattr(stack, "payload_multinode", ()))
    return sorted(pins)


def lock_path(recipe_path: str | Path, recipe_name: str) -> Path:
    return Path(recipe_path).resolve().parent / f"{recipe_name}.lock"


def _payload_data(compat_dir: Path | None) -> dict[str, Any]:
    path = (compat_dir or default_compat_dir()) / "payload.yaml"
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def payload_request(recipe: Any, stack: Any, compat_dir: Path | None = None) -> PayloadRequest:
    """The pins and targets of ``stack``'s payload. Pure over the compat data."""
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
    uploaded = _backend_uploaded(stack, compat_dir)
    return PayloadRequest(
        recipe=recipe.name,
        stack_line=(f"{stack.backend} {stack.backend_version}{torch}, CUDA {stack.cuda}, "
                    f"{stack.os}, Python {stack.python}"),
        pins=tuple(requirement_pins(stack, compat_dir)), python=stack.python,
        platform=platforms[stack.os]["python_platform"], cuda_major=cuda_major,
        indexes=indexes, default_index=data.get("default_index", _DEFAULT_INDEX),
        installer=_installer_line(data),
        collisions_allowed=tuple(sorted((row["path"], tuple(sorted(stage.normalize(n) for n in row["packages"])))
                                        for row in data.get("file_collisions_allowed", []))),
        serves=(stack.compute_capability,), gpu=stack.gpu,
        other_majors_allowed=tuple(sorted(stage.normalize(row["package"])
                                          for row in data.get("cuda_major_exceptions", [])
                                          if row["backend"] == stack.backend
                                          and str(row["cuda_major"]) == cuda_major)),
        exclude_newer=exclude_newer(uploaded) if uploaded else "",
        era=era_line(stack.backend, stack.backend_version, uploaded) if uploaded else "",
        constraints=tuple(sorted(requirement for row in data.get("constraints", [])
                                 if str(row["cuda_major"]) == cuda_major
                                 for requirement in row["requirements"])),
        families=tuple((str(row["cuda_major"]), tuple(sorted(stage.normalize(n) for n in row["family"])),
                        tuple(row["requirements"])) for row in data.get("constraints", [])))


def _backend_uploaded(stack: Any, compat_dir: Path | None) -> str:
    """The ``uploaded:`` the matrix records for the stack's backend release ("" when none)."""
    from imgfab.matrix.compat import load_matrix  # noqa: PLC0415

    return next((r.uploaded for r in load_matrix(compat_dir).releases
                 if r.backend == stack.backend and r.version == stack.backend_version), "")


def _installer_line(data: dict[str, Any]) -> str:
    row = data.get("installer") or {}
    if not row:
        return ""
    return f"{row['name']}=={row['version']} " + " ".join(f"--hash={h}" for h in sorted(row["hashes"]))


# ---------------------------------------------------------------- the lock file


# ---------------------------------------------------------------- resolving


# uv's own words for a failure of this machine rather than of the payload: its cache
# (`Failed to initialize cache at …`, `Failed to write to the client cache`, …) or any other
# operating-system error (`… (os error 28)`: no space left, permission denied).
_UV_HOST_FAILURE = re.compile(r"Failed to (initialize|write to the client|read from the client) "
                              r"cache|\(os error \d+\)")


def uv_binary() -> str:
    try:
        from uv import find_uv_bin  # noqa: PLC0415
    except ImportError:
        raise HostError("uv is not installed", field="imgfab lock",
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
        if request.constraints:  # families bounded to the stack's CUDA major
            constraints = Path(scratch) / "constraints.txt"
            constraints.write_text("\n".join(request.constraints) + "\n")
            argv += ["--constraints", str(constraints)]
        if request.exclude_newer:  # the backend release's era (imgfab.payload.era)
            argv += ["--exclude-newer", request.exclude_newer]
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
            if _UV_HOST_FAILURE.search(message):  # this machine, not the payload (issue 21)
                raise HostError(f"uv failed on this machine: {message}", field="lock",
                                fix="make UV_CACHE_DIR (default ~/.cache/uv) a writable "
                                    "directory with free space")
            if request.exclude_newer and "filtered by `exclude-newer`" in message:
                # An index that reports no upload time (PEP 700) has every file filtered out.
                raise CompatibilityError(
                    f"the payload {' '.join(request.pins)} does not resolve under the era bound "
                    f"exclude-newer {request.exclude_newer}: {message}", field="lock",
                    fix="lock against an index that reports upload times (PyPI, or a mirror "
                        "serving the PEP 691 JSON API with PEP 700 upload-time); an index "
                        "without them has every file left out by the bound")
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


def inspect_packages(packages: list[LockedPackage], *, workers: int = 8, serves: tuple[str, ...] = (),
                     progress: Any = None) -> None:
    """Fill each package's RECORD files, installed size and cuts (and the Requires-Dist of
    torch and the backend);
    ``serves``: the compute capabilities whose cubins stay (:func:`imgfab.in_image.stage.cut_kind`).
    ``progress`` (:class:`imgfab.progress.Progress`) hears of each package as its RECORD is read."""
    import threading  # noqa: PLC0415

    from imgfab.matrix.wheelzip import read_members  # noqa: PLC0415

    done = [0]
    counted = threading.Lock()

    def report(package: LockedPackage) -> None:
        if progress is not None:
            with counted:
                done[0] += 1
                progress.item("RECORD", done[0], len(packages), f"{package.name} {package.version}")

    def one(package: LockedPackage) -> None:
        if not package.urls:
            return
        # torch's Requires-Dist names its CUDA major; the backend's are the ranges every pin
        # must be inside (checks.check_declared_ranges).
        suffixes = (".dist-info/RECORD", ".dist-info/METADATA") if package.name in ("torch", *BACKENDS) \
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

    def counted_one(package: LockedPackage) -> None:
        one(package)
        report(package)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(counted_one, packages))


# ---------------------------------------------------------------- lock-time checks


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
                           request.python, request.platform, request.cuda_major, (), request.default_index,
                           exclude_newer=request.exclude_newer)
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
                extra_pins: dict[str, str] | None = None, progress: Any = None) -> LockResult:
    """Write (or keep) the lock of one recipe. A fresh lock is kept unless ``upgrade``.
    ``progress`` (:class:`imgfab.progress.Progress`) hears of each step and RECORD read.

    Raises :class:`CompatibilityError` (exit 2) for a refused payload, after writing a lock
    whose header says ``refused:`` (so ``--check`` knows the refusal is current)."""
    from imgfab.matrix.compat import load_matrix  # noqa: PLC0415
    from imgfab.recipe import load_recipe  # noqa: PLC0415
    from imgfab.stack.resolve import resolve  # noqa: PLC0415

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
    if not request.exclude_newer:
        raise MatrixError(f"compat: {stack.backend} {stack.backend_version} records no 'uploaded:' time, "
                          "so the lock has no era to resolve under", field="compat",
                          fix="run `imgfab compat refresh` (it reads the upload time from PyPI)")
    path = output or lock_path(recipe_path, recipe.name)
    old = _readable_lock(path)
    if old and not upgrade and _is_fresh(old, request) and not old.refused:
        return LockResult(path, old, [], False)
    uv = uv_binary()
    if progress is not None:
        progress.step(f"{recipe.name}: checking the indexes answer")
    refused = _unreachable_refusal(request, stack, index_url)
    refusal_fix = ("lock where the indexes compat/payload.yaml pins these names to answer, or against a "
                   "mirror that serves every name (--index-url MIRROR)")
    packages: list[LockedPackage] = []
    if not refused:
        if progress is not None:
            progress.step(f"{recipe.name}: resolving {' '.join(request.pins)} with uv "
                          f"(Python {request.python}, {request.platform})")
        packages = resolve_packages(request, index_url=index_url, uv=uv)
        if progress is not None:
            progress.step(f"{recipe.name}: {len(packages)} packages resolved; reading each "
                          f"wheel's RECORD")
        inspect_packages(packages, serves=request.serves, progress=progress)
        if progress is not None:
            progress.step(f"{recipe.name}: checking the payload")
        try:
            check_packages(packages, request, stack.cuda, index_url)
        except CompatibilityError as error:
            refused, refusal_fix = error.message, error.fix or "see compat/payload.yaml"
    text = format_lock(request, packages, uv_version=_uv_version(uv), refused=refused)
    new = Lock.parse(text)
    _write(path, text)
    if refused:
        raise CompatibilityError(refused, field=f"lock {recipe.name}",
                                 fix=f"{refusal_fix}; the refusal is recorded in {path.name}")
    return LockResult(path, new, era_diff(old, new) + lock_diff(old, new), True)


def _readable_lock(path: Path) -> Lock | None:
    """The lock at ``path`` to diff against and maybe keep; None when absent or not a lock
    (an edited file is what `imgfab lock` rewrites)."""
    if not path.is_file():
        return None
    try:
        return Lock.read(path)
    except RecipeError:
        return None


def _is_fresh(lock: Lock, request: PayloadRequest) -> bool:
    """Does ``lock``'s fingerprint match the request and every line of the file?"""
    return lock.fingerprint == lock_fingerprint(request, lock.text)


# The header lines that record what compat/payload.yaml and the recipe decide; --check
# compares each with what they give now (the builder reads none of them).
_RECORDED = ("stack", "target", "requested", "index", "installer", "exclude-newer", "constraints")


def check_header(lock: Lock, request: PayloadRequest, source: str, recipe_path: str) -> None:
    """Refuse (RecipeError) a header line that records another index, installer, target,
    pins or served GPU than compat/payload.yaml and the recipe give."""
    expected = Lock.parse(format_lock(request, [], uv_version="0", refused="-")).parsed
    recorded = lock.parsed
    for key in _RECORDED:
        if recorded.header.get(key, []) != expected.header.get(key, []):
            line = recorded.lines.get(key, 1)
            raise RecipeError(f"{source}:{line}: its '# {key}:' lines record "
                              f"{' | '.join(recorded.header.get(key, [])) or 'nothing'}, compat/payload.yaml "
                              f"and the recipe give {' | '.join(expected.header.get(key, [])) or 'nothing'}",
                              field="lock", fix=f"run `imgfab lock {recipe_path}` and commit the lock")
    if not lock.refused and recorded.serves != request.serves:
        raise RecipeError(f"{source}:{recorded.lines.get('serves', 1)}: its '# serves:' line records "
                          f"{' '.join(recorded.serves) or 'nothing'}, the recipe's GPU is "
                          f"{' '.join(request.serves)}", field="lock",
                          fix=f"run `imgfab lock {recipe_path}` and commit the lock")
    allowed = {path for path, _ in request.collisions_allowed}
    for path in recorded.collisions:
        if path not in allowed:
            raise RecipeError(f"{source}:{recorded.lines.get('collisions-cut', 1)}: its '# collisions-cut:' "
                              f"line names {path}, which compat/payload.yaml does not review", field="lock",
                              fix=f"run `imgfab lock {recipe_path}` and commit the lock")


def _write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename; an interrupt or a full disk on the way
    leaves the old lock whole and no temporary file beside it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass
class CheckResult:
    recipe: str
    path: Path
    problem: str  # "" when fresh
    note: str = ""  # refused / unhashed names, for a fresh lock
    lock: Lock | None = None  # the fresh lock, bound to the request it was checked against

    @property
    def refused(self) -> str:
        """The refusal a fresh lock records: that recipe cannot build ("" when it records none,
        and for a missing or stale lock, which is a ``problem`` instead)."""
        return self.lock.refused if not self.problem and self.lock is not None else ""


def check_lock(recipe_path: str, compat_dir: Path | None = None) -> CheckResult:
    """Offline: parse the committed lock strictly, compare its fingerprint with the recipe,
    the matrix and the file's own lines, and its recorded header with compat/payload.yaml.

    A line that is not imgfab's lock format, or a header recording another index, installer or
    served GPU, is RecipeError (exit 2); a missing or stale lock is a ``problem``."""
    from imgfab.matrix.compat import load_matrix  # noqa: PLC0415
    from imgfab.recipe import load_recipe  # noqa: PLC0415
    from imgfab.stack.resolve import resolve  # noqa: PLC0415

    recipe = load_recipe(recipe_path)
    stack = resolve(recipe, load_matrix(compat_dir)).stack
    request = payload_request(recipe, stack, compat_dir)
    path = lock_path(recipe_path, recipe.name)
    if not path.is_file():
        return CheckResult(recipe.name, path, "missing")
    lock = Lock.read(path)
    expected = lock_fingerprint(request, lock.text)
    if lock.fingerprint != expected:
        return CheckResult(recipe.name, path, f"stale or edited (its fingerprint {lock.fingerprint[:12] or 'none'}, "
                                              f"the recipe, matrix and its lines give {expected[:12]})")
    check_header(lock, request, path.name, recipe_path)
    note = f"refused: {lock.refused}" if lock.refused else ""
    if lock.unhashed:
        note = f"unhashed (index unreachable): {' '.join(lock.unhashed)}"
    return CheckResult(recipe.name, path, "", note, lock.bind(request))


def load_for_build(recipe_path: str, recipe: Any, stack: Any, lock_file: Path | None = None,
                   compat_dir: Path | None = None) -> Lock:
    """The lock a build installs: ``lock_file`` as given, or the recipe's committed lock,
    which must be fresh. Refused, missing or stale locks are :class:`RecipeError` (exit 2).

    Either is parsed strictly and bound to the recipe's :class:`PayloadRequest`: the builder
    takes its installer, index and served GPUs from compat/payload.yaml, never from the file."""
    request = payload_request(recipe, stack, compat_dir)
    if lock_file is not None:
        if not Path(lock_file).is_file():
            raise RecipeError(f"{lock_file} is not a file", field="--lock", fix="give a lock file")
        lock = Lock.read(Path(lock_file)).bind(request)
    else:
        result = check_lock(recipe_path, compat_dir)
        if result.problem or result.lock is None:
            raise RecipeError(f"{result.path} is {result.problem}", field="lock",
                              fix=f"run `imgfab lock {recipe_path}` and commit the lock")
        lock = result.lock.bind(request)
    if lock.refused:
        raise CompatibilityError(lock.refused, field=f"lock {recipe.name}",
                                 fix="see compat/payload.yaml indexes")
    if lock.unhashed:
        raise RecipeError(f"the lock pins {' '.join(lock.unhashed)} without hashes", field="lock",
                          fix="lock where their index answers")
    if not lock.packages:
        raise RecipeError("the lock names no packages", field="lock", fix=f"run `imgfab lock {recipe_path}`")
    lock.requirements()  # refuses an unreviewed collisions-cut path before anything is built
    return lock


def served_stack(stack: Any, lock: Lock | None) -> Any:
    """``stack`` as its image built from ``lock`` serves it: the arch label (``archs``) without
    the GPUs whose cubins the lock's ``# cubins-cut:`` line says the stage removes."""
    if lock is None or not lock.cubins_cut:
        return stack
    return replace(stack, archs=lock.serving_archs(stack.archs))


def committed_lock(recipe_path: str | Path, recipe: Any, stack: Any,
                   compat_dir: Path | None = None) -> Lock | None:
    """The recipe's committed lock when it is fresh and installable, bound to the recipe's
    request; None otherwise. A file that is not imgfab's lock format, or whose header records
    another index, installer or served GPU, is RecipeError (exit 2), not None."""
    path = lock_path(recipe_path, recipe.name)
    if not path.is_file():
        return None
    request = payload_request(recipe, stack, compat_dir)
    lock = Lock.read(path)
    if not _is_fresh(lock, request) or lock.refused or lock.unhashed or not lock.packages:
        return None
    check_header(lock, request, path.name, str(recipe_path))
    return lock.bind(request)
