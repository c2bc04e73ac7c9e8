"""The run-time JIT toolchain rows of ``compat/backends.yaml`` (``jit_toolchains``), as data.

Each row says which backend releases, GPUs, KV-cache types and precisions compile kernels at
run time, and where the compiler comes from (``image``: a ``nvidia/cuda`` flavor; ``payload``:
the payload's own CUDA wheels). :mod:`imgfab.stack.toolchain` decides with them; this module
only parses and bounds them, at matrix load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from imgfab.in_image.rules import compare_versions

TOOLCHAIN_SOURCES = ("image", "payload")


@dataclass(frozen=True)
class JitToolchain:
    """One compiler a backend's kernels need at run time, and where they need it.

    ``backend_versions`` (a PEP 440 specifier, empty: every release) and ``min_cc``/``max_cc``
    (inclusive, empty: unbounded) bound it; ``kv_cache_dtype`` and ``precisions`` narrow it
    further (empty: any). ``toolchain`` says where the compiler comes from: ``image`` (the
    ``runtime_flavor`` that carries it) or ``payload`` (the ``payload_requirements`` locked
    with torch's CUDA toolkit version).
    """

    name: str
    backend_versions: str
    min_cc: str
    max_cc: str
    kv_cache_dtype: str
    precisions: tuple[str, ...]
    toolchain: str
    runtime_flavor: str
    payload_requirements: tuple[str, ...]
    runtime_packages: tuple[str, ...]
    runtime_toolchain: tuple[str, ...]
    compiles: str
    reason: str
    source: str
    confirmed: bool
    # Ahead of time: the FlashInfer JIT specs ("module:generator") the builder compiles for the
    # recipe's GPU with no GPU present, into FlashInfer's AOT layout; the runtime then compiles
    # nothing of this toolchain (FLASHINFER_DISABLE_JIT=1). Empty: it compiles at start.
    aot_specs: tuple[str, ...] = ()
    aot_source: str = ""

    def applies(self, backend_version: str, compute_capability: str, kv_cache_dtype: str,
                precision: str) -> bool:
        if self.backend_versions and Version(backend_version) not in SpecifierSet(self.backend_versions):
            return False
        if self.min_cc and compare_versions(compute_capability, self.min_cc) < 0:
            return False
        if self.max_cc and compare_versions(compute_capability, self.max_cc) > 0:
            return False
        if self.kv_cache_dtype and kv_cache_dtype != self.kv_cache_dtype:
            return False
        return not self.precisions or precision in self.precisions


# A flavor that carries more: a plan picks the richest flavor any applying toolchain needs.
FLAVOR_RANK = {"base": 0, "runtime": 1, "devel": 2}


def _strings(row: dict[str, Any], key: str) -> tuple[str, ...]:
    return tuple(str(p) for p in row.get(key) or ())


def parse_jit_toolchains(rows: Any, where: str) -> tuple[JitToolchain, ...]:
    """``jit_toolchains`` records of one backends.yaml row → :class:`JitToolchain` (ValueError
    naming the key on a malformed record)."""
    out = []
    for row in rows or ():
        if not isinstance(row, dict):
            raise ValueError(f"{where}: jit_toolchains entries must be mappings")
        for key in ("name", "reason", "source", "compiles"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise ValueError(f"{where}: jit_toolchains entry needs a string {key!r}")
        source = row.get("toolchain", "image")
        if source not in TOOLCHAIN_SOURCES:
            raise ValueError(f"{where}: jit_toolchains {row['name']}: toolchain must be one of "
                             f"{list(TOOLCHAIN_SOURCES)}")
        flavor = row.get("runtime_flavor") or ("devel" if source == "image" else "")
        if source == "image" and flavor not in FLAVOR_RANK:
            raise ValueError(f"{where}: runtime_flavor must be one of {sorted(FLAVOR_RANK)}")
        if source == "payload" and (flavor or not row.get("payload_requirements")):
            raise ValueError(f"{where}: jit_toolchains {row['name']}: a payload toolchain names "
                             "payload_requirements and no runtime_flavor")
        aot = _strings(row, "aot_specs")
        if any(spec.count(":") != 1 or not all(spec.split(":")) for spec in aot):
            raise ValueError(f"{where}: jit_toolchains {row['name']}: aot_specs are 'module:generator' "
                             f"paths, got {list(aot)}")
        if aot and (source != "payload" or not row.get("aot_source")):
            raise ValueError(f"{where}: jit_toolchains {row['name']}: aot_specs need toolchain: payload "
                             "(the builder compiles with the payload's nvcc) and an aot_source")
        versions = str(row.get("backend_versions") or "")
        try:
            SpecifierSet(versions)
        except InvalidSpecifier:
            raise ValueError(f"{where}: jit_toolchains {row['name']}: backend_versions must be a "
                             f"PEP 440 specifier, got {versions!r}") from None
        out.append(JitToolchain(
            name=row["name"], backend_versions=versions,
            min_cc=str(row.get("min_cc") or ""), max_cc=str(row.get("max_cc") or ""),
            kv_cache_dtype=str(row.get("kv_cache_dtype") or ""),
            precisions=_strings(row, "precisions"), toolchain=source, runtime_flavor=flavor,
            payload_requirements=_strings(row, "payload_requirements"),
            runtime_packages=_strings(row, "runtime_packages"),
            runtime_toolchain=_strings(row, "runtime_toolchain"),
            compiles=" ".join(row["compiles"].split()),
            reason=" ".join(row["reason"].split()), source=row["source"],
            confirmed=row.get("confirmed") is True, aot_specs=aot,
            aot_source=str(row.get("aot_source") or "")))
    return tuple(out)


