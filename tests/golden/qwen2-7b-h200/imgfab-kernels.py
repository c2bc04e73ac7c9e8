"""imgfab-kernels: compile FlashInfer's JIT modules in the builder, for one GPU, with no GPU.

Run in the builder's ``kernels`` stage (rendered by imgfab) with the payload's interpreter::

    FLASHINFER_CUDA_ARCH_LIST=9.0 CUDA_HOME=/opt/imgfab/cuda \\
        /opt/venv/bin/python3 imgfab-kernels.py /opt/imgfab/layers/kernels \\
        flashinfer.jit.sampling:gen_sampling_module

For each ``module:generator`` spec it builds FlashInfer's JIT spec (nvcc for the architectures
of ``FLASHINFER_CUDA_ARCH_LIST`` only: FlashInfer reads no GPU when that is set), places the
library where FlashInfer looks before it would build (``JitSpec.aot_path``:
``<flashinfer>/data/aot/<name>/<name>.so``), checks that FlashInfer now sees it as ahead of time
(``is_aot``), and stages a copy of every such file, at its path in the image, under OUT
(owners and modes as imgfab-stage leaves the payload, mtimes the epoch), so the runtime copies
it as one layer of its own. Any failure exits non-zero naming the spec: the build stops here,
never at a serving start.

With ``--triton SEED [LAUNCHERS.json]`` it also builds what Triton compiles with the C compiler
at a serving start (triton/runtime/build.py ``compile_module_from_src``): its CUDA driver helper
(``cuda_utils``, from the payload's ``driver.c``) and the launcher stub of each kernel signature
LAUNCHERS lists (``make_launcher`` of the payload's Triton, measured on a GPU by a serving run).
Each goes into a Triton cache at SEED, under the key Triton itself computes
(sha256 of the source and ``platform_key()``, found through Triton's own cache manager), so that the runtime, which copies SEED into its
``TRITON_CACHE_DIR`` at start, finds it and needs no compiler. ``platform_key()`` ends with
``platform.architecture()``'s linkage, which Python reads by running ``file`` on the
interpreter: ``ELF`` where ``file`` is installed, empty where it is not (the minimal bases).
The runtime, not this stage, decides which, so each module is written under both keys (one
compile, the same bytes twice), and a recorded key must equal one of them. No GPU: the link takes a stub
``libcuda.so.1`` (``-Wl,--no-as-needed`` keeps it needed, as Ubuntu's gcc would drop it), and the
driver's own libcuda.so.1 is what loads on a GPU host. A launcher whose regenerated source
does not give the recorded key fails the build naming it (the payload's Triton is not the one
that was measured).

Standard library only (it imports the payload's FlashInfer and Triton, not imgfab).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sysconfig
import tempfile
import shutil
import sys
from pathlib import Path


def compile_spec(spec_path: str) -> Path:
    """Build one ``module:generator`` JIT spec into FlashInfer's AOT layout; its library."""
    module_name, generator = spec_path.split(":", 1)
    spec = getattr(importlib.import_module(module_name), generator)()
    spec.build(verbose=os.environ.get("FLASHINFER_JIT_VERBOSE") == "1")
    built = Path(spec.jit_library_path)
    target = Path(spec.aot_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(built, target)
    if not spec.is_aot:
        raise RuntimeError(f"{spec_path}: FlashInfer does not see {target} as ahead of time")
    return target


def _typed(value):
    """A recorded signature entry as make_launcher takes it (JSON lists back to tuples)."""
    return tuple(_typed(v) for v in value) if isinstance(value, list) else value


def triton_modules(seed: Path, launchers: list[dict]) -> list[Path]:
    """Compile Triton's driver helper and the listed launchers into the Triton cache ``seed``."""
    work = Path(tempfile.mkdtemp(prefix="imgfab-triton-"))
    cc = shutil.which(os.environ.get("CC") or "gcc")
    if cc is None:
        raise RuntimeError("no C compiler in the builder (gcc)")
    (work / "lib").mkdir()
    subprocess.run([cc, "-shared", "-nostdlib", "-Wl,-soname,libcuda.so.1", "-o",
                    str(work / "lib" / "libcuda.so.1"), "-x", "c", "/dev/null"], check=True)
    wrapper = work / "cc"
    wrapper.write_text(f'#!/bin/sh\nexec {cc} -Wl,--no-as-needed "$@"\n')
    wrapper.chmod(0o755)
    os.environ.update(TRITON_CACHE_DIR=str(seed), TRITON_LIBCUDA_PATH=str(work / "lib"), CC=str(wrapper))
    from triton.backends.nvidia import driver
    from triton.runtime import build

    sources = [("cuda_utils", Path(driver.dirname, "driver.c").read_text(), None)]
    for number, record in enumerate(launchers, 1):
        signature = {i: _typed(kind) for i, kind in enumerate(record["signature"])}
        sources.append(("__triton_launcher", driver.make_launcher({}, signature, record.get("tensordesc_meta")),
                        record.get("key") or f"launcher {number}"))
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    here = build.platform_key()
    # the runtime's platform_key() with and without `file` (see the module's docstring)
    bare = here[:-len("ELF")] if here.endswith(",ELF") else here
    platform_keys = (bare + "ELF", bare)
    built = []
    for name, src, recorded in sources:
        keys = {pk: hashlib.sha256((src + pk).encode("utf-8")).hexdigest() for pk in platform_keys}
        if recorded is not None and recorded not in keys.values():
            raise RuntimeError(f"the launcher recorded as {recorded} regenerates as {' or '.join(keys.values())}: "
                               "this payload's Triton is not the one measured")
        try:
            build.compile_module_from_src(src=src, name=name, library_dirs=driver.library_dirs(),
                                          include_dirs=driver.include_dirs, libraries=driver.libraries)
        except ImportError:
            pass  # loading it needs the driver's libcuda.so.1 (a GPU host's); the file is written first
        found = build.get_cache_manager(keys[here]).get_file(f"{name}{suffix}")  # Triton's own lookup
        if found is None:
            raise RuntimeError(f"Triton's {name} was not written to its cache at {seed}")
        for key in keys.values():
            cache = build.get_cache_manager(key)
            if cache.get_file(f"{name}{suffix}") is None:
                cache.put(Path(found).read_bytes(), f"{name}{suffix}", binary=True)
            placed = cache.get_file(f"{name}{suffix}")
            if placed is None or not Path(placed).resolve().is_relative_to(seed.resolve()):
                raise RuntimeError(f"Triton's {name} ({key}) was not written to its cache at {seed}")
            built.append(Path(placed))
    shutil.rmtree(work, ignore_errors=True)
    return built


def stage(files: list[Path], out: Path) -> None:
    """Copy ``files`` under ``out`` at their absolute paths, 0644 (dirs 0755), mtime 0."""
    for path in files:
        copy = out / str(path).lstrip("/")
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
        copy.chmod(0o644)
    for root, dirs, names in os.walk(out):
        for name in dirs:
            (Path(root) / name).chmod(0o755)
        for name in dirs + names:
            os.utime(Path(root) / name, (0, 0), follow_symlinks=False)
    os.utime(out, (0, 0))


def main(argv: list[str]) -> int:
    triton = None
    if "--triton" in argv:
        at = argv.index("--triton")
        triton = [a for a in argv[at + 1:at + 3] if not a.startswith("--") and ":" not in a]
        argv = argv[:at] + argv[at + 1 + len(triton):]
    if not argv or (len(argv) < 2 and not triton) or triton == []:
        print("usage: imgfab-kernels OUT MODULE:GENERATOR... [--triton SEED [LAUNCHERS.json]]", file=sys.stderr)
        return 2
    if len(argv) > 1 and not os.environ.get("FLASHINFER_CUDA_ARCH_LIST"):
        print("imgfab-kernels: FLASHINFER_CUDA_ARCH_LIST is not set: the kernels' target GPU must be "
              "named (FlashInfer would otherwise ask a GPU the builder does not have)", file=sys.stderr)
        return 2
    built = []
    for spec in argv[1:]:
        try:
            built.append(compile_spec(spec))
        except Exception as error:  # noqa: BLE001 - any failure stops the build, named
            print(f"imgfab-kernels: {spec}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
                  file=sys.stderr)
            return 1
        print(f"imgfab-kernels: {spec} -> {built[-1]} ({built[-1].stat().st_size} bytes, "
              f"arch {os.environ['FLASHINFER_CUDA_ARCH_LIST']})")
    if triton:
        launchers = json.loads(Path(triton[1]).read_text())["launchers"] if len(triton) > 1 else []
        try:
            modules = triton_modules(Path(triton[0]), launchers)
        except Exception as error:  # noqa: BLE001 - any failure stops the build, named
            print(f"imgfab-kernels: triton: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
                  file=sys.stderr)
            return 1
        print(f"imgfab-kernels: triton: cuda_utils and {len(launchers)} launcher(s) -> {triton[0]} "
              f"({sum(p.stat().st_size for p in modules)} bytes)")
        built += modules
    stage(built, Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
