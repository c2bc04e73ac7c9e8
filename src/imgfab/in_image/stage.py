"""Split an installed venv into one staging tree per layer group of a lock (stdlib only).

Runs inside the builder stage (copied into the build context as ``imgfab-stage.py``)::

    python3 imgfab-stage.py LOCK VENV STAGING

1. deletes what serving never reads (:func:`cut_kind`: static ``.a`` libraries, ``__pycache__``,
   and standalone ``.cubin`` kernels no GPU the lock's ``# serves:`` line names can run; each
   such cubin's ELF header must agree with the architecture its file name gives, or the stage
   fails: names predict, the payload decides);
2. moves each distribution's files (its installed ``RECORD``) to ``STAGING/<group>/VENV/...``
   for the group the lock's ``# layer <group>: <names>`` header line puts it in; what no
   RECORD names (the venv's own files) goes to the group ``venv``;
3. compiles each group's Python files to bytecode next to them (``unchecked-hash`` pycs: no
   source mtime inside, never re-validated, so they survive the mtime normalisation and stay
   byte-identical; measured: ``import vllm`` 8.9 s without bytecode, 2.4–2.7 s with it, for
   0.34 GB, bench/README.md);
4. normalises every staged entry: owner 0:0, mtime :data:`EPOCH`, so two builds of one lock
   give byte-identical layers.

The same rules decide the cuts the lock header measures (:mod:`imgfab.payload.lock` imports
:func:`cut_kind`). Exit status 2 with one line when a locked distribution is not installed or
a cubin's header disagrees with its name.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

EPOCH = 0  # SOURCE_DATE_EPOCH for the payload layers: 1970-01-01T00:00:00Z
BASE_GROUP = "venv"
_LAYER_LINE = re.compile(r"^# layer ([a-z0-9-]+) \([^)]*\): (.*)$")
_COLLISIONS_LINE = re.compile(r"^# collisions-cut: (\S+(?: \S+)*?)(?: \(|$)")
_SERVES_LINE = re.compile(r"^# serves: ([0-9.]+(?: [0-9.]+)*)(?: |$)")
# The SASS architecture a kernel file's name gives: the last ``sm100f``, ``Sm103a``, ``sm_90``.
_CUBIN_NAME_SM = re.compile(r"[Ss]m_?(\d{2,3})([af]?)(?=[^0-9]|$)")
EM_CUDA = 190


def cubin_arch(path: str) -> tuple[int, str] | None:
    """``(sm, suffix)`` a ``.cubin`` file's name gives (``fmhaSm100fKernel_x.cubin`` → (100,
    "f")), or None: not a cubin, or no architecture in its name (then it is never cut)."""
    name = path.rsplit("/", 1)[-1]
    if not name.endswith(".cubin"):
        return None
    found = _CUBIN_NAME_SM.findall(name[:-len(".cubin")])
    return (int(found[-1][0]), found[-1][1]) if found else None


def arch_label(label: str) -> tuple[int, str]:
    """``(sm, suffix)`` of an architecture as a lock's ``# cubins-cut:`` line writes it
    (``sm100f`` → (100, "f")): the same reading :func:`cubin_arch` gives a file name."""
    match = _CUBIN_NAME_SM.fullmatch(label)
    if match is None:
        raise ValueError(f"not an architecture label: {label!r}")
    return int(match.group(1)), match.group(2)


def runs_on(sm: int, suffix: str, capability: str) -> bool:
    """Can a GPU of ``capability`` ("9.0") run SASS built for ``sm``+``suffix``? Same major
    and at least the minor; an ``a`` (architecture-specific) build only on its own GPU.
    (CUDA Programming Guide, "Binary Compatibility"; LLVM's CUDA plugin ``isELFCompatible``
    applies the same major/minor rule.)"""
    major, minor = (int(part) for part in capability.split(".")[:2])
    if major != sm // 10:
        return False
    return minor == sm % 10 if suffix == "a" else minor >= sm % 10


def elf_sm(header: bytes) -> int | None:
    """The SASS architecture in a CUDA ELF (cubin) header, or None if it is not one.

    ``e_machine`` EM_CUDA (190); the SM sits in ``e_flags`` bits 0-7 under ABI version 7 and
    bits 8-15 under ABI version 8 (Blackwell onwards): llvm/include/llvm/BinaryFormat/ELF.h
    ``EF_CUDA_SM`` / ``EF_CUDA_SM_MASK``, ``ELFABIVERSION_CUDA_V1`` / ``_V2``."""
    if len(header) < 52 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        return None
    if struct.unpack_from("<H", header, 18)[0] != EM_CUDA:
        return None
    flags = struct.unpack_from("<I", header, 48)[0]
    if header[8] == 7:
        return flags & 0xFF
    if header[8] == 8:
        return (flags >> 8) & 0xFF
    return None


def _header_words(lock_text: str, line: re.Pattern[str]) -> tuple[str, ...]:
    """The words of the first lock header line ``line`` matches (its first group), or ()."""
    for text in lock_text.splitlines():
        match = line.match(text)
        if match:
            return tuple(match.group(1).split())
    return ()


def collisions(lock_text: str) -> tuple[str, ...]:
    """Site-packages paths the lock's ``# collisions-cut:`` line names: two distributions install
    each with different bytes (reviewed as never read when serving), and the installer's
    parallel extraction decides which one is left, so the stage removes it."""
    return _header_words(lock_text, _COLLISIONS_LINE)


def serves(lock_text: str) -> tuple[str, ...]:
    """The compute capabilities the lock's ``# serves:`` line names (none: no cubin is cut)."""
    return _header_words(lock_text, _SERVES_LINE)


def normalize(name: str) -> str:
    """PEP 503 name: ``Nvidia_CUBLAS.cu12`` → ``nvidia-cublas-cu12``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def cut_kind(path: str, gpus: tuple[str, ...] = ()) -> str | None:
    """The size cut a RECORD path falls under, or None to keep it.

    ``static``: ``*.a`` static libraries (linking happens at build time, never in serving);
    ``cache``: ``__pycache__`` entries shipped in a wheel (the interpreter rewrites them);
    ``arch``: a ``.cubin`` whose name gives an architecture none of ``gpus`` (compute
    capabilities) can run: a kernel loaded from a file only on the GPU it was built for.
    """
    if path.endswith(".a"):
        return "static"
    if "/__pycache__/" in f"/{path}":
        return "cache"
    if gpus:
        arch = cubin_arch(path)
        if arch and not any(runs_on(*arch, gpu) for gpu in gpus):
            return "arch"
    return None


def _cut_cubin(path: str, arch: tuple[int, str]) -> None:
    """Check the header of a cubin the ``arch`` cut removes: its name must not lie."""
    with open(path, "rb") as handle:
        found = elf_sm(handle.read(64))
    if found != arch[0]:
        what = f"sm{found}" if found is not None else "not a CUDA ELF"
        print(f"imgfab-stage: {path}: named sm{arch[0]}{arch[1]} but its header says {what}; "
              "the arch cut trusts no name its payload contradicts", file=sys.stderr)
        raise SystemExit(2)


def layer_groups(lock_text: str) -> dict[str, str]:
    """``{distribution name: group}`` from a lock's ``# layer`` header lines."""
    groups = {}
    for line in lock_text.splitlines():
        match = _LAYER_LINE.match(line)
        if match:
            for name in match.group(2).split():
                groups[normalize(name)] = match.group(1)
    return groups


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if len(found) != 1:
        raise SystemExit(f"imgfab-stage: {venv}: expected one lib/python3*/site-packages, found {len(found)}")
    return found[0]


def _records(site: Path) -> dict[str, list[Path]]:
    """Installed distribution name → its files (absolute), from each dist-info RECORD."""
    files: dict[str, list[Path]] = {}
    for record in sorted(site.glob("*.dist-info/RECORD")):
        name = normalize(record.parent.name.removesuffix(".dist-info").rsplit("-", 1)[0])
        _canonical_record(record)
        with record.open(newline="", encoding="utf-8") as handle:
            paths = [Path(os.path.normpath(site / row[0])) for row in csv.reader(handle) if row]
        # Plus what the dist-info holds beyond its RECORD, file by file (never the directory
        # whole: its entries would keep the installer's order).
        extra = [f for f in sorted(record.parent.rglob("*")) if f.is_symlink() or not f.is_dir()]
        files[name] = paths + extra
    return files


def _canonical_record(record: Path) -> None:
    """Make an installed RECORD byte-identical across installs: uv's ``uv_cache.json`` (the
    time the wheel entered uv's cache) and its line go, and the lines are sorted (an installer
    extracting in parallel may write them in any order)."""
    cache = record.parent / "uv_cache.json"
    if cache.exists():
        cache.unlink()
    lines = [line for line in record.read_text(encoding="utf-8").splitlines()
             if line and not line.startswith(f"{record.parent.name}/uv_cache.json,")]
    record.write_text("".join(f"{line}\n" for line in sorted(lines)), encoding="utf-8")


def _move(path: Path, staging: Path) -> None:
    """Move ``path`` (a file, link or directory) to the same absolute path under ``staging``,
    merging into directories already there."""
    target = staging / path.relative_to("/")
    if path.is_dir() and not path.is_symlink() and target.is_dir():
        for child in sorted(path.iterdir()):
            _move(child, staging)
        path.rmdir()
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(path, target)
    except OSError:  # EXDEV: a directory of a lower overlay layer (the engine path's payload stage)
        shutil.move(str(path), str(target))


# One fresh interpreter per layer group, one worker, compileall's sorted order: marshal flags an
# object for back-references when its reference count is above 1, so a .pyc's bytes can depend
# on what the compiling process did before (astral-sh/uv#10619, python/cpython#98819), and a
# worker pool hands files to whichever worker is free. A precaution: the one difference the
# real-payload repro measured (2026-12-01) was build_backend.py, an installer race between two
# distributions (see :func:`collisions`), not bytecode.
_COMPILE = ("import compileall, py_compile, sys; compileall.compile_dir(sys.argv[1], quiet=2, "
            "stripdir=sys.argv[1], prependdir='/', workers=1, "
            "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)")


def _compile(tree: Path, python: str) -> None:
    """Bytecode for every ``.py`` under ``tree``, as the interpreter will find it at its final
    path (``tree`` stripped from the recorded file names), compiled by an interpreter of its
    own (:data:`_COMPILE`) so that the bytes depend on ``tree`` alone. A file that does not
    compile (a template, another Python's syntax) keeps no .pyc, as with compileall itself."""
    subprocess.run([python, "-I", "-c", _COMPILE, str(tree)], check=False)


def _normalise(tree: Path) -> None:
    for root, dirs, files in os.walk(tree, topdown=False):
        for name in files + dirs:
            path = os.path.join(root, name)
            os.lchown(path, 0, 0)
            os.utime(path, (EPOCH, EPOCH), follow_symlinks=False)
    os.lchown(tree, 0, 0)
    os.utime(tree, (EPOCH, EPOCH))


def stage(lock: Path, venv: Path, staging: Path) -> dict[str, int]:
    """Cut, split and normalise; returns ``{group: files moved}``."""
    # The interpreter for the compiles, resolved before anything moves: on the engine path the
    # stage runs with /opt/venv/bin first on PATH, and that venv's python3 link is staged too.
    python = os.path.realpath(sys.executable)
    text = lock.read_text(encoding="utf-8")
    groups, gpus = layer_groups(text), serves(text)
    site = _site_packages(venv)
    installed = _records(site)
    missing = sorted(set(groups) - set(installed))
    if missing:
        print(f"imgfab-stage: locked but not installed: {' '.join(missing)}", file=sys.stderr)
        raise SystemExit(2)
    cut: dict[str, list[int]] = {}  # kind → [files, bytes]

    def remove(path: str, kind: str) -> None:
        tally = cut.setdefault(kind, [0, 0])
        tally[0] += 1
        tally[1] += os.path.getsize(path)
        os.unlink(path)

    for relative in collisions(text):
        path = site / relative
        if path.is_file() and not path.is_symlink():
            remove(str(path), "collision")
    for root, dirs, files in os.walk(venv):
        for name in sorted(files):
            path = os.path.join(root, name)
            kind = cut_kind(os.path.relpath(path, site), gpus)
            if kind and not os.path.islink(path):
                if kind == "arch":
                    _cut_cubin(path, cubin_arch(path))  # type: ignore[arg-type]
                remove(path, kind)
        if "__pycache__" in dirs:
            shutil.rmtree(os.path.join(root, "__pycache__"))
            dirs.remove("__pycache__")
    for kind, (files_cut, size) in sorted(cut.items()):
        print(f"imgfab-stage: cut {kind}: {files_cut} files, {size / 1e6:.1f} MB")
    # Moved in one sorted order, so every staging tree is created in the same order on every
    # build (a layer's tar lists entries in the order the engine walks them).
    counts: dict[str, int] = {}
    moves = sorted((str(path), groups.get(name, BASE_GROUP))
                   for name, paths in installed.items() for path in paths)
    for path, group in moves:
        if os.path.lexists(path):
            _move(Path(path), staging / group)
            counts[group] = counts.get(group, 0) + 1
    # Directories the distributions emptied go; what is left (the interpreter links,
    # pyvenv.cfg, activate scripts) is the base group.
    for root, dirs, _files in os.walk(venv, topdown=False):
        for name in dirs:
            full = Path(root) / name
            if not full.is_symlink() and not any(full.iterdir()):
                full.rmdir()
    for entry in sorted(venv.iterdir()):
        _move(entry, staging / BASE_GROUP)
        counts[BASE_GROUP] = counts.get(BASE_GROUP, 0) + 1
    for group in sorted(set(groups.values()) | {BASE_GROUP}):
        (staging / group / venv.relative_to("/")).mkdir(parents=True, exist_ok=True)
        _compile(staging / group, python)
        _normalise(staging / group)
    return counts


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: imgfab-stage LOCK VENV STAGING", file=sys.stderr)
        return 2
    counts = stage(Path(argv[0]), Path(argv[1]), Path(argv[2]))
    for group, count in sorted(counts.items()):
        print(f"imgfab-stage: {group}: {count} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
