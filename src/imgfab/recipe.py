"""Recipe schema: what users write in ``recipes/*.yaml``.

:func:`load_recipe` parses and validates a file into a :class:`Recipe` or raises
:class:`~imgfab.errors.RecipeError` with one line naming the field and the fix. Unknown keys are
errors. The file is never rewritten. :func:`recipe_json_schema` exports the JSON Schema editors use.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import posixpath
import re
import stat
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from imgfab.errors import RecipeError, redact
from imgfab.in_image.rules import POLICIES, STRICT

# A value that reaches a Dockerfile, a shell script or a YAML manifest: no whitespace, quotes,
# or shell metacharacters. Hugging Face ids are "org/name" with [A-Za-z0-9._-].
# Every pattern is used with fullmatch (``$`` would let a trailing newline through) and spells
# digits [0-9] (``\d`` also matches other scripts' digits).
_HF_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
_ABS_PATH = re.compile(r"/[A-Za-z0-9._/-]{0,255}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
# An SPDX license expression without parentheses: ids (or LicenseRef-…) joined by AND/OR/WITH.
_SPDX = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,63}( (AND|OR|WITH) [A-Za-z0-9][A-Za-z0-9.+-]{0,63}){0,5}")
# A DNS-1123 label that starts with a letter: it names the container, the Kubernetes objects
# (Deployment, Service, PVC) and the build directory, and must stay a string in YAML.
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_REPOSITORY = re.compile(r"[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*")
_REGISTRY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?(:[0-9]{1,5})?")
_SIZE = re.compile(r"([0-9]{1,13})([kmgKMG]?)")
_DRIVER_SPEC = re.compile(r">=[ ]*([0-9]{1,4}(\.[0-9]{1,4}){0,2})")
# An advisory as compat/advisories.yaml names it: a CVE or a GitHub advisory id.
_ADVISORY_ID = re.compile(r"(CVE-[0-9]{4}-[0-9]{4,7}|GHSA(-[23456789cfghjmpqrvwx]{4}){3})")
# A calibration file, relative to the recipe: no leading '/', '-' or '.', no '..' component.
_RELATIVE_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9_][A-Za-z0-9._-]{0,127}){0,15}")
# Paths the image itself owns (its code, venv, user, system trees, the engine cache, build
# secrets): the weights mount must neither be one of them, nor lie under one, nor contain one.
IMAGE_OWNED_PATHS = ("/bin", "/boot", "/dev", "/etc", "/home/imgfab", "/lib", "/lib32", "/lib64",
                     "/libx32", "/opt/imgfab", "/opt/nvidia", "/opt/venv", "/proc", "/root",
                     "/run", "/sbin", "/sys", "/tmp", "/usr", "/var")
# Bounds on sizes: /dev/shm below 64 MiB cannot hold NCCL's buffers; 4 TiB is past any host.
SHM_MIN_BYTES = 64 * 1024**2
SHM_MAX_BYTES = 4 * 1024**4
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
# What load_recipe reads: a regular file of at most this many bytes, with at most this many
# YAML aliases (a "billion laughs" recipe is refused before it expands) and this nesting depth.
MAX_RECIPE_BYTES = 256 * 1024
MAX_ALIASES = 64
MAX_DEPTH = 32
# Calibration prompt files: regular files inside the recipe's directory, at most this size.
MAX_CALIBRATION_BYTES = 64 * 1024**2
_EXCERPT = 60


def excerpt(value: Any, limit: int = _EXCERPT) -> str:
    """A short ``repr`` of a user value for an error message (never the whole value)."""
    # Redacted before it is cut, so a cut never leaves a password's head behind.
    text = redact(repr(value)) if not isinstance(value, (dict, list)) else f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "…"


def normalise_mount(value: str) -> str:
    """``value`` as an absolute normalised path (``/models//x/.`` → ``/models/x``); raises
    ValueError for a path the image owns (see :data:`IMAGE_OWNED_PATHS`) or the root."""
    path = posixpath.normpath(value)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if path == "/":
        raise ValueError("must not be /")
    for owned in IMAGE_OWNED_PATHS:
        if path == owned or path.startswith(owned + "/") or owned.startswith(path + "/"):
            raise ValueError(f"{path} collides with {owned}, which the image owns; mount the "
                             "weights elsewhere, e.g. /models/<name>")
    return path


class Backend(str, Enum):
    VLLM = "vllm"
    TENSORRT_LLM = "tensorrt-llm"


class Quantization(str, Enum):
    NONE = "none"
    FP8 = "fp8"
    INT8_SQ = "int8_sq"
    INT4_AWQ = "int4_awq"
    GPTQ = "gptq"  # a GPTQ checkpoint (W4A16/W8A16): vLLM reads the method from its config
    NVFP4 = "nvfp4"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=True)


class ModelFactsSpec(_Strict):
    """What the fit check needs of the model, as its config.json and model card state them
    (``imgfab resolve --weights DIR`` reads the same facts from the weights). Each is optional;
    a check whose facts are missing is reported as not done."""

    parameters: Annotated[int, Field(ge=1, le=10**14)] | None = Field(
        None, description="Parameter count, e.g. 8030261248 for Llama-3.1-8B", examples=[8030261248])
    layers: Annotated[int, Field(ge=1, le=4096)] | None = Field(
        None, description="config.json num_hidden_layers", examples=[32])
    attention_heads: Annotated[int, Field(ge=1, le=4096)] | None = Field(
        None, description="config.json num_attention_heads", examples=[32])
    kv_heads: Annotated[int, Field(ge=1, le=4096)] | None = Field(
        None, description="config.json num_key_value_heads (num_attention_heads when absent)",
        examples=[8])
    head_size: Annotated[int, Field(ge=1, le=4096)] | None = Field(
        None, description="config.json head_dim, else hidden_size / num_attention_heads",
        examples=[128])
    max_positions: Annotated[int, Field(ge=16, le=1 << 24)] | None = Field(
        None, description="config.json max_position_embeddings", examples=[131072])

    @model_validator(mode="after")
    def _heads(self) -> "ModelFactsSpec":
        if self.attention_heads and self.kv_heads and self.attention_heads % self.kv_heads:
            raise ValueError(f"kv_heads: {self.kv_heads} does not divide attention_heads "
                             f"{self.attention_heads}; copy both from the model's config.json")
        return self


class ModelSpec(_Strict):
    """Which weights the image serves. They are mounted at run time, never baked in."""

    id: str = Field(description="Hugging Face model id (org/name) or an absolute local path",
                    examples=["Qwen/Qwen2-7B-Instruct", "/models/local-checkpoint"])
    revision: str | None = Field(
        None, description="Pinned Hugging Face commit (40 hex digits); required for hub ids",
        examples=["f2826a00ceef68f0f2b946d945ecc0477ce4450c"])
    mount_path: str = Field("/models/model", description="Where the weights are mounted at run time",
                            examples=["/models/qwen2-7b"])
    license: str | None = Field(
        None, max_length=100,
        description="The model's licence as an SPDX expression (e.g. Apache-2.0, or "
                    "LicenseRef-llama3.1 for a custom one): the image's org.opencontainers.image.licenses",
        examples=["Apache-2.0", "LicenseRef-llama3.1"])
    facts: ModelFactsSpec | None = Field(
        None, description="What the fit check needs (parameters, layers, heads, head size, max "
                          "positions); without them the resolver says the fit was not checked",
        examples=[{"parameters": 8030261248, "layers": 32, "attention_heads": 32, "kv_heads": 8,
                   "head_size": 128, "max_positions": 131072}])

    @field_validator("license")
    @classmethod
    def _license(cls, value: str | None) -> str | None:
        if value is not None and not _SPDX.fullmatch(value):
            raise ValueError("must be an SPDX license expression of [A-Za-z0-9.+-] ids joined by "
                             "AND/OR/WITH, e.g. Apache-2.0 or LicenseRef-llama3.1")
        return value

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not (_HF_ID.fullmatch(value) or _ABS_PATH.fullmatch(value)) or ".." in value:
            raise ValueError("must be a Hugging Face id like 'Qwen/Qwen2-7B-Instruct' or an "
                             "absolute path of [A-Za-z0-9._/-] (no spaces, newlines or shell "
                             "metacharacters)")
        return value

    @field_validator("revision")
    @classmethod
    def _revision(cls, value: str | None) -> str | None:
        if value is not None and not _COMMIT.fullmatch(value):
            raise ValueError("must be a full 40-hex commit id (a branch or tag is not pinned); "
                             "copy it from the model's 'Files and versions' history")
        return value

    @field_validator("mount_path")
    @classmethod
    def _mount(cls, value: str) -> str:
        if not _ABS_PATH.fullmatch(value) or ".." in value.split("/"):
            raise ValueError("must be an absolute path of [A-Za-z0-9._/-], e.g. /models/qwen2-7b")
        return normalise_mount(value)

    @model_validator(mode="after")
    def _pinned(self) -> "ModelSpec":
        if not self.id.startswith("/") and self.revision is None:
            raise ValueError("revision: a Hugging Face id needs a pinned 40-hex commit revision")
        return self


class TargetSpec(_Strict):
    """The GPU fleet the image is for."""

    gpu: str = Field(max_length=64,
                     description="GPU name from compat/gpus.yaml, e.g. H100-SXM, L4, A100-80GB",
                     examples=["H100-SXM", "L40S"])
    count: Annotated[int, Field(ge=1, le=64)] = Field(
        1, description="Tensor parallel size: GPUs per pipeline stage. A replica asks for "
                       "count × pipeline_parallel GPUs", examples=[1, 2])
    pipeline_parallel: Annotated[int, Field(ge=1, le=64)] = Field(
        1, description="Pipeline-parallel stages per replica (vLLM --pipeline-parallel-size, "
                        "trtllm-build --pp_size); GPUs requested per replica are count × pipeline_parallel",
        examples=[1, 2])
    nodes: Annotated[int, Field(ge=1, le=64)] = Field(
        1, description="Nodes one replica spans (vLLM on Ray; a Kubernetes LeaderWorkerSet). "
                       "Tensor parallelism stays inside a node, pipeline stages are split across "
                       "nodes, as vLLM's multi-node guide runs tp 8 × pp 2 on two 8-GPU nodes: "
                       "pipeline_parallel must be a multiple of nodes, and each node runs "
                       "count × pipeline_parallel / nodes GPUs", examples=[1, 2])
    driver: str = Field(max_length=32, description="Driver floor the fleet guarantees, e.g. '>=535.104.05'",
                        examples=[">=535.104.05", ">=550.54.15"])
    driver_policy: Literal["strict", "minor-compat", "forward-compat"] = Field(
        STRICT, description="strict: image CUDA ≤ what the driver ships; minor-compat: CUDA "
                            "minor-version compatibility within the major (with its limits); "
                            "forward-compat: the image's cuda-compat libcuda on an older "
                            "datacenter driver branch (datacenter GPUs only)",
        examples=["strict", "minor-compat"])

    @field_validator("driver")
    @classmethod
    def _driver(cls, value: str) -> str:
        match = _DRIVER_SPEC.fullmatch(value)
        if not match:
            space = " with no surrounding space" if _DRIVER_SPEC.fullmatch(value.strip()) else ""
            raise ValueError(f"must be a floor like '>=535.104.05'{space} (the oldest driver in the fleet)")
        floor = read_driver_text(match.group(1))
        if floor.kind == "cuda":
            raise ValueError(f"{value!r} names CUDA {floor.value} (nvidia-smi's 'CUDA Version'), not a "
                             "driver: give the fleet's oldest driver as nvidia-smi prints it "
                             "('Driver Version'), e.g. '>=580.65.06' (`imgfab resolve --driver "
                             f"{floor.value}` says which driver CUDA {floor.value} needs)")
        if floor.kind == "lone-branch":
            raise ValueError(f"{value!r} is a driver branch alone, not a driver release: give the "
                             "fleet's oldest driver as nvidia-smi prints it ('Driver Version'), "
                             "e.g. '>=580.65.06'")
        if floor.kind != "version":
            raise ValueError(f"{value!r} is not a driver floor: {floor.value}")
        return value

    @model_validator(mode="after")
    def _shape(self) -> "TargetSpec":
        if self.pipeline_parallel % self.nodes:
            raise ValueError(f"pipeline_parallel: {self.pipeline_parallel} stages cannot be split "
                             f"evenly over {self.nodes} nodes (tensor parallelism stays inside a "
                             f"node); make pipeline_parallel a multiple of target.nodes")
        return self

    @property
    def driver_floor(self) -> str:
        match = _DRIVER_SPEC.fullmatch(self.driver)
        assert match
        return match.group(1)


class BackendSpec(_Strict):
    name: Backend = Field(description="The inference server: vllm or tensorrt-llm",
                          examples=["vllm", "tensorrt-llm"])
    version: str | None = Field(None, max_length=100, description="PEP 440 specifier, e.g. '>=0.10,<0.12' or '==0.11.0'",
                                examples=[">=0.10,<0.12", "==0.11.0"])
    trtllm_path: Literal["pytorch", "engine"] | None = Field(
        None, description="TensorRT-LLM only: serve a checkpoint with the PyTorch backend, or a "
                          "compiled TensorRT engine", examples=["pytorch", "engine"])
    accept_advisories: tuple[str, ...] = Field(
        (), max_length=32,
        description="Critical advisories (compat/advisories.yaml ids or aliases) this recipe "
                    "accepts on its stack and lock. A stack or lock inside a critical advisory the "
                    "recipe does not name here is refused; every advisory is noted either way, and "
                    "the accepted ones are shown in the image's labels and by `imgfab select`",
        examples=[["CVE-2026-48746"]])

    @model_validator(mode="before")
    @classmethod
    def _replaced(cls, data: Any) -> Any:
        # issue 34: `advisories: note` accepted every critical advisory unnamed; the one
        # mechanism is now a named acceptance.
        if isinstance(data, dict) and "advisories" in data:
            raise ValueError("advisories: backend.advisories (note/refuse) was replaced by "
                             "backend.accept_advisories: a stack or lock inside a critical advisory "
                             "is refused unless the recipe names it; remove backend.advisories and "
                             "name each critical advisory you accept, e.g. accept_advisories: "
                             "[CVE-2026-48746]")
        return data

    @field_validator("accept_advisories")
    @classmethod
    def _ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if not _ADVISORY_ID.fullmatch(item):
                raise ValueError(f"{excerpt(item)} is not an advisory id: write a CVE-YYYY-NNNN "
                                 "or GHSA-xxxx-xxxx-xxxx id of compat/advisories.yaml")
        if len(set(value)) != len(value):
            raise ValueError("names an advisory twice; name each once")
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is None:
            return value
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            raise ValueError("must be a PEP 440 specifier such as '==0.11.0' or '>=0.10,<0.12'")
        return value

    @model_validator(mode="after")
    def _path(self) -> "BackendSpec":
        if self.name == Backend.VLLM.value and self.trtllm_path is not None:
            raise ValueError("trtllm_path: only for name: tensorrt-llm")
        return self


class CalibrationSpec(_Strict):
    """Calibration prompts for quantization: a user file mounted at build time, never baked."""

    prompts: str = Field(description="Path of a prompt file (one prompt per line), relative to the recipe",
                         examples=["calibration/chat-prompts.txt"])
    samples: Annotated[int, Field(ge=1, le=100000)] = Field(
        512, description="How many prompts calibration reads from the file", examples=[512])

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, value: str) -> str:
        if not _RELATIVE_PATH.fullmatch(value):
            raise ValueError("must be a path relative to the recipe's directory, of "
                             "[A-Za-z0-9._/-], not starting with '/', '-' or '.', without '..'")
        return value


class EngineSpec(_Strict):
    dtype: Literal["auto", "bfloat16", "float16"] = Field(
        "auto", description="Activation and unquantized weight dtype (auto: the checkpoint's)",
        examples=["bfloat16"])
    quantization: Quantization = Field(
        Quantization.NONE, description="Weight (and activation) quantization: fp8 (W8A8 FP8, "
                                       "compute capability ≥ 8.9), int8_sq (W8A8 INT8, "
                                       "SmoothQuant), int4_awq (W4A16 AWQ, what users call awq), "
                                       "gptq (a GPTQ checkpoint, W4A16 or W8A16), nvfp4 (W4A4 "
                                       "FP4, Blackwell)",
        examples=["fp8", "int4_awq"])
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        "auto", description="KV cache dtype (fp8 halves its memory; auto: the model dtype)",
        examples=["fp8"])
    max_batch_size: Annotated[int, Field(ge=1, le=4096)] = Field(
        64, description="TensorRT-LLM engines: trtllm-build --max_batch_size", examples=[64])
    max_input_len: Annotated[int, Field(ge=16, le=1048576)] = Field(
        4096, description="TensorRT-LLM engines only (trtllm-build --max_input_len); left out, "
                          "4096 capped at max_seq_len", examples=[4096])
    max_seq_len: Annotated[int, Field(ge=16, le=1048576)] = Field(
        8192, description="Longest sequence (prompt + output) the engine is built for; the "
                          "serving default of serve.max_model_len", examples=[32768])
    max_num_tokens: Annotated[int, Field(ge=16, le=1048576)] | None = Field(
        None, description="TensorRT-LLM engines: trtllm-build --max_num_tokens (default 8192)",
        examples=[8192])
    calibration: CalibrationSpec | None = Field(
        None, description="Calibration prompts for a quantization made at build time",
        examples=[{"prompts": "calibration/chat-prompts.txt", "samples": 512}])

    @model_validator(mode="before")
    @classmethod
    def _derived_input_len(cls, data: Any) -> Any:
        # max_input_len reaches only trtllm-build. A default the user never wrote must not
        # refuse a recipe: when it is left out, it is the default 4096 capped at max_seq_len.
        if isinstance(data, dict) and "max_input_len" not in data:
            seq = data.get("max_seq_len", cls.model_fields["max_seq_len"].default)
            if isinstance(seq, int) and not isinstance(seq, bool):
                default = cls.model_fields["max_input_len"].default
                data = dict(data, max_input_len=max(16, min(default, seq)))
        return data

    @model_validator(mode="after")
    def _lengths(self) -> "EngineSpec":
        if self.max_input_len > self.max_seq_len:
            raise ValueError("max_input_len: must be ≤ max_seq_len")
        return self


class ServeLimits(_Strict):
    """Scheduler limits for one workload shape."""

    max_num_seqs: Annotated[int, Field(ge=1, le=4096)] | None = Field(
        None, description="Sequences scheduled at once (vLLM --max-num-seqs)", examples=[256])
    max_num_batched_tokens: Annotated[int, Field(ge=16, le=1048576)] | None = Field(
        None, description="Tokens per scheduler step (vLLM --max-num-batched-tokens)", examples=[8192])
    enable_chunked_prefill: bool | None = Field(
        None, description="Split long prompts' prefill into chunks (vLLM --enable-chunked-prefill)",
        examples=[True])
    enable_prefix_caching: bool | None = Field(
        None, description="Reuse the KV cache of shared prompt prefixes (vLLM --enable-prefix-caching)",
        examples=[True])


# Operator-known workload shapes. Chat: many short concurrent turns, share the system prompt.
# Long documents: few sequences, big prefill chunks. Recipe values override these.
PRESET_DEFAULTS: dict[str, dict[str, Any]] = {
    "chat": {"max_num_seqs": 256, "max_num_batched_tokens": 8192,
             "enable_chunked_prefill": True, "enable_prefix_caching": True},
    "long-context": {"max_num_seqs": 16, "max_num_batched_tokens": 32768,
                     "enable_chunked_prefill": True, "enable_prefix_caching": False},
}


class ServeSpec(_Strict):
    port: Annotated[int, Field(ge=1024, le=65535)] = Field(
        8000, description="The OpenAI-compatible server's port in the container", examples=[8000])
    served_model_name: str | None = Field(
        None, description="The name clients send as `model` and /v1/models lists. Default: vLLM "
                          "serves the model id (model.id, what OpenAI clients expect); "
                          "trtllm-serve names it after the directory it serves (the engine's, "
                          "else model.mount_path's last part), so there it must hold no '/'",
        examples=["Qwen/Qwen2-7B-Instruct", "qwen2-7b"])
    max_model_len: Annotated[int, Field(ge=16, le=1048576)] | None = Field(
        None, description="Longest context served (vLLM --max-model-len); default engine.max_seq_len",
        examples=[32768])
    gpu_memory_utilization: Annotated[float, Field(gt=0.05, le=0.99)] = Field(
        0.90, description="Share of GPU memory vLLM may take for weights and KV cache",
        examples=[0.9])
    startup_timeout_s: Annotated[int, Field(ge=60, le=86400)] | None = Field(
        None, description="How long Kubernetes' startup probe waits for the server (seconds). "
                          "Default: 15 minutes (an hour for an engine compiled at start), longer "
                          "for large weights (model.facts.parameters) read at 125 MB/s",
        examples=[3600])
    preset: Literal["chat", "long-context"] = Field(
        "chat", description="The workload shape served by default: chat (many short turns) or "
                            "long-context (few long documents)", examples=["chat"])
    presets: dict[Literal["chat", "long-context"], ServeLimits] = Field(
        default_factory=dict, description="Per-preset scheduler limits over the defaults",
        examples=[{"chat": {"max_num_seqs": 128}}])
    unauthenticated: bool = Field(
        False, description="Serve without an API key when none is mounted. Without this the "
                           "image refuses to start with no key (IMGFAB_ALLOW_UNAUTHENTICATED=1 "
                           "at run time opts out too); the opt-out is logged at start and shown "
                           "in the org.imgfab.serve.unauthenticated label. trtllm-serve checks no "
                           "key at all, so its images need it: put an authenticating proxy in front",
        examples=[False])
    metrics_unauthenticated: bool = Field(
        False, description="vLLM: GET /metrics answers without the API key (a Prometheus "
                           "scrape); every other route but GET /health still needs it. The "
                           "metrics share the serving port: admit only the scraper and the "
                           "clients to it (a NetworkPolicy, a firewall)", examples=[False])
    publish_address: str = Field(
        "127.0.0.1", description="The host address run.sh and compose.yaml publish the port on "
                                 "(HOST_ADDR overrides it at run time): 127.0.0.1 by default, "
                                 "0.0.0.0 for every interface", examples=["127.0.0.1", "0.0.0.0"])

    @field_validator("publish_address")
    @classmethod
    def _publish_address(cls, value: str) -> str:
        try:
            ipaddress.IPv4Address(value)
        except ValueError:
            raise ValueError("must be an IPv4 address: 127.0.0.1 (this host only), 0.0.0.0 "
                             "(every interface) or one interface's address") from None
        return value

    @field_validator("served_model_name")
    @classmethod
    def _served(cls, value: str | None) -> str | None:
        if value is not None and not _HF_ID.fullmatch(value):
            raise ValueError("must be [A-Za-z0-9._-] with at most one '/'")
        return value


class ImageSpec(_Strict):
    registry: str | None = Field(None, description="Registry host[:port]; default from --registry / IMGFAB_REGISTRY",
                                 examples=["registry.example.com", "127.0.0.1:5000"])
    repository: str = Field(description="Repository path, e.g. llm/qwen2-7b", examples=["llm/qwen2-7b"])
    uid: Annotated[int, Field(ge=1001, le=2147483647)] = Field(
        10001, description="The non-root runtime user's uid and gid (not 1000: Ubuntu 24.04 "
                            "bases already have the 'ubuntu' user there)", examples=[10001])
    shm_size: str = Field("16g", description="Shared memory for the container, e.g. 16g",
                          examples=["16g"])
    os: Literal["ubuntu22.04", "ubuntu24.04"] | None = Field(
        None, description="Base OS; default: the newest the stack's Python allows",
        examples=["ubuntu24.04"])
    compression: Literal["gzip", "zstd"] = Field(
        "zstd", description="Layer compression as built and pushed (imgfab build --compression "
                            "overrides it). zstd pulls and unpacks faster but needs Docker >= 23.0 "
                            "or containerd >= 1.5 on every pulling host (the image's "
                            "org.imgfab.pull.requires label says so; `imgfab doctor` checks a host)",
        examples=["zstd", "gzip"])

    @field_validator("uid", mode="before")
    @classmethod
    def _uid(cls, value: Any) -> Any:
        if value == 1000 and not isinstance(value, bool):
            raise ValueError("1000 is the 'ubuntu' user of the nvidia/cuda Ubuntu 24.04 bases, so "
                             "useradd would fail; use 1001 or more (default 10001)")
        return value

    @field_validator("registry")
    @classmethod
    def _registry(cls, value: str | None) -> str | None:
        if value is not None and not _REGISTRY.fullmatch(value):
            raise ValueError("must be host[:port], e.g. registry.example.com or 127.0.0.1:5000")
        return value

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str) -> str:
        if len(value) > 255 or not _REPOSITORY.fullmatch(value):
            raise ValueError("must be lowercase path components like 'llm/qwen2-7b' "
                             "(at most 255 characters)")
        return value

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, value: str) -> str:
        match = _SIZE.fullmatch(value)
        if not match:
            raise ValueError("must be a size like 16g or 1024m")
        size = int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
        if not SHM_MIN_BYTES <= size <= SHM_MAX_BYTES:
            raise ValueError("must be between 64m and 4096g (NCCL needs room in /dev/shm)")
        return value.lower()


class Recipe(_Strict):
    """A whole recipe. ``name`` doubles as the image name and the build directory name."""

    name: str = Field(description="Lowercase name, e.g. qwen2-7b-h100", examples=["qwen2-7b-h100"])
    model: ModelSpec = Field(description="Which weights the image serves (mounted at run time)",
                             examples=[{"id": "Qwen/Qwen2-7B-Instruct",
                                        "revision": "f2826a00ceef68f0f2b946d945ecc0477ce4450c"}])
    target: TargetSpec = Field(description="The GPU fleet the image is for",
                               examples=[{"gpu": "H100-SXM", "driver": ">=535.104.05"}])
    backend: BackendSpec = Field(description="The inference server and its version range",
                                 examples=[{"name": "vllm"}])
    engine: EngineSpec = Field(default_factory=EngineSpec,
                               description="Precision and the engine's limits",
                               examples=[{"quantization": "fp8", "max_seq_len": 32768}])
    serve: ServeSpec = Field(default_factory=ServeSpec, description="How the server runs",
                             examples=[{"port": 8000, "preset": "chat"}])
    image: ImageSpec = Field(description="Where the image goes and how it runs",
                             examples=[{"repository": "llm/qwen2-7b"}])

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not isinstance(value, str) or not _NAME.fullmatch(value):
            raise ValueError("must be a DNS-1123 label that starts with a letter: lowercase "
                             "[a-z0-9-], 1-63 characters, no dots, e.g. qwen2-7b-h100")
        return value

    @model_validator(mode="after")
    def _backend_fields(self) -> "Recipe":
        trt = self.backend.name == Backend.TENSORRT_LLM.value
        if self.engine.calibration is not None and self.engine.quantization == "none":
            raise ValueError("engine.calibration: only used with a quantization")
        if trt and self.target.nodes > 1:
            raise ValueError("target.nodes: TensorRT-LLM across nodes is launched with MPI (mpirun, "
                             "one rank per GPU on every node), which imgfab does not render; serve "
                             "it on one node (target.nodes: 1) or with backend.name: vllm")
        if trt and self.backend.trtllm_path is None:
            raise ValueError("backend.trtllm_path: required for tensorrt-llm: 'pytorch' "
                             "(serve the checkpoint) or 'engine' (compile a TensorRT engine)")
        return self

    def limits(self) -> dict[str, dict[str, Any]]:
        """Each preset's scheduler limits: defaults overlaid with the recipe's values."""
        merged: dict[str, dict[str, Any]] = {}
        for preset, defaults in sorted(PRESET_DEFAULTS.items()):
            values = dict(defaults)
            override = self.serve.presets.get(preset)  # type: ignore[call-overload]
            if override is not None:
                values.update({k: v for k, v in override.model_dump().items() if v is not None})
            merged[preset] = values
        return merged


def recipe_hash(recipe: Recipe) -> str:
    """sha256 of the canonical JSON of the validated recipe (key order, defaults made explicit)."""
    canonical = json.dumps(recipe.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _field_path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if not str(part).startswith("function-"))


# Values users type for a field whose spelling differs, each answered with the exact value to
# write (None: imgfab has no such path; the fix names the nearest one). Refused, not accepted as
# aliases: a recipe has one spelling, so its hash, its lock's fingerprint and its image's
# labels say what the file says.
ALIASES: dict[str, dict[str, tuple[str | None, str]]] = {
    "engine.quantization": {
        "awq": ("int4_awq", "AWQ 4-bit weights"),
        "int4-awq": ("int4_awq", "AWQ 4-bit weights"), "awq_int4": ("int4_awq", "AWQ 4-bit weights"),
        "gptq": ("gptq", "a GPTQ checkpoint: vLLM reads its bits from the checkpoint"),
        "gptq-int4": ("gptq", "a GPTQ checkpoint: vLLM reads its bits from the checkpoint"),
        "gptq_int4": ("gptq", "a GPTQ checkpoint: vLLM reads its bits from the checkpoint"),
        "autogptq": ("gptq", "a GPTQ checkpoint: vLLM reads its bits from the checkpoint"),
        "smoothquant": ("int8_sq", "SmoothQuant W8A8"),
        "fp8_e4m3": ("fp8", "FP8 E4M3"), "bf16": ("none", "no quantization: dtype bfloat16"),
        "fp16": ("none", "no quantization: dtype float16"),
    },
    "engine.dtype": {"bf16": ("bfloat16", "bfloat16"), "fp16": ("float16", "float16"),
                     "half": ("float16", "float16")},
    "engine.kv_cache_dtype": {"fp8_e4m3": ("fp8", "FP8 E4M3")},
    "backend.name": {"trtllm": ("tensorrt-llm", "TensorRT-LLM"),
                     "tensorrt_llm": ("tensorrt-llm", "TensorRT-LLM"),
                     "trt-llm": ("tensorrt-llm", "TensorRT-LLM")},
}

# Values users type that name more than one quantization, each with every value it may mean
# (sorted): refused with the choices, never answered with one of them, since the checkpoint
# decides. W8A8 is FP8 as much as INT8; W4A16 and int4 are GPTQ as much as AWQ; int8 is a
# W8A16 GPTQ checkpoint as much as SmoothQuant; fp4 is MXFP4 (gpt-oss) as much as NVFP4.
_W8A8_FP8 = ("fp8", "FP8 weights and activations")
_W8A8_INT8 = ("int8_sq", "INT8 weights and activations, SmoothQuant")
_GPTQ = ("gptq", "a GPTQ checkpoint, 4- or 8-bit weights")
_AWQ = ("int4_awq", "AWQ 4-bit weights")
AMBIGUOUS_ALIASES: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {
    "engine.quantization": {
        "fp4": (("mxfp4", "OCP MX FP4, as gpt-oss ships: not an engine.quantization imgfab "
                          "serves yet"),
                ("nvfp4", "NVIDIA FP4, Blackwell")),
        "int4": (_GPTQ, _AWQ),
        "int8": (_GPTQ, _W8A8_INT8),
        "w4a16": (_GPTQ, _AWQ),
        "w8a8": (_W8A8_FP8, _W8A8_INT8),
    },
}


def _ambiguous(field: str, value: str) -> tuple[tuple[str, str], ...]:
    """The (value, meaning) choices of ``value`` when it is an ambiguous alias in ``field``."""
    return AMBIGUOUS_ALIASES.get(field, {}).get(value.strip().lower(), ())


def alias_choices(field: str, value: Any) -> tuple[str, ...]:
    """The exact values ``value`` may stand for in ``field``: one for an alias (``awq`` →
    ``("int4_awq",)``), several for an ambiguous one (``w8a8`` → ``("fp8", "int8_sq")``),
    none for anything else."""
    if not isinstance(value, str):
        return ()
    ambiguous = _ambiguous(field, value)
    if ambiguous:
        return tuple(exact for exact, _ in ambiguous)
    exact = ALIASES.get(field, {}).get(value.strip().lower(), (None, ""))[0]
    return (exact,) if exact else ()


def ambiguous_alias(field: str, value: Any) -> str | None:
    """The refusal of a value that names more than one choice (``w8a8 is ambiguous: fp8 or
    int8_sq``); None for any other value."""
    choices = alias_choices(field, value)
    if len(choices) < 2:
        return None
    return f"{value.strip()} is ambiguous: {' or '.join(choices)}"


def alias_fix(field: str, value: Any) -> str | None:
    """The fix for a value users type under another spelling (``awq`` → ``int4_awq``), or
    for one that names several (each choice with its meaning)."""
    if not isinstance(value, str):
        return None
    short = field.rsplit(".", 1)[-1]
    ambiguous = _ambiguous(field, value)
    if ambiguous:
        return "write the one the checkpoint is: " + "; ".join(
            f"{short}: {exact} ({meaning})" for exact, meaning in ambiguous)
    known = ALIASES.get(field, {}).get(value.strip().lower())
    if known is None:
        return None
    exact, meaning = known
    return f"write {short}: {exact} ({meaning})" if exact else meaning


def _error_line(err: dict[str, Any]) -> tuple[str, str]:
    """Turn one pydantic error into (field path, message)."""
    loc = _field_path(tuple(err.get("loc", ())))
    msg = str(err.get("msg", "invalid"))
    msg = msg.removeprefix("Value error, ")
    # A model-level validator reports "field: message" itself.
    if ": " in msg and re.match(r"^[a-z_.]+: ", msg):
        sub, msg = msg.split(": ", 1)
        loc = f"{loc}.{sub}" if loc else sub
    if err.get("type") == "extra_forbidden":
        msg = "unknown key; remove it or check its spelling against `imgfab schema`"
    elif err.get("type") == "missing":
        msg = "required field is missing"
    elif err.get("type") in ("enum", "literal_error"):
        msg = f"{msg} (got {excerpt(err.get('input'))})"
    if len(msg) > 300:
        msg = msg[:300] + "…"
    if len(loc) > 120:
        loc = loc[:120] + "…"
    return loc or "recipe", msg


def parse_recipe(data: Any, *, source: str = "recipe") -> Recipe:
    """Validate already-parsed YAML data. Raises RecipeError naming the first bad field."""
    if not isinstance(data, dict):
        raise RecipeError(f"{source} must be a YAML mapping", field="recipe")
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            field, message = _error_line(err)
            message = ambiguous_alias(field, err.get("input")) or message
            problems.append((field, message, alias_fix(field, err.get("input"))))
        field, message, fix = problems[0]
        # Every failing field, each by name: the first is the error's, the others follow it.
        also = "; ".join(f"{f}: {m}" + (f" ({x})" if x else "") for f, m, x in problems[1:])
        error = RecipeError(f"{message}; also {also}" if also else message, field=field, fix=fix)
        error.problems = tuple(problems)
        raise error from None
    except (TypeError, ValueError) as exc:  # a validator raised outside pydantic's wrapping
        raise RecipeError(str(exc), field="recipe") from None


def read_regular(path: str | Path, limit: int, *, field: str = "recipe") -> bytes:
    """The bytes of ``path`` when it is a regular file of at most ``limit`` bytes; otherwise
    RecipeError. Opened without blocking, so a FIFO or a device is refused, not waited on."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise RecipeError(f"no such file: {path}", field=field) from None
    except OSError as exc:
        raise RecipeError(f"cannot read {path}: {exc.strerror or exc.__class__.__name__}",
                          field=field) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RecipeError(f"{path} is not a regular file", field=field,
                          fix="give a regular file (not a directory, device or FIFO)")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise RecipeError(f"cannot read {path}: {exc.strerror or exc.__class__.__name__}",
                              field=field) from None
    if len(data) > limit:
        raise RecipeError(f"{path} is larger than {limit} bytes", field=field,
                          fix="recipes are small YAML files; check the path")
    return data


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with at most :data:`MAX_ALIASES` aliases and :data:`MAX_DEPTH`
    levels of nesting (so neither an alias bomb nor deep nesting runs without bound)."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise RecipeError(f"more than {MAX_ALIASES} YAML aliases", field="recipe",
                                  fix="write the values out; recipes need no anchors")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise RecipeError(f"YAML nested deeper than {MAX_DEPTH} levels", field="recipe",
                                  fix="recipes are a few levels deep; check the file")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe file. Raises RecipeError (exit 2) on any problem: a missing
    file, one that is not a regular file of at most :data:`MAX_RECIPE_BYTES`, bad YAML, too
    many aliases or too deep, or a field that fails validation."""
    path = Path(path)
    raw = read_regular(path, MAX_RECIPE_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RecipeError(f"{path} is not UTF-8 text", field="recipe") from None
    try:
        loader = _BoundedLoader(text)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise RecipeError(f"{path} is not valid YAML{where}", field="recipe") from None
    except (ValueError, RecursionError, OverflowError) as exc:  # e.g. a 5000-digit integer
        raise RecipeError(f"{path} holds a value YAML cannot load ({exc.__class__.__name__})",
                          field="recipe", fix="check for huge numbers or deep nesting") from None
    return parse_recipe(data, source=str(path))


def calibration_file(recipe: Recipe, recipe_path: str | Path) -> Path | None:
    """The calibration prompt file of ``recipe`` loaded from ``recipe_path``: inside the
    recipe's directory once symlinks are resolved, a regular file of at most
    :data:`MAX_CALIBRATION_BYTES`. None without calibration; RecipeError otherwise."""
    if recipe.engine.calibration is None:
        return None
    base = Path(recipe_path).resolve().parent
    target = (base / recipe.engine.calibration.prompts).resolve()
    if not target.is_relative_to(base):
        raise RecipeError(f"{recipe.engine.calibration.prompts} leaves the recipe's directory",
                          field="engine.calibration.prompts",
                          fix="keep the prompt file next to the recipe")
    read_regular(target, MAX_CALIBRATION_BYTES, field="engine.calibration.prompts")
    return target


def recipe_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) for recipe files."""
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "imgfab recipe"
    return schema


def recipe_fields() -> dict[str, dict[str, Any]]:
    """Every recipe field by its dotted path (``engine.quantization``), in schema order, with
    ``description``, ``type`` (JSON type names joined by ``|``, or the nested object's name),
    ``default`` (None when there is none), ``choices`` (None when open) and ``examples``."""
    schema = recipe_json_schema()
    defs = schema.get("$defs", {})

    def target(spec: dict[str, Any]) -> dict[str, Any]:
        ref = spec.get("$ref")
        return defs[ref.rsplit("/", 1)[1]] if ref else spec

    fields: dict[str, dict[str, Any]] = {}

    def walk(prefix: str, node: dict[str, Any]) -> None:
        for name, spec in node.get("properties", {}).items():
            path = f"{prefix}{name}"
            fields[path] = {}  # its place in schema order, before its own fields
            options = [target(o) for o in spec.get("anyOf", [spec])]
            kinds, choices, nested = [], None, None
            for option in options:
                if "enum" in option or "const" in option:
                    choices = (choices or []) + list(option.get("enum", [option.get("const")]))
                    kinds.append(option.get("type", "string"))
                elif option.get("type") == "object" and "properties" in option:
                    nested = option
                    kinds.append("object")
                elif option.get("type") == "object" and "additionalProperties" in option:
                    # a mapping (serve.presets): its values' fields under <key>
                    walk(f"{path}.<key>.", target(option["additionalProperties"]))
                    kinds.append("object")
                else:
                    kinds.append(option.get("type", "object"))
            fields[path].update({"description": spec.get("description", ""),
                            "type": "|".join(dict.fromkeys(kinds)) or None,
                            "default": spec.get("default"), "choices": choices,
                            "examples": list(spec.get("examples", []))})
            if nested is not None:
                walk(path + ".", nested)

    walk("", schema)
    return fields


# A driver version exactly as nvidia-smi prints it: 535.104.05 (data center, three parts) or
# 570.86 (GeForce, two parts); no surrounding space, which would otherwise reach labels and locks.
# A leading v (v580.95.05, as release pages and tags write it) is read as the version itself.
_DRIVER_VERSION = re.compile(r"[vV]?([0-9]{1,4}(\.[0-9]{1,4}){0,2})")
# A driver branch as NVIDIA names one: R580 (the branch's newest release the matrix knows).
_DRIVER_BRANCH = re.compile(r"[Rr]([0-9]{3,4})")
# Every Linux driver NVIDIA has shipped for a CUDA that imgfab builds is R3xx or newer (CUDA 11.8
# needs 520.61.05, compat/cuda.yaml); a number below that is something else pasted.
_MIN_DRIVER_MAJOR = 300
# CUDA majors nvidia-smi's header can print ("CUDA Version: 13.0") for the drivers of the matrix.
_CUDA_MAJORS = range(10, 14)


@dataclass(frozen=True)
class DriverText:
    """What a pasted driver string is, by its shape alone (no matrix).

    ``kind``: ``version`` (``value`` is the version, a leading v dropped: ``v580.95.05`` →
    ``580.95.05``), ``branch`` (``R580`` → ``580``), ``cuda`` (``13.0``: a CUDA version, major
    10–13 with a minor, as nvidia-smi's header prints it), ``lone-branch`` (``580``: a branch
    number without its R) or ``invalid`` (``value`` says why)."""

    kind: str
    value: str


def read_driver_text(text: Any) -> DriverText:
    """Classify ``text`` as :class:`DriverText`; never raises.

    >>> read_driver_text("v580.95.05"), read_driver_text("13.0").kind, read_driver_text("580").kind
    (DriverText(kind='version', value='580.95.05'), 'cuda', 'lone-branch')"""
    if not isinstance(text, str):
        return DriverText("invalid", "not a string")
    branch = _DRIVER_BRANCH.fullmatch(text)
    if branch:
        return DriverText("branch", branch.group(1))
    match = _DRIVER_VERSION.fullmatch(text)
    if match is None:
        return DriverText("invalid", "a driver version is numbers and dots, as nvidia-smi prints it")
    version = match.group(1)
    parts = version.split(".")
    major = int(parts[0])
    if len(parts) > 1 and major in _CUDA_MAJORS:
        return DriverText("cuda", version)
    if major < _MIN_DRIVER_MAJOR:
        return DriverText("invalid", f"driver majors are {_MIN_DRIVER_MAJOR} or newer")
    if len(parts) == 1:
        return DriverText("lone-branch", version)
    return DriverText("version", version)


def driver_version_ok(text: str) -> bool:
    """True if ``text`` is exactly a driver version (nothing around it; a leading v allowed)."""
    return read_driver_text(text).kind == "version"


__all__ = ["Recipe", "RecipeError", "load_recipe", "parse_recipe", "recipe_hash",
           "recipe_json_schema", "recipe_fields", "alias_fix", "alias_choices", "ambiguous_alias",
           "ALIASES", "AMBIGUOUS_ALIASES", "PRESET_DEFAULTS",
           "POLICIES", "DriverText", "read_driver_text"]
