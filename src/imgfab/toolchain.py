"""Which run-time toolchain a runtime image carries: per backend, GPU and precision.

Serving JIT-compiles some kernels on first use: Triton's launcher stub (a C compiler and
``Python.h``) for every vLLM image, FlashInfer's attention kernels (``nvcc``) where vLLM picks
FlashInfer. ``compat/backends.yaml`` declares both: each backend's base ``runtime_toolchain``,
and its ``jit_toolchains``, each with the GPUs / KV-cache types that need it and the runtime
flavor that carries it. :func:`runtime_plan` is pure; the resolver calls it for every stack and
refuses a stack whose needed flavor has no image (:class:`JitToolchainMissing`).

    >>> plan = runtime_plan(profile, compute_capability="8.9", kv_cache_dtype="fp8", precision="fp8")
    >>> plan.flavor, plan.toolchain            # doctest: +SKIP
    ('devel', ('g++', 'gcc', 'libc6-dev', 'nvcc', 'python3-dev'))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from imgfab.rules import compare_versions


@dataclass(frozen=True)
class JitToolchain:
    """One compiler a backend's kernels need at run time, and where they need it.

    ``min_cc``/``max_cc`` bound the GPUs (inclusive, empty: unbounded), ``kv_cache_dtype`` and
    ``precisions`` narrow it further (empty: any). ``runtime_flavor`` is the ``nvidia/cuda``
    flavor that carries the compiler (``devel`` ships nvcc and the CUDA headers).
    """

    name: str
    min_cc: str
    max_cc: str
    kv_cache_dtype: str
    precisions: tuple[str, ...]
    runtime_flavor: str
    runtime_packages: tuple[str, ...]
    runtime_toolchain: tuple[str, ...]
    reason: str
    source: str
    confirmed: bool

    def applies(self, compute_capability: str, kv_cache_dtype: str, precision: str) -> bool:
        if self.min_cc and compare_versions(compute_capability, self.min_cc) < 0:
            return False
        if self.max_cc and compare_versions(compute_capability, self.max_cc) > 0:
            return False
        if self.kv_cache_dtype and kv_cache_dtype != self.kv_cache_dtype:
            return False
        return not self.precisions or precision in self.precisions


@dataclass(frozen=True)
class RuntimePlan:
    """What the runtime stage is built on and carries: flavor, apt packages, declared tools."""

    flavor: str
    packages: tuple[str, ...]
    toolchain: tuple[str, ...]
    jit: tuple[str, ...]  # names of the JIT toolchains that apply
    reasons: tuple[str, ...]
    sources: tuple[str, ...]
    unconfirmed: tuple[str, ...]


# A flavor that carries more: a plan picks the richest flavor any applying toolchain needs.
_FLAVOR_RANK = {"base": 0, "runtime": 1, "devel": 2}


def parse_jit_toolchains(rows: Any, where: str) -> tuple[JitToolchain, ...]:
    """``jit_toolchains`` records of one backends.yaml row → :class:`JitToolchain` (ValueError
    naming the key on a malformed record)."""
    out = []
    for row in rows or ():
        if not isinstance(row, dict):
            raise ValueError(f"{where}: jit_toolchains entries must be mappings")
        for key in ("name", "runtime_flavor", "reason", "source"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise ValueError(f"{where}: jit_toolchains entry needs a string {key!r}")
        if row["runtime_flavor"] not in _FLAVOR_RANK:
            raise ValueError(f"{where}: runtime_flavor must be one of {sorted(_FLAVOR_RANK)}")
        out.append(JitToolchain(
            name=row["name"], min_cc=str(row.get("min_cc") or ""), max_cc=str(row.get("max_cc") or ""),
            kv_cache_dtype=str(row.get("kv_cache_dtype") or ""),
            precisions=tuple(str(p) for p in row.get("precisions") or ()),
            runtime_flavor=row["runtime_flavor"],
            runtime_packages=tuple(str(p) for p in row.get("runtime_packages") or ()),
            runtime_toolchain=tuple(str(p) for p in row.get("runtime_toolchain") or ()),
            reason=" ".join(row["reason"].split()), source=row["source"],
            confirmed=row.get("confirmed") is True))
    return tuple(out)


def runtime_plan(profile: Any, *, compute_capability: str, kv_cache_dtype: str,
                 precision: str) -> RuntimePlan:
    """The runtime stage for ``profile`` (a :class:`imgfab.compat.BackendProfile`) on one GPU."""
    flavor = profile.runtime_flavor
    packages = set(profile.runtime_packages)
    toolchain = set(profile.runtime_toolchain)
    applying = [j for j in profile.jit_toolchains
                if j.applies(compute_capability, kv_cache_dtype, precision)]
    for jit in applying:
        if _FLAVOR_RANK[jit.runtime_flavor] > _FLAVOR_RANK.get(flavor, 0):
            flavor = jit.runtime_flavor
        packages.update(jit.runtime_packages)
        toolchain.update(jit.runtime_toolchain)
    return RuntimePlan(
        flavor=flavor, packages=tuple(sorted(packages)), toolchain=tuple(sorted(toolchain)),
        jit=tuple(j.name for j in applying), reasons=tuple(j.reason for j in applying),
        sources=tuple(sorted({j.source for j in applying})),
        unconfirmed=tuple(f"backends {profile.backend} jit {j.name}: {j.reason}"
                          for j in applying if not j.confirmed))
