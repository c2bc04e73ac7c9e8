"""A host driver as people paste it, read against the matrix: ``580.95.05`` and ``v580.95.05``
are that release; ``R580`` is the newest R580 release the matrix knows (with a note saying
which); ``13.0`` (nvidia-smi's "CUDA Version") and a lone ``580`` are refused, naming why and
the fix. The releases the matrix knows are the Linux drivers of compat/cuda.yaml ``toolkits``
(Table 3 of NVIDIA's CUDA release notes).
"""

from __future__ import annotations

from imgfab.errors import RecipeError
from imgfab.in_image.rules import major_minor, parse_version
from imgfab.matrix.compat import CudaToolkit, Matrix
from imgfab.recipe import read_driver_text

_FIX = "give the driver version nvidia-smi prints ('Driver Version', e.g. 580.95.05; 570.86 on GeForce)"


def _releases(matrix: Matrix) -> set[str]:
    """Every driver release the matrix records (the toolkits' Linux drivers)."""
    return {t.min_driver for t in matrix.toolkits.values() if t.min_driver and "." in t.min_driver}


def branch_releases(matrix: Matrix, branch: str) -> list[str]:
    """The driver releases of ``branch`` ("580") the matrix records, oldest first (each once)."""
    return sorted((r for r in _releases(matrix) if r.split(".")[0] == branch), key=parse_version)


def cuda_toolkit(matrix: Matrix, cuda: str) -> CudaToolkit | None:
    """The toolkit row whose driver CUDA ``cuda`` needs: the exact release for ``12.8.1``, the
    first release of the minor with a recorded driver for ``13.0`` (13.0.0); None if none."""
    if cuda.count(".") == 2:
        row = matrix.toolkits.get(cuda)
        return row if row is not None and row.min_driver else None
    rows = [t for t in matrix.toolkits.values() if major_minor(t.version) == cuda and t.min_driver]
    return min(rows, key=lambda t: parse_version(t.version)) if rows else None


def read_host_driver(text: str, matrix: Matrix, field: str = "--driver") -> tuple[str, str]:
    """(driver version, note) for the host driver ``text``; the note is "" unless ``text`` named
    a branch. Raises RecipeError (exit 2, naming ``field``) for what is not a driver.

    >>> read_host_driver("R580", matrix)  # doctest: +SKIP
    ('580.95.05', '--driver R580 read as 580.95.05, the newest R580 release the matrix knows ...')
    """
    read = read_driver_text(text)
    if read.kind == "version":
        return read.value, ""
    if read.kind == "branch":
        releases = branch_releases(matrix, read.value)
        if not releases:
            known = sorted({r.split(".")[0] for r in _releases(matrix)}, key=int)
            raise RecipeError(f"no R{read.value} release is known to the matrix (compat/cuda.yaml "
                              f"records releases of {', '.join('R' + b for b in known)})",
                              field=field, fix=_FIX)
        return releases[-1], (f"{field} {text} read as {releases[-1]}, the newest R{read.value} "
                              "release the matrix knows (compat/cuda.yaml); give the exact version "
                              "nvidia-smi prints to resolve for that driver")
    if read.kind == "cuda":
        toolkit = cuda_toolkit(matrix, read.value)
        needs = (f"CUDA {read.value} needs driver ≥ {toolkit.min_driver} (CUDA {toolkit.version}, "
                 "compat/cuda.yaml)" if toolkit else f"the matrix records no driver for CUDA {read.value}")
        raise RecipeError(f"{text!r} is a CUDA version (nvidia-smi's 'CUDA Version'), not a driver: "
                          f"{needs}", field=field, fix=_FIX)
    if read.kind == "lone-branch":
        releases = branch_releases(matrix, read.value)
        example = f", e.g. {releases[-1]}" if releases else ""
        raise RecipeError(f"{text!r} is a driver branch number alone, not a driver version",
                          field=field, fix=f"write R{read.value} for the newest R{read.value} release "
                                           f"the matrix knows, or the full version nvidia-smi prints{example}")
    stripped = read_driver_text(text.strip()) if isinstance(text, str) else read
    why = (" (it has surrounding space)" if text != text.strip() and stripped.kind in ("version", "branch")
           else f": {read.value}")
    raise RecipeError(f"{text!r} is not a driver version{why}", field=field, fix=_FIX)


__all__ = ["branch_releases", "cuda_toolkit", "read_host_driver"]
