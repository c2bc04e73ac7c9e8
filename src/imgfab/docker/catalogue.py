"""The paths verify looks for in every layer: build-only tools by the name a backend declares
(compat/backends.yaml runtime_toolchain), what is never allowed (caches, the builder's own
inputs), what the payload brings itself (reported, not failed), and the payload toolkit a
CUDA_HOME view points at. One regular expression of all of them selects what a layer scan keeps.
"""

from __future__ import annotations

import re



# Build-only tools by the name a backend declares in `runtime_toolchain`, and the paths
# (relative, as in a layer tar) that betray them. How obtained: the file lists of the Debian
# bookworm / Ubuntu 24.04 packages (`dpkg -L gcc-12 g++-12 cmake git make ninja-build
# libc6-dev python3.11-dev`), the NVIDIA CUDA -devel images (`/usr/local/cuda-X.Y/bin/nvcc`)
# and the PyPI wheels that ship the same tools as console scripts (cmake, ninja).
# A declared name allows exactly its own patterns: vLLM declares gcc (the C compiler, not
# g++), TensorRT-LLM declares nvcc (which brings the CUDA toolkit tree with it).
TOOL_PATHS: dict[str, tuple[str, ...]] = {
    "cmake": (r"usr/(local/)?bin/cmake", r"opt/venv/bin/cmake"),
    "g++": (r"usr/(local/)?bin/(g\+\+|c\+\+)(-[0-9.]+)?", r"usr/bin/x86_64-linux-gnu-g\+\+(-[0-9.]+)?",
            r"usr/bin/aarch64-linux-gnu-g\+\+(-[0-9.]+)?"),
    "gcc": (r"usr/(local/)?bin/(gcc|cc)(-[0-9.]+)?", r"usr/bin/x86_64-linux-gnu-gcc(-[0-9.]+)?",
            r"usr/bin/aarch64-linux-gnu-gcc(-[0-9.]+)?"),
    "git": (r"usr/(local/)?bin/git",),
    "libc6-dev": (r"usr/include/stdio\.h",),
    "make": (r"usr/(local/)?bin/make",),
    # The OS ninja-build package. A `ninja` console script inside /opt/venv is a Python
    # dependency of the backend's own wheels (vLLM requires ninja for JIT builds): payload,
    # not a build leftover, so it is reported as a note, not a failure.
    "ninja": (r"usr/(local/)?bin/ninja",),
    "nvcc": (r"usr/local/cuda[^/]*/bin/nvcc", r"usr/bin/nvcc"),
    "python3-dev": (r"usr/include/python3[0-9.]*/Python\.h",),
}


# Never allowed, whatever the backend declares: caches and the builder's own inputs.
ALWAYS_FORBIDDEN: dict[str, tuple[str, ...]] = {
    "apt cache": (r"var/cache/apt/archives/[^/]+\.deb",),
    "pip cache": (r"root/\.cache/pip/.+", r"home/[^/]+/\.cache/pip/.+"),
    "builder requirements": (r"opt/imgfab/requirements\.(txt|lock)",),
}


# The payload's own CUDA toolkit tree (CUDA 13 wheels: site-packages/nvidia/cuNN), which a
# payload toolchain's CUDA_HOME view points at (compat/backends.yaml toolchain: payload).
_PAYLOAD_TREE = r"opt/venv/lib/python3[0-9.]*/site-packages/nvidia/cu[0-9]+"


PAYLOAD_TOOLKIT: dict[str, str] = {
    "nvcc": _PAYLOAD_TREE + r"/bin/nvcc",
    "cicc": _PAYLOAD_TREE + r"/nvvm/bin/cicc",
    "cuda_runtime.h": _PAYLOAD_TREE + r"/include/cuda_runtime\.h",
    # FlashInfer's sampling kernels include cuRAND's device API (nvidia-curand, a torch wheel)
    "curand_kernel.h": _PAYLOAD_TREE + r"/include/curand_kernel\.h",
    "libcudart": _PAYLOAD_TREE + r"/lib/libcudart\.so\.[0-9]+",
}


# A payload-brought tool is the backend's own dependency (vLLM requires ninja; vLLM 0.22+
# installs nvcc through humming-kernels[cu13]): reported, not a build leftover.
NOTE_ONLY: dict[str, tuple[str, ...]] = {"ninja (Python wheel)": (r"opt/venv/bin/ninja",),
                                         "nvcc (Python wheel)": (PAYLOAD_TOOLKIT["nvcc"],)}


_ALL_PATTERNS = re.compile("|".join(f"(?:{p})" for pats in
                                    (*TOOL_PATHS.values(), *ALWAYS_FORBIDDEN.values(),
                                     *NOTE_ONLY.values(), tuple(PAYLOAD_TOOLKIT.values()))
                                    for p in pats))
