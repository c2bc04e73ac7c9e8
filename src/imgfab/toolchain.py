"""Which run-time toolchain a runtime image carries: per backend release, GPU and precision.

Serving JIT-compiles some kernels on its first start: Triton's launcher stub (a C compiler and
``Python.h``) for every vLLM image, FlashInfer's kernels (``nvcc``, ``g++``, the CUDA headers)
where vLLM's sampler or attention backend lands on FlashInfer. ``compat/backends.yaml``
declares both: each backend's base ``runtime_toolchain``, and its ``jit_toolchains``, each with
the backend releases, GPUs and KV-cache types that need it and where the compiler comes from:

- ``toolchain: image``: the ``nvidia/cuda`` flavor that ships it (``devel``: nvcc and the
  headers under ``/usr/local/cuda``);
- ``toolchain: payload``: the payload's own CUDA wheels (``cuda-toolkit[nvcc,...]`` at the
  version torch pins), which install one toolkit tree under ``site-packages/nvidia/cuNN``;
  the runtime stage points ``CUDA_HOME`` at a view of it (:data:`PAYLOAD_CUDA_HOME`). Only the
  CUDA 13 wheels share one tree; a payload row on another CUDA major is refused.

:func:`runtime_plan` is pure; the resolver calls it for every stack and refuses a stack whose
needed flavor has no image, or whose payload toolchain its CUDA major cannot give.

    >>> plan = runtime_plan(profile, backend_version="0.26.0", compute_capability="9.0",
    ...                     kv_cache_dtype="auto", precision="bf16", cuda_major="13")
    >>> plan.flavor, plan.cuda_home                  # doctest: +SKIP
    ('base', '/opt/imgfab/cuda')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from imgfab.rules import compare_versions

# Where the runtime stage builds its view of the payload's CUDA toolkit (bin, include, nvvm,
# lib64 with the unversioned libcudart.so and a libcuda.so link stub): FlashInfer's JIT reads
# $CUDA_HOME/bin/nvcc, $CUDA_HOME/include and links -L$CUDA_HOME/lib64{,/stubs} -lcudart -lcuda.
PAYLOAD_CUDA_HOME = "/opt/imgfab/cuda"
# The -devel images' toolkit (nvcc, headers, stubs), where an image row's compiler lives.
IMAGE_CUDA_HOME = "/usr/local/cuda"
# CUDA majors whose wheels install one toolkit tree (site-packages/nvidia/cu13/{bin,include,lib,
# nvvm}); CUDA 12's wheels use one directory per component, so no view of them is made here.
PAYLOAD_TREE_MAJORS = ("13",)
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


@dataclass(frozen=True)
class RuntimePlan:
    """What the runtime stage is built on and carries: flavor, apt packages, declared tools,
    the payload wheels a toolchain needs, where ``CUDA_HOME`` points, and what compiles."""

    flavor: str
    packages: tuple[str, ...]
    toolchain: tuple[str, ...]
    jit: tuple[str, ...]  # names of the JIT toolchains that apply
    reasons: tuple[str, ...]
    sources: tuple[str, ...]
    unconfirmed: tuple[str, ...]
    payload_requirements: tuple[str, ...] = ()  # e.g. "cuda-toolkit[cccl,crt,nvcc,nvvm]"
    cuda_home: str = ""  # "" when nothing needs nvcc
    compiles: tuple[str, ...] = ()  # what serving compiles at start, one line per toolchain
    origins: tuple[str, ...] = ()  # where each applying toolchain's compiler comes from


class PayloadToolchainUnavailable(ValueError):
    """A payload toolchain row applies to a stack whose CUDA wheels form no toolkit tree."""


# A flavor that carries more: a plan picks the richest flavor any applying toolchain needs.
_FLAVOR_RANK = {"base": 0, "runtime": 1, "devel": 2}


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
        if source == "image" and flavor not in _FLAVOR_RANK:
            raise ValueError(f"{where}: runtime_flavor must be one of {sorted(_FLAVOR_RANK)}")
        if source == "payload" and (flavor or not row.get("payload_requirements")):
            raise ValueError(f"{where}: jit_toolchains {row['name']}: a payload toolchain names "
                             "payload_requirements and no runtime_flavor")
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
            confirmed=row.get("confirmed") is True))
    return tuple(out)


def runtime_plan(profile: Any, *, backend_version: str, compute_capability: str,
                 kv_cache_dtype: str, precision: str, cuda_major: str) -> RuntimePlan:
    """The runtime stage for ``profile`` (a :class:`imgfab.compat.BackendProfile`) on one GPU.

    Raises :class:`PayloadToolchainUnavailable` when a payload toolchain applies to a stack
    of a CUDA major whose wheels form no toolkit tree (:data:`PAYLOAD_TREE_MAJORS`).
    """
    flavor = profile.runtime_flavor
    packages = set(profile.runtime_packages)
    toolchain = set(profile.runtime_toolchain)
    requirements: set[str] = set()
    applying = [j for j in profile.jit_toolchains
                if j.applies(backend_version, compute_capability, kv_cache_dtype, precision)]
    cuda_home = ""
    for jit in applying:
        if jit.toolchain == "payload":
            if cuda_major not in PAYLOAD_TREE_MAJORS:
                raise PayloadToolchainUnavailable(
                    f"{jit.name} takes nvcc from the payload's CUDA wheels, which form one "
                    f"toolkit tree only for CUDA {', '.join(PAYLOAD_TREE_MAJORS)}; this stack "
                    f"is CUDA {cuda_major}")
            requirements.update(jit.payload_requirements)
            cuda_home = cuda_home or PAYLOAD_CUDA_HOME
        elif _FLAVOR_RANK[jit.runtime_flavor] > _FLAVOR_RANK.get(flavor, 0):
            flavor = jit.runtime_flavor
        packages.update(jit.runtime_packages)
        toolchain.update(jit.runtime_toolchain)
    if "nvcc" in toolchain and not cuda_home:
        cuda_home = IMAGE_CUDA_HOME
    return RuntimePlan(
        flavor=flavor, packages=tuple(sorted(packages)), toolchain=tuple(sorted(toolchain)),
        jit=tuple(j.name for j in applying), reasons=tuple(j.reason for j in applying),
        sources=tuple(sorted({j.source for j in applying})),
        unconfirmed=tuple(f"backends {profile.backend} jit {j.name}: {j.reason}"
                          for j in applying if not j.confirmed),
        payload_requirements=tuple(sorted(requirements)), cuda_home=cuda_home,
        compiles=tuple(f"{j.name}: {j.compiles}" for j in applying),
        origins=tuple(f"nvcc from the payload's CUDA wheels, CUDA_HOME={PAYLOAD_CUDA_HOME}"
                      if j.toolchain == "payload" else f"nvidia/cuda {j.runtime_flavor}"
                      for j in applying))
