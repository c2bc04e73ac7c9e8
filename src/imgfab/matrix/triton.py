"""Load ``compat/triton_launchers.yaml``: the Triton launcher stubs a backend release compiles
with the C compiler when it serves, measured on a GPU (issue 33).

Triton builds, at a serving start, its CUDA driver helper (``cuda_utils``, from ``driver.c``) and
one launcher stub per kernel signature it launches (``make_launcher``), each with ``$CC``/gcc
against Python.h (triton/runtime/build.py). The builder's kernels stage compiles the helper and
every signature a row lists (``imgfab-kernels --triton``), so a runtime whose stack has a
confirmed row carries no C compiler. A row names the backend release, the Triton version the
signatures were read from (make_launcher's source, hence the cache key, changes with it), the
GPU run that measured them, and each signature with the cache key it gave there. A malformed
row raises :class:`~imgfab.errors.MatrixError` naming it; the file is optional.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgfab.errors import MatrixError
from imgfab.matrix.records import _read, _sourced

TRITON_FILE = "triton_launchers.yaml"
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class TritonLaunchers:
    """The launcher signatures ``backend`` ``backend_version`` launched with ``triton``."""

    backend: str
    backend_version: str
    triton: str
    measured: str  # the GPU run (machine, date, recipe) that recorded them
    signatures: tuple[dict[str, Any], ...]
    source: str
    confirmed: bool
    # The serving settings the run measured: a stack outside them may launch other kernels.
    compute_capabilities: tuple[str, ...] = ()
    precisions: tuple[str, ...] = ()
    kv_cache_dtypes: tuple[str, ...] = ()
    tensor_parallel: tuple[int, ...] = ()
    pipeline_parallel: tuple[int, ...] = ()
    nodes: tuple[int, ...] = ()

    def covers(self, backend: str, backend_version: str, compute_capability: str, precision: str,
               kv_cache_dtype: str, tensor_parallel: int, pipeline_parallel: int, nodes: int) -> bool:
        """Whether this confirmed row was measured for a stack of these settings."""
        return (self.confirmed and (self.backend, self.backend_version) == (backend, backend_version)
                and compute_capability in self.compute_capabilities and precision in self.precisions
                and kv_cache_dtype in self.kv_cache_dtypes and tensor_parallel in self.tensor_parallel
                and pipeline_parallel in self.pipeline_parallel and nodes in self.nodes)

    def launchers_json(self) -> dict[str, Any]:
        """What imgfab-kernels reads (``--triton SEED FILE``)."""
        return {"backend": self.backend, "backend_version": self.backend_version, "triton": self.triton,
                "measured": self.measured, "launchers": [dict(s) for s in self.signatures]}


def _kind(value: Any) -> bool:
    """A Triton type in a recorded signature: a string, or a list of them (a tuple argument)."""
    return isinstance(value, str) or (isinstance(value, list) and all(_kind(v) for v in value))


def load_triton_launchers(directory: Path) -> list[TritonLaunchers]:
    """The rows of ``directory/triton_launchers.yaml`` (none when the file is absent)."""
    if not (directory / TRITON_FILE).is_file():
        return []
    rows = _read(directory, TRITON_FILE).get("launchers") or []
    if not isinstance(rows, list):
        raise MatrixError(f"{TRITON_FILE}: 'launchers' must be a list", field="compat",
                          fix="one row per backend release and Triton version")
    found: list[TritonLaunchers] = []
    for index, row in enumerate(rows):
        where = f"{TRITON_FILE} launchers[{index}]"
        try:
            signatures = tuple(row["signatures"])
            if not all(isinstance(s, dict) and isinstance(s.get("signature"), list)
                       and isinstance(s.get("key"), str) and len(s["key"]) == 64 for s in signatures):
                raise MatrixError(f"{where}: each signature is {{signature: [...], key: <sha256>}}",
                                  field="compat", fix="record them with tests/gpu/capture/sitecustomize.py")
            if not all(_HEX64.fullmatch(s["key"]) and all(_kind(a) for a in s["signature"])
                       for s in signatures):
                raise MatrixError(f"{where}: a key is not a sha256 or a signature holds what is no Triton type",
                                  field="compat", fix="record them with tests/gpu/capture/sitecustomize.py")
            found.append(TritonLaunchers(
                backend=str(row["backend"]), backend_version=str(row["backend_version"]),
                triton=str(row["triton"]), measured=str(row["measured"]), signatures=signatures,
                compute_capabilities=tuple(str(c) for c in row["compute_capabilities"]),
                precisions=tuple(str(p) for p in row["precisions"]),
                kv_cache_dtypes=tuple(str(k) for k in row["kv_cache_dtypes"]),
                tensor_parallel=tuple(int(n) for n in row["tensor_parallel"]),
                pipeline_parallel=tuple(int(n) for n in row["pipeline_parallel"]),
                nodes=tuple(int(n) for n in row["nodes"]), **_sourced(row)))
        except (KeyError, TypeError, ValueError) as missing:
            raise MatrixError(f"{where} is malformed ({missing})", field="compat",
                              fix="backend, backend_version, triton, measured, compute_capabilities, precisions, "
                                  "kv_cache_dtypes, tensor_parallel, pipeline_parallel, nodes, signatures, "
                                  "source, confirmed") from None
    return found


def launchers_for(rows: list[TritonLaunchers], stack: Any) -> TritonLaunchers | None:
    """The confirmed row measured for ``stack``'s release and serving settings, or None."""
    return next((r for r in rows if r.covers(stack.backend, stack.backend_version, stack.compute_capability,
                                             stack.precision, stack.kv_cache_dtype, stack.tensor_parallel,
                                             stack.pipeline_parallel, stack.nodes)), None)
