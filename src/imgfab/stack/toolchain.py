"""Which run-time toolchain a runtime image carries: per backend release, GPU and precision.

Serving JIT-compiles some kernels on its first start: Triton's launcher stub (a C compiler and
``Python.h``) for every vLLM image, FlashInfer's kernels (``nvcc``, ``g++``, the CUDA headers)
where vLLM's sampler or attention backend lands on FlashInfer. A toolchain row with
``aot_specs`` is compiled by the builder instead, for the recipe's GPU alone, into FlashInfer's
AOT layout: its compilers stay in the builder and the runtime disables FlashInfer's JIT. ``compat/backends.yaml``
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

from imgfab.matrix.toolchains import FLAVOR_RANK, JitToolchain

__all__ = ["JitToolchain", "PayloadToolchainUnavailable", "RuntimePlan", "runtime_plan",
           "PAYLOAD_CUDA_HOME", "IMAGE_CUDA_HOME", "PAYLOAD_TREE_MAJORS"]

# Where the runtime stage builds its view of the payload's CUDA toolkit (bin, include, nvvm,
# lib64 with the unversioned libcudart.so and a libcuda.so link stub): FlashInfer's JIT reads
# $CUDA_HOME/bin/nvcc, $CUDA_HOME/include and links -L$CUDA_HOME/lib64{,/stubs} -lcudart -lcuda.
PAYLOAD_CUDA_HOME = "/opt/imgfab/cuda"
# The -devel images' toolkit (nvcc, headers, stubs), where an image row's compiler lives.
IMAGE_CUDA_HOME = "/usr/local/cuda"
# CUDA majors whose wheels install one toolkit tree (site-packages/nvidia/cu13/{bin,include,lib,
# nvvm}); CUDA 12's wheels use one directory per component, so no view of them is made here.
PAYLOAD_TREE_MAJORS = ("13",)


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
    cuda_home: str = ""  # "" when nothing needs nvcc at run time
    compiles: tuple[str, ...] = ()  # what serving compiles at start, one line per toolchain
    origins: tuple[str, ...] = ()  # where each applying toolchain's compiler comes from
    # compiled ahead of time by the builder (compat/backends.yaml aot_specs): the specs, and
    # "name: what" per toolchain; their compilers stay in the builder
    aot_specs: tuple[str, ...] = ()
    aot: tuple[str, ...] = ()


class PayloadToolchainUnavailable(ValueError):
    """A payload toolchain row applies to a stack whose CUDA wheels form no toolkit tree."""


def runtime_plan(profile: Any, *, backend_version: str, compute_capability: str,
                 kv_cache_dtype: str, precision: str, cuda_major: str) -> RuntimePlan:
    """The runtime stage for ``profile`` (a :class:`imgfab.matrix.compat.BackendProfile`) on one GPU.

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
    ahead = [j for j in applying if j.aot_specs]
    for jit in ahead:  # the builder compiles them with the payload's nvcc: the wheels stay locked
        if cuda_major not in PAYLOAD_TREE_MAJORS:
            raise PayloadToolchainUnavailable(
                f"{jit.name} is compiled ahead of time with the payload's nvcc, whose CUDA wheels "
                f"form one toolkit tree only for CUDA {', '.join(PAYLOAD_TREE_MAJORS)}; this stack "
                f"is CUDA {cuda_major}")
        requirements.update(jit.payload_requirements)
    applying = [j for j in applying if not j.aot_specs]
    for jit in applying:
        if jit.toolchain == "payload":
            if cuda_major not in PAYLOAD_TREE_MAJORS:
                raise PayloadToolchainUnavailable(
                    f"{jit.name} takes nvcc from the payload's CUDA wheels, which form one "
                    f"toolkit tree only for CUDA {', '.join(PAYLOAD_TREE_MAJORS)}; this stack "
                    f"is CUDA {cuda_major}")
            requirements.update(jit.payload_requirements)
            cuda_home = cuda_home or PAYLOAD_CUDA_HOME
        elif FLAVOR_RANK[jit.runtime_flavor] > FLAVOR_RANK.get(flavor, 0):
            flavor = jit.runtime_flavor
        packages.update(jit.runtime_packages)
        toolchain.update(jit.runtime_toolchain)
    if "nvcc" in toolchain and not cuda_home:
        cuda_home = IMAGE_CUDA_HOME
    return RuntimePlan(
        flavor=flavor, packages=tuple(sorted(packages)), toolchain=tuple(sorted(toolchain)),
        jit=tuple(j.name for j in applying), reasons=tuple(j.reason for j in applying),
        sources=tuple(sorted({j.source for j in applying + ahead} | {j.aot_source for j in ahead})),
        unconfirmed=tuple(f"backends {profile.backend} jit {j.name}: {j.reason}"
                          for j in applying + ahead if not j.confirmed),
        payload_requirements=tuple(sorted(requirements)), cuda_home=cuda_home,
        compiles=tuple(f"{j.name}: {j.compiles}" for j in applying),
        origins=tuple(f"nvcc from the payload's CUDA wheels, CUDA_HOME={PAYLOAD_CUDA_HOME}"
                      if j.toolchain == "payload" else f"nvidia/cuda {j.runtime_flavor}"
                      for j in applying),
        aot_specs=tuple(sorted({spec for j in ahead for spec in j.aot_specs})),
        aot=tuple(f"{j.name} ({j.compiles.split(', at ')[0]})" for j in ahead))
