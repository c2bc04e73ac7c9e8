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

Standard library only (it imports the payload's FlashInfer, not imgfab).
"""

from __future__ import annotations

import importlib
import os
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
    if len(argv) < 2:
        print("usage: imgfab-kernels OUT MODULE:GENERATOR...", file=sys.stderr)
        return 2
    if not os.environ.get("FLASHINFER_CUDA_ARCH_LIST"):
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
    stage(built, Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
