"""What each golden context is there to pin, written out by hand (hpccm's building-block tests
show the style: an exact fragment, ``assert 'USER 1000:1000' in dockerfile``).

The golden files are compared exactly (tests/render/test_render.py), but update mode rewrites
them from the render: a change that drops a fact from the render would bless itself there. Each
fact here is decided from the recipe (recipes/*.yaml) and the domain, not read back from the
render, and is checked twice: in the render and in the committed golden text, so a regenerated
golden that lost one fails here even after update mode wrote it.

Facts the goldens hold that are left unpinned on purpose, because they are doubtful, are named
where they would be (``not pinned:``).
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import REPO
from test_render import _render, _render_fake_index

sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from fake_index_lock import INDEX_URL, LOCK as FAKE_INDEX_LOCK, RECIPE as FAKE_INDEX_RECIPE  # noqa: E402

FAKE = "mistral-7b-a100-trtllm@fake-index"

_HEALTHCHECK = ('HEALTHCHECK --interval=30s --timeout=5s --start-period=900s --retries=3 \\\n'
                '    CMD ["python3", "-c", "import urllib.request; '
                "urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)\"]\n")
_USER = "\nUSER 10001:10001\n"  # image.uid's default: never root
_UNLOCKED = "# not locked: run `imgfab lock RECIPE`; uv --require-hashes refuses this file\n"
# Every example publishes its port on the loopback address (serve.publish_address's default),
# HOST_ADDR over it (issue 34).
_PUBLISH = '--publish "${HOST_ADDR:-127.0.0.1}:${HOST_PORT:-8000}:8000"'
_PORTS = '- "${HOST_ADDR:-127.0.0.1}:${HOST_PORT:-8000}:8000"'
_API_KEY_MOUNT = '--mount "type=bind,source=${API_KEY_FILE},target=/run/secrets/imgfab-api-key,readonly"'
_NO_SA_TOKEN = "automountServiceAccountToken: false\n"  # no pod calls the Kubernetes API
# Fail closed: a vLLM image starts without its key file only where the run opts out; the
# TensorRT-LLM examples opt out in the recipe (trtllm-serve checks no key), which the label shows.
_KEYED = ['org.imgfab.serve.unauthenticated="false"', 'org.imgfab.serve.metrics_unauthenticated="false"']
_OPTED_OUT = ['org.imgfab.serve.unauthenticated="true"']
_VLLM_FAILS_CLOSED = ['export IMGFAB_ALLOW_UNAUTHENTICATED="${IMGFAB_ALLOW_UNAUTHENTICATED:-0}"\n',
                      'if [ "$#" -eq 0 ] && [ ! -e "$api_key_file" ]; then\n',
                      'export IMGFAB_API_KEY_FILE="$api_key_file"\n']
_TRTLLM_OPTS_OUT = ['export IMGFAB_ALLOW_UNAUTHENTICATED="${IMGFAB_ALLOW_UNAUTHENTICATED:-1}"\n',
                    'if [ "$#" -eq 0 ]; then\n']
# vLLM's --api-key guards /v1 only: every server command loads the in-image gate.
_GATE = "--middleware imgfab.in_image.gate.ApiKeyGate"

# name -> file -> fragments that must be in it. Versions are the full CUDA patch release the
# matrix resolves; driver floors: CUDA 12.x minor-version compatibility 525.60.13, CUDA 13.x 580,
# a strict floor the toolkit's own (12.8 update 1: 570.124.06; 13.0 torch's 13.0.2: 580.95.05).
# Not pinned: the driver.strict_floor label (issue 31 decides whether it stays: check_driver
# ignores it). k8s asks 4 CPUs and 16Gi of host memory per GPU plus the shm volume.
PINNED: dict[str, dict[str, list[str]]] = {
    # The demo (issue 34): the R535 fleet under forward-compat, vLLM 0.33.0 on torch 2.14.0 (CUDA
    # 13.0.3), outside every critical advisory (minor-compat reached only 0.19.1, inside the
    # critical API-key bypass CVE-2026-48746, fixed in 0.22.0): the R535 branch runs CUDA 13
    # through the image's cuda-compat package, kept; the runtime guard is 11.0 (the branch check
    # is the guard).
    "qwen2-7b-h100": {
        "Dockerfile": [
            *_KEYED,
            "ARG BUILDER_IMAGE=nvidia/cuda:13.0.3-devel-ubuntu24.04\n",
            "ARG RUNTIME_IMAGE=nvidia/cuda:13.0.3-base-ubuntu24.04\n",  # vLLM's wheels bring CUDA
            _USER, _HEALTHCHECK, "EXPOSE 8000\n", 'ENV IMGFAB_PRESET="chat"\n',
            'NVIDIA_REQUIRE_CUDA="cuda>=11.0"', 'VOLUME ["/models/qwen2-7b"]\n',
            'org.imgfab.backend.version="0.33.0"', 'org.imgfab.torch="2.14.0"', 'org.imgfab.cuda="13.0.3"',
            'org.imgfab.driver.floor="535"', 'org.imgfab.driver.policy="forward-compat"',
            'org.imgfab.advisories.accepted=""',  # nothing accepted: it is inside no critical advisory
            'org.imgfab.gpu="H100-SXM"', 'org.imgfab.gpu.cc="9.0"', 'org.imgfab.arch.exact="false"',
            'org.imgfab.precision="fp8"', 'org.imgfab.kv_cache_dtype="fp8"',
            'org.imgfab.tp="1"', 'org.imgfab.shm.min_bytes="17179869184"',  # 16 GiB
            'org.imgfab.model.revision="f2826a00ceef68f0f2b946d945ecc0477ce4450c"',
            'org.opencontainers.image.licenses="Apache-2.0"',
            # vLLM 0.24+ samples with FlashInfer on 8.0-12.1: its kernels compiled by the builder
            # for 9.0 alone (issue 33), the runtime's JIT off
            "FLASHINFER_CUDA_ARCH_LIST=9.0 \\\n", "    FLASHINFER_DISABLE_JIT=1 \\\n", 'org.imgfab.jit="" \\\n',
        ],
        "image.json": ['"org.imgfab.driver.floor": "535"', '"org.imgfab.gpu.cc": "9.0"'],
        "requirements.lock": ["torch==2.14.0 \\\n    --hash=sha256:", "vllm==0.33.0 \\\n    --hash=sha256:"],
        "k8s.yaml": [_NO_SA_TOKEN, 'limits: {"memory": "32Gi", "nvidia.com/gpu": "1"}', 'requests: {"cpu": "4", "memory": "32Gi"}',
                     'medium: "Memory"\n            sizeLimit: "16Gi"', "runAsUser: 10001\n",
                     '{"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": ["534"]}',
                     # rendered without a registry: a name no registry serves (issue 34)
                     'image: "REGISTRY.invalid/llm/qwen2-7b:vllm0.33.0-cu13.0.3-sm90-fp8-'],
        # not pinned: the k8s gpu.memory floor (the fit counts every weight at 1 byte, but
        # online FP8 leaves the embeddings and lm_head in bf16), the archs label (which the
        # lock's cubin cuts decide) and the publish address: the loopback address (serve.publish_address's default).
        "compose.yaml": ['shm_size: "16g"', "count: 1\n", _PORTS, 'target: "imgfab-api-key"', 'pull_policy: "never"'],
        "run.sh": ["--gpus count=1\n", "--shm-size 16g\n", _PUBLISH, _API_KEY_MOUNT, '--pull "$pull"\n',
                   '--mount "type=bind,source=${WEIGHTS_DIR},target=/models/qwen2-7b,readonly"'],
        "entrypoint.sh": _VLLM_FAILS_CLOSED,
    },
    "qwen2-7b-h200": {
        "Dockerfile": [
            *_KEYED,
            "ARG BUILDER_IMAGE=nvidia/cuda:13.0.3-devel-ubuntu24.04\n",
            "ARG RUNTIME_IMAGE=nvidia/cuda:13.0.3-base-ubuntu24.04\n",
            _USER, _HEALTHCHECK, "EXPOSE 8000\n", 'ENV IMGFAB_PRESET="chat"\n',
            'NVIDIA_REQUIRE_CUDA="cuda>=13.0"', 'VOLUME ["/models/qwen2-7b"]\n',
            'org.imgfab.backend.version="0.26.0"', 'org.imgfab.torch="2.11.0"', 'org.imgfab.cuda="13.0.3"',
            'org.imgfab.driver.floor="580.95.05"', 'org.imgfab.driver.policy="strict"',
            'org.imgfab.gpu="H200"', 'org.imgfab.gpu.cc="9.0"',
            'org.imgfab.archs="7.5,8.0,8.6,8.9,9.0,10.0,12.0"', 'org.imgfab.arch.exact="false"',
            'org.imgfab.precision="bf16"', 'org.imgfab.tp="1"',
            # FlashInfer's sampler: compiled by the builder for the H200's 9.0 alone with the
            # payload's nvcc (issue 33); the runtime loads it, compiles nothing of FlashInfer and
            # carries neither g++ nor a CUDA_HOME view; Triton's driver helper and the 18 launcher
            # stubs compat/triton_launchers.yaml measured for vLLM 0.26.0 are compiled there too,
            # so the runtime carries no C compiler and no headers
            "FROM builder AS kernels\n", "FLASHINFER_CUDA_ARCH_LIST=9.0 \\\n", 'test -x "$tree/bin/nvcc"',
            "COPY --link --from=kernels /opt/imgfab/layers/kernels/ /\n", "    FLASHINFER_DISABLE_JIT=1 \\\n",
            'org.imgfab.jit="" \\\n', 'org.imgfab.kernels.arch="9.0"',
            "COPY imgfab-kernels.py imgfab-triton-launchers.json /opt/imgfab/\n",
            "       --triton /opt/imgfab/triton-seed /opt/imgfab/imgfab-triton-launchers.json\n",
            "apt-get install -y --no-install-recommends python3 python3-venv \\\n",
            'org.imgfab.toolchain="" \\\n', 'org.imgfab.kernels.triton="18 launchers, Triton 3.6.0" \\\n',
        ],
        "image.json": ['"org.imgfab.driver.floor": "580.95.05"', '"org.imgfab.jit": ""',
                       '"org.imgfab.kernels.arch": "9.0"'],
        "requirements.lock": ["torch==2.11.0 \\\n    --hash=sha256:", "vllm==0.26.0 \\\n    --hash=sha256:"],
        "k8s.yaml": [_NO_SA_TOKEN, 'limits: {"memory": "32Gi", "nvidia.com/gpu": "1"}', 'requests: {"cpu": "4", "memory": "32Gi"}',
                     'medium: "Memory"\n            sizeLimit: "16Gi"', "runAsUser: 10001\n",
                     '{"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": ["580"]}',
                     '{"key": "nvidia.com/cuda.driver.minor", "operator": "Gt", "values": ["95"]}',
                     # bf16 weights 15.2 GB + an 8192-token KV cache 0.47 GB, over 0.9: 16638 MiB
                     '{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["16637"]}'],
        # vLLM 0.26.0 is past the API-key bypass (fixed in 0.22.0), yet published on the
        # loopback address too: the recipe names no other (serve.publish_address)
        "compose.yaml": ['shm_size: "16g"', "count: 1\n", _PORTS, 'target: "imgfab-api-key"'],
        "run.sh": ["--gpus count=1\n", "--shm-size 16g\n", _PUBLISH, _API_KEY_MOUNT],
        # the builder's Triton cache is copied into TRITON_CACHE_DIR before serving starts
        "entrypoint.sh": _VLLM_FAILS_CLOSED + ["if [ -d /opt/imgfab/triton-seed ]; then\n"],
    },
    # The newest stack (issue 32): backend.version unpinned, so the newest vLLM the matrix holds,
    # vLLM 0.33.0 on torch 2.14.0 (CUDA runtime 13.0.3, whose strict floor is 13.0.2's 580.95.05);
    # its payload installs only with the cuda-python family bounded to CUDA 13 (the lock says so).
    "qwen2-7b-b200": {
        "Dockerfile": [
            *_KEYED,
            "ARG BUILDER_IMAGE=nvidia/cuda:13.0.3-devel-ubuntu24.04\n",
            "ARG RUNTIME_IMAGE=nvidia/cuda:13.0.3-base-ubuntu24.04\n",
            _USER, _HEALTHCHECK, "EXPOSE 8000\n", 'ENV IMGFAB_PRESET="chat"\n',
            'NVIDIA_REQUIRE_CUDA="cuda>=13.0"', 'VOLUME ["/models/qwen2-7b"]\n',
            'org.imgfab.backend.version="0.33.0"', 'org.imgfab.torch="2.14.0"', 'org.imgfab.cuda="13.0.3"',
            'org.imgfab.driver.floor="580.95.05"', 'org.imgfab.driver.policy="strict"',
            'org.imgfab.gpu="B200"', 'org.imgfab.gpu.cc="10.0"',
            'org.imgfab.precision="bf16"', 'org.imgfab.tp="1"',
            # vLLM 0.24+ samples with FlashInfer on 8.0-12.1: Blackwell's 10.0 too, compiled by
            # the builder for 10.0 alone
            "FLASHINFER_CUDA_ARCH_LIST=10.0 \\\n", "    FLASHINFER_DISABLE_JIT=1 \\\n",
            'org.imgfab.jit="" \\\n', 'org.imgfab.kernels.arch="10.0"',
        ],
        "requirements.lock": ["torch==2.14.0 \\\n    --hash=sha256:", "vllm==0.33.0 \\\n    --hash=sha256:",
                              # the family bounded to CUDA 13: the metapackage, never the monolith
                              "cuda-python==13.", "cuda-bindings==13."],
        "k8s.yaml": [_NO_SA_TOKEN, 'limits: {"memory": "32Gi", "nvidia.com/gpu": "1"}',
                     '{"key": "nvidia.com/gpu.compute.major", "operator": "In", "values": ["10"]}',
                     '{"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": ["580"]}',
                     # the same model and limits as the H200 recipe: 16638 MiB
                     '{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["16637"]}'],
        "compose.yaml": ['shm_size: "16g"', "count: 1\n", _PORTS, 'target: "imgfab-api-key"'],
        "run.sh": ["--gpus count=1\n", "--shm-size 16g\n", _PUBLISH, _API_KEY_MOUNT],
        "entrypoint.sh": _VLLM_FAILS_CLOSED,
    },
    # R570 reaches CUDA 12.8 at most, where strict and minor-compat give vLLM 0.19.1 (inside the
    # critical CVE-2026-48746); the L4 is a data-center GPU, so forward compatibility runs
    # vLLM 0.33.0 on CUDA 13 (issue 34), as for the demo.
    "llama31-8b-l4": {
        "Dockerfile": [
            *_KEYED,
            "ARG BUILDER_IMAGE=nvidia/cuda:13.0.3-devel-ubuntu24.04\n",
            "ARG RUNTIME_IMAGE=nvidia/cuda:13.0.3-base-ubuntu24.04\n",
            _USER, _HEALTHCHECK, "EXPOSE 8000\n", 'ENV IMGFAB_PRESET="long-context"\n',
            'NVIDIA_REQUIRE_CUDA="cuda>=11.0"', 'VOLUME ["/models/llama3.1-8b"]\n',
            'org.imgfab.backend.version="0.33.0"', 'org.imgfab.torch="2.14.0"', 'org.imgfab.cuda="13.0.3"',
            'org.imgfab.driver.floor="535"', 'org.imgfab.driver.policy="forward-compat"',
            'org.imgfab.advisories.accepted=""',
            'org.imgfab.gpu="L4"', 'org.imgfab.gpu.cc="8.9"', 'org.imgfab.precision="bf16"',
            'org.imgfab.shm.min_bytes="8589934592"',  # 8 GiB
            'org.opencontainers.image.licenses="LicenseRef-llama3.1"',
            "FLASHINFER_CUDA_ARCH_LIST=8.9 \\", "    FLASHINFER_DISABLE_JIT=1 \\", 'org.imgfab.jit="" \\',
        ],
        "image.json": ['"org.imgfab.driver.floor": "535"', '"org.imgfab.gpu.cc": "8.9"'],
        "requirements.lock": ["torch==2.14.0 \\\n    --hash=sha256:", "vllm==0.33.0 \\\n    --hash=sha256:"],
        "k8s.yaml": [_NO_SA_TOKEN, 'limits: {"memory": "24Gi", "nvidia.com/gpu": "1"}', 'requests: {"cpu": "4", "memory": "24Gi"}',
                     'medium: "Memory"\n            sizeLimit: "8Gi"', "runAsUser: 10001\n",
                     '{"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": ["534"]}',
                     # bf16 weights 16.1 GB + a 16384-token KV cache 2 GiB, over 0.92: 18875 MiB
                     '{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["18874"]}'],
        # the loopback address (serve.publish_address's default)
        "compose.yaml": ['shm_size: "8g"', "count: 1\n", _PORTS, 'target: "imgfab-api-key"'],
        "run.sh": ["--gpus count=1\n", "--shm-size 8g\n", _PUBLISH, _API_KEY_MOUNT,
                   '--mount "type=bind,source=${WEIGHTS_DIR},target=/models/llama3.1-8b,readonly"'],
        "entrypoint.sh": _VLLM_FAILS_CLOSED,
    },
    "mistral-7b-a100-trtllm": {
        "Dockerfile": [
            *_OPTED_OUT,
            "ARG BUILDER_IMAGE=nvidia/cuda:13.1.2-devel-ubuntu24.04\n",
            # TensorRT-LLM compiles kernels at run time: the runtime is the devel image, with nvcc
            "ARG RUNTIME_IMAGE=nvidia/cuda:13.1.2-devel-ubuntu24.04\n", "CUDA_HOME=/usr/local/cuda \\\n",
            "libopenmpi-dev",  # TensorRT-LLM's MPI, in the builder and the runtime
            _USER, _HEALTHCHECK, "EXPOSE 8000\n", 'ENV IMGFAB_PRESET="chat"\n',
            'NVIDIA_REQUIRE_CUDA="cuda>=13.0"', 'VOLUME ["/models/mistral-7b"]\n',
            'org.imgfab.backend="tensorrt-llm"', 'org.imgfab.backend.path="pytorch"',
            'org.imgfab.backend.version="1.2.1"', 'org.imgfab.torch="2.9.1+cu130"', 'org.imgfab.cuda="13.1.2"',
            'org.imgfab.driver.floor="580"', 'org.imgfab.driver.policy="minor-compat"',
            'org.imgfab.gpu="A100-80GB"', 'org.imgfab.gpu.cc="8.0"', 'org.imgfab.precision="bf16"',
            'org.imgfab.tp="2"', 'org.imgfab.shm.min_bytes="34359738368"',  # 32 GiB
            # not pinned: org.imgfab.archs="" (the matrix has no confirmed kernel list for
            # TensorRT-LLM 1.2.1, so neither the probe nor select checks the GPU's architecture)
            # and org.imgfab.tensorrt="~=10.14.1" (a range, where the lock pins 10.14.1.48.post1).
        ],
        "image.json": ['"org.imgfab.driver.floor": "580"', '"org.imgfab.tp": "2"'],
        "requirements.lock": [_UNLOCKED],  # NVIDIA's index does not answer here: not buildable
        "installer.lock": ["# no installer pinned: not locked\n"],
        "k8s.yaml": [_NO_SA_TOKEN, 'limits: {"memory": "64Gi", "nvidia.com/gpu": "2"}', 'requests: {"cpu": "8", "memory": "64Gi"}',
                     'medium: "Memory"\n            sizeLimit: "32Gi"', "runAsUser: 10001\n",
                     '{"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": ["579"]}',
                     '{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["1"]}',
                     # bf16 weights 14.5 GB + an 8192-token KV cache 1 GiB over 2 GPUs, over 0.9
                     '{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["8249"]}'],
        "compose.yaml": ['shm_size: "32g"', "count: 2\n", _PORTS],
        "run.sh": ["--gpus count=2\n", "--shm-size 32g\n", _PUBLISH,
                   '--mount "type=bind,source=${WEIGHTS_DIR},target=/models/mistral-7b,readonly"'],
        "entrypoint.sh": _TRTLLM_OPTS_OUT,
    },
    "llama31-8b-h100-fp8-engine": {
        "Dockerfile": [
            *_OPTED_OUT,
            "ARG BUILDER_IMAGE=nvidia/cuda:13.1.2-devel-ubuntu24.04\n",
            "ARG RUNTIME_IMAGE=nvidia/cuda:13.1.2-devel-ubuntu24.04\n",
            _USER, _HEALTHCHECK, "EXPOSE 8000\n", 'NVIDIA_REQUIRE_CUDA="cuda>=13.0"',
            'VOLUME ["/models/llama3.1-8b"]\n', 'VOLUME ["/var/cache/imgfab/engines"]\n',
            'org.imgfab.backend.path="engine"', 'org.imgfab.driver.floor="580"',
            'org.imgfab.gpu="H100-SXM"', 'org.imgfab.gpu.cc="9.0"',
            # a TensorRT engine runs on the architecture it was compiled for and no other
            'org.imgfab.archs="9.0"', 'org.imgfab.arch.exact="true"', 'org.imgfab.engine.cc="9.0"',
            'org.imgfab.precision="fp8"', 'org.imgfab.kv_cache_dtype="fp8"', 'org.imgfab.precision.min_cc="8.9"',
            'org.imgfab.engine.tensorrt="10.14.1.48.post1"', 'org.imgfab.engine.tensorrt_llm="1.2.1"',
            'org.imgfab.engine.max_batch_size="64"', 'org.imgfab.engine.max_input_len="4096"',
            'org.imgfab.engine.max_seq_len="8192"', 'org.imgfab.engine.max_num_tokens="8192"',
            'org.imgfab.engine.strategy="two-phase"', 'org.imgfab.engine.strip_plan="true"',
        ],
        "imgfab-compile.sh": ["--dtype bfloat16 --qformat fp8 ", "--kv_cache_dtype fp8 ",
                              "--calib_dataset /run/imgfab/calibration --calib_size 512)",
                              "--max_batch_size 64 --max_input_len 4096 --max_seq_len 8192 --max_num_tokens 8192 ",
                              "--strip_plan)"],
        "requirements.lock": [_UNLOCKED],
        # not pinned: the k8s gpu.memory floor (FP8 leaves the embeddings and lm_head in bf16,
        # which the fit counts at 1 byte a weight).
        "k8s.yaml": [_NO_SA_TOKEN, 'limits: {"memory": "32Gi", "nvidia.com/gpu": "1"}', 'medium: "Memory"\n            sizeLimit: "16Gi"',
                     '{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}',
                     '{"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": ["579"]}',
                     'claimName: "llama31-8b-h100-fp8-engine-engines"'],
        "compose.yaml": ['shm_size: "16g"', "count: 1\n", _PORTS],
        "run.sh": ["--gpus count=1\n", "--shm-size 16g\n", _PUBLISH,
                   "target=/var/cache/imgfab/engines\""],
        "entrypoint.sh": _TRTLLM_OPTS_OUT,
    },
    "qwen2-7b-l40s-awq-engine": {
        "Dockerfile": [
            *_OPTED_OUT,
            "ARG BUILDER_IMAGE=nvidia/cuda:13.1.2-devel-ubuntu24.04\n",
            "ARG RUNTIME_IMAGE=nvidia/cuda:13.1.2-devel-ubuntu24.04\n",
            _USER, _HEALTHCHECK, "EXPOSE 8000\n", 'NVIDIA_REQUIRE_CUDA="cuda>=13.0"',
            'VOLUME ["/models/qwen2-7b"]\n', 'VOLUME ["/var/cache/imgfab/engines"]\n',
            'org.imgfab.backend.path="engine"', 'org.imgfab.driver.floor="580"',
            'org.imgfab.gpu="L40S"', 'org.imgfab.gpu.cc="8.9"',
            'org.imgfab.archs="8.9"', 'org.imgfab.arch.exact="true"', 'org.imgfab.engine.cc="8.9"',
            # INT4-AWQ: Ampere to Hopper in TensorRT-LLM's hardware matrix
            'org.imgfab.precision="int4_awq"', 'org.imgfab.precision.min_cc="8.0"', 'org.imgfab.precision.max_cc="9.0"',
            'org.imgfab.engine.max_batch_size="32"', 'org.imgfab.engine.max_input_len="2048"',
            'org.imgfab.engine.max_seq_len="4096"', 'org.imgfab.engine.strategy="two-phase"',
        ],
        "imgfab-compile.sh": ["--dtype float16 --qformat int4_awq ",
                              "--calib_dataset /run/imgfab/calibration --calib_size 256)",
                              "--max_batch_size 32 --max_input_len 2048 --max_seq_len 4096 ", "--strip_plan)"],
        "requirements.lock": [_UNLOCKED],
        # not pinned: the k8s gpu.memory floor (INT4-AWQ checkpoints keep the embeddings and
        # lm_head in fp16, about 2 GB for Qwen2-7B, which the fit counts at half a byte a weight).
        "k8s.yaml": [_NO_SA_TOKEN, 'limits: {"memory": "32Gi", "nvidia.com/gpu": "1"}', 'medium: "Memory"\n            sizeLimit: "16Gi"',
                     '{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L40S"]}',
                     'claimName: "qwen2-7b-l40s-awq-engine-engines"'],
        "compose.yaml": ['shm_size: "16g"', "count: 1\n", _PORTS],
        "run.sh": ["--gpus count=1\n", "--shm-size 16g\n", _PUBLISH,
                   "target=/var/cache/imgfab/engines\""],
        "entrypoint.sh": _TRTLLM_OPTS_OUT,
    },
}
# The buildable TensorRT-LLM context: the same recipe and facts, locked (real hashes, the
# installer compat/payload.yaml pins, one COPY per layer group of the lock). Not pinned: its
# netenv.sh default index, https://download.pytorch.org/whl/cu130 (Lock.builder_index: the first
# of the three indexes the lock's names come from, which serves neither tensorrt-llm nor the PyPI
# names), so it builds only with --pip-index-url naming one index that serves them all.
PINNED[FAKE] = {
    **PINNED["mistral-7b-a100-trtllm"],
    "requirements.lock": ["tensorrt-llm==1.2.1 \\\n    --hash=sha256:", "tensorrt==10.14.1.48.post1 \\\n    --hash=sha256:",
                          "torch==2.9.1+cu130 \\\n    --hash=sha256:", "# serves: 8.0\n"],
    "installer.lock": ["uv==0.13.9 --hash=sha256:2c45530751517d6c3bbc69a19473f6effe47cce047bede01ffd8af7ea7b36b25"
                       " --hash=sha256:d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19\n"],
}
PINNED[FAKE]["Dockerfile"] = PINNED["mistral-7b-a100-trtllm"]["Dockerfile"] + [
    "COPY --link --from=builder /opt/imgfab/layers/venv/ /\n"
    "COPY --link --from=builder /opt/imgfab/layers/torch-1/ /\n"
    "COPY --link --from=builder /opt/imgfab/layers/rest-1/ /\n"
    "COPY --link --from=builder /opt/imgfab/layers/vllm-1/ /\n"]

# name -> (the recipe's default preset, the start of its server command, "flag value" pairs in
# it, flags it must not carry). vLLM takes kebab-case flags, trtllm-serve snake_case; trtllm-serve
# has no middleware option (its images start only where the recipe or the run opts out).
SERVED: dict[str, tuple[str, str, list[str], list[str]]] = {
    "qwen2-7b-h100": ("chat", "exec vllm serve /models/qwen2-7b --served-model-name qwen2-7b --host 0.0.0.0 --port 8000 ",
                      [_GATE, "--tensor-parallel-size 1", "--max-model-len 32768", "--gpu-memory-utilization 0.9",
                       "--dtype bfloat16", "--quantization fp8", "--kv-cache-dtype fp8"], []),
    "qwen2-7b-h200": ("chat", "exec vllm serve /models/qwen2-7b --served-model-name qwen2-7b --host 0.0.0.0 --port 8000 ",
                      [_GATE, "--tensor-parallel-size 1", "--max-model-len 8192", "--gpu-memory-utilization 0.9",
                       "--dtype bfloat16"], ["--quantization", "--kv-cache-dtype"]),
    "qwen2-7b-b200": ("chat", "exec vllm serve /models/qwen2-7b --served-model-name qwen2-7b --host 0.0.0.0 --port 8000 ",
                      [_GATE, "--tensor-parallel-size 1", "--max-model-len 8192", "--gpu-memory-utilization 0.9",
                       "--dtype bfloat16"], ["--quantization", "--kv-cache-dtype"]),
    "llama31-8b-l4": ("long-context", "exec vllm serve /models/llama3.1-8b --served-model-name llama3.1-8b "
                      "--host 0.0.0.0 --port 8000 ",
                      [_GATE, "--tensor-parallel-size 1", "--max-model-len 16384", "--gpu-memory-utilization 0.92",
                       "--max-num-seqs 8", "--dtype bfloat16"], ["--quantization", "--kv-cache-dtype"]),
    "mistral-7b-a100-trtllm": ("chat", "exec trtllm-serve /models/mistral-7b --host 0.0.0.0 --port 8000 --backend pytorch ",
                               ["--tp_size 2", "--pp_size 1", "--max_batch_size 128", "--max_seq_len 8192",
                                "--kv_cache_free_gpu_memory_fraction 0.9"], ["--tokenizer", "--middleware"]),
    # the engine path serves the refitted engine from the cache volume, the tokenizer from the weights
    "llama31-8b-h100-fp8-engine": ("chat", "exec trtllm-serve /var/cache/imgfab/engines/", [
        "--backend tensorrt", "--tp_size 1", "--max_batch_size 64", "--max_seq_len 8192",
        "--tokenizer /models/llama3.1-8b"], ["--middleware"]),
    "qwen2-7b-l40s-awq-engine": ("chat", "exec trtllm-serve /var/cache/imgfab/engines/", [
        "--backend tensorrt", "--tp_size 1", "--max_batch_size 32", "--max_seq_len 4096",
        "--tokenizer /models/qwen2-7b"], ["--middleware"]),
}
SERVED[FAKE] = SERVED["mistral-7b-a100-trtllm"]

# The context files a Dockerfile copies in (the sources of its COPY lines that are not
# --from a stage): the weights and the calibration prompts are never among them.
COPIED = ["engine/", "entrypoint.sh", "image.json", "imgfab-probe.sh", "imgfab/", "installer.lock",
          "netenv.sh", "requirements.lock", "imgfab-stage.py"]
COPIED_ENGINE = COPIED + ["imgfab-compile.sh", "imgfab-quantize.py"]
WEIGHTS_MOUNT = {"qwen2-7b-h100": "/models/qwen2-7b", "qwen2-7b-h200": "/models/qwen2-7b",
                 "qwen2-7b-b200": "/models/qwen2-7b",
                 "llama31-8b-l4": "/models/llama3.1-8b", "mistral-7b-a100-trtllm": "/models/mistral-7b",
                 "llama31-8b-h100-fp8-engine": "/models/llama3.1-8b",
                 "qwen2-7b-l40s-awq-engine": "/models/qwen2-7b", FAKE: "/models/mistral-7b"}
ENGINES = ("llama31-8b-h100-fp8-engine", "qwen2-7b-l40s-awq-engine")
# the recipes whose builder compiles FlashInfer's kernels (vLLM >= 0.21 on 8.0-12.1)
KERNELS = ("llama31-8b-l4", "qwen2-7b-b200", "qwen2-7b-h100", "qwen2-7b-h200")
# ... of which compat/triton_launchers.yaml measured Triton's launchers for (vLLM 0.26.0, 9.0, bf16)
TRITON_SEEDED = ("qwen2-7b-h200",)

_RENDERED: dict[str, dict[str, str]] = {}


def _files(name: str, source: str, matrix) -> dict[str, str]:
    """The context ``name`` as rendered now, or as its committed golden files hold it."""
    if source == "golden":
        golden = REPO / "tests" / "golden" / name
        return {str(p.relative_to(golden)): p.read_text() for p in golden.rglob("*") if p.is_file()}
    if name not in _RENDERED:
        _RENDERED[name] = _render_fake_index(matrix) if name == FAKE \
            else _render(REPO / "recipes" / f"{name}.yaml", matrix)
    return _RENDERED[name]


def test_every_example_recipe_has_its_facts_written_out():
    assert sorted(PINNED) == sorted([p.stem for p in (REPO / "recipes").glob("*.yaml")] + [FAKE])


@pytest.mark.parametrize("source", ["render", "golden"])
@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_fragments(name, source, matrix):
    files = _files(name, source, matrix)
    lost = [f"{file}: {fragment!r}" for file, fragments in sorted(PINNED[name].items())
            for fragment in fragments if fragment not in files.get(file, "")]
    assert not lost, f"the {source} of {name} lost what its golden pins:\n" + "\n".join(lost)


def _serve_line(entrypoint: str, preset: str) -> str:
    """The server command of ``preset`` in the entrypoint's ``case`` over IMGFAB_PRESET."""
    return entrypoint.split(f"\n    {preset})\n", 1)[1].split("\n", 1)[0].strip()


@pytest.mark.parametrize("source", ["render", "golden"])
@pytest.mark.parametrize("name", sorted(SERVED))
def test_served_flags(name, source, matrix):
    preset, command, flags, absent = SERVED[name]
    line = _serve_line(_files(name, source, matrix)["entrypoint.sh"], preset) + " "
    assert line.startswith(command), line
    assert [f for f in flags if f" {f} " not in line] == [], line
    assert [f for f in absent if f" {f} " in line or f" {f}=" in line] == [], line


@pytest.mark.parametrize("source", ["render", "golden"])
@pytest.mark.parametrize("name", sorted(WEIGHTS_MOUNT))
def test_weights_are_mounted_never_copied(name, source, matrix):
    """The weights are a VOLUME at the recipe's mount path, and nothing from the context but
    imgfab's own files (and the weight-stripped engine) is copied into the image."""
    dockerfile = _files(name, source, matrix)["Dockerfile"]
    mount = WEIGHTS_MOUNT[name]
    assert f'VOLUME ["{mount}"]\n' in dockerfile
    copied = sorted({source_path for line in dockerfile.splitlines()
                     if line.startswith(("COPY ", "ADD ")) and "--from=" not in line
                     for source_path in line.split()[1:-1]})
    kernels = (["imgfab-kernels.py"] + (["imgfab-triton-launchers.json"] if name in TRITON_SEEDED else [])
               if name in KERNELS else [])
    assert copied == sorted(COPIED_ENGINE if name in ENGINES else
                            [c for c in COPIED if c != "engine/"] + kernels)
    copies = [line for line in dockerfile.splitlines() if line.startswith(("COPY ", "ADD "))]
    assert not [line for line in copies if mount in line or "safetensors" in line or "calibration" in line]


@pytest.mark.parametrize("source", ["render", "golden"])
@pytest.mark.parametrize("name", ENGINES)
def test_an_engine_is_scheduled_on_its_own_gpu_only(name, source, matrix):
    """One node selector term (the engine's GPU product and architecture), not the list of
    architectures a pytorch-path or vLLM image accepts."""
    assert _files(name, source, matrix)["k8s.yaml"].count("- matchExpressions:") == 1


@pytest.mark.parametrize("source", ["render", "golden"])
@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_image_records_its_platform_and_every_term_its_arch(name, source, matrix):
    """Issue 35: the platform label, and kubernetes.io/arch in each node-selector term (ORed by
    Kubernetes: one term without it admits a GH200's arm64 node)."""
    files = _files(name, source, matrix)
    assert 'org.imgfab.platform="linux/amd64"' in files["Dockerfile"]
    assert '"org.imgfab.platform": "linux/amd64"' in files["image.json"]
    terms = [line.strip() for line in files["k8s.yaml"].splitlines() if "- matchExpressions:" in line]
    assert terms and all(t.startswith('- matchExpressions: [{"key": "kubernetes.io/arch", "operator": "In", '
                                      '"values": ["amd64"]}, ') for t in terms), terms


# ---------------------------------------------------------------- the fake-index lock


def _fake_wheel_hashes(tmp_path: Path) -> dict[str, str]:
    """``name -> sha256:…`` of the fake wheels an index for the recipe's pins serves."""
    from fake_payload import recipe_pins, write_index

    simple = write_index(tmp_path, recipe_pins(FAKE_INDEX_RECIPE))
    return {wheel.parent.name: "sha256:" + hashlib.sha256(wheel.read_bytes()).hexdigest()
            for wheel in simple.glob("*/*.whl")}


@pytest.mark.parametrize("source", ["render", "golden"])
def test_the_fake_index_context_installs_the_fake_index_wheels(source, matrix, tmp_path):
    """requirements.lock pins each of the recipe's three packages with exactly the hash of the
    wheel a fake index for its pins serves (fake_payload.write_index makes the same bytes every
    time), so the context builds against such an index: it is locked, not a refusal."""
    text = _files(FAKE, source, matrix)["requirements.lock"]
    pinned = dict(re.findall(r"^([a-z0-9-]+)==\S+ \\\n    --hash=(sha256:[0-9a-f]{64})$", text, re.M))
    assert pinned == _fake_wheel_hashes(tmp_path), (
        "the fake index's wheels changed: record the lock again and regenerate its golden "
        "(tests/fixtures/fake_index_lock.py says how)")
    assert "not locked" not in text and "refused" not in text and "unhashed" not in text


def test_the_fake_index_lock_is_current(matrix):
    """The recorded lock is what `imgfab lock --index-url` writes for the recipe and the matrix
    today: its fingerprint (the pins, the era bound, the platform, the index) matches, and its
    header records the fake index and no refusal."""
    from imgfab.payload.lock import check_header, payload_request
    from imgfab.payload.lockfile import Lock, lock_fingerprint
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import resolve

    recipe = load_recipe(FAKE_INDEX_RECIPE)
    stack = resolve(recipe, matrix).stack
    request = replace(payload_request(recipe, stack), indexes=(), default_index=INDEX_URL)
    text = FAKE_INDEX_LOCK.read_text()
    lock = Lock.parse(text, FAKE_INDEX_LOCK.name)
    assert lock.fingerprint == lock_fingerprint(request, text), (
        f"{FAKE_INDEX_LOCK.name} is stale: record it again (tests/fixtures/fake_index_lock.py)")
    check_header(lock, request, FAKE_INDEX_LOCK.name, str(FAKE_INDEX_RECIPE))
    assert f"# index: {INDEX_URL} (every other name" in text
    assert not lock.refused and not lock.unhashed
    assert sorted(lock.packages) == ["tensorrt", "tensorrt-llm", "torch"]


@pytest.mark.parametrize("source", ["render", "golden"])
@pytest.mark.parametrize("name", KERNELS)
def test_the_runtime_takes_no_compiler_wheels_where_the_builder_compiled_the_kernels(name, source, matrix):
    """The lock stages the cuda-toolkit[cccl,crt,nvcc,nvvm] wheels as their own group (toolkit-1):
    the kernels stage compiles with them, the runtime copies every other group and not that one."""
    files = _files(name, source, matrix)
    dockerfile = files["Dockerfile"]
    runtime = dockerfile[dockerfile.index(" AS runtime"):]
    copies = [line for line in runtime.splitlines() if "/opt/imgfab/layers/" in line]
    assert "COPY --link --from=payload /opt/imgfab/layers/vllm-1/ /" in copies
    assert not [line for line in copies if "/layers/toolkit-" in line], copies
    assert "COPY --link --from=kernels /opt/imgfab/layers/kernels/ /" in copies
