"""Recipe schema: what users write in ``recipes/*.yaml``.

:func:`load_recipe` parses and validates a file into a :class:`Recipe` or raises
:class:`~imgfab.errors.RecipeError` with one line naming the field and the fix. Unknown keys are
errors. The file is never rewritten. :func:`recipe_json_schema` exports the JSON Schema editors use.
"""

from __future__ import annotations

import hashlib
import json
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from imgfab.errors import RecipeError
from imgfab.rules import POLICIES, STRICT, parse_version

# A value that reaches a Dockerfile, a shell script or a YAML manifest: no whitespace, quotes,
# or shell metacharacters. Hugging Face ids are "org/name" with [A-Za-z0-9._-].
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
_ABS_PATH = re.compile(r"^/[A-Za-z0-9._/-]{0,255}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# A DNS-1123 label that starts with a letter: it names the container, the Kubernetes objects
# (Deployment, Service, PVC) and the build directory, and must stay a string in YAML.
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_REPOSITORY = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
_REGISTRY = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]{1,5})?$")
_SIZE = re.compile(r"^[0-9]+[kmgKMG]?$")
_DRIVER_SPEC = re.compile(r"^>=\s*(\d+(\.\d+){0,2})$")


class Backend(str, Enum):
    VLLM = "vllm"
    TENSORRT_LLM = "tensorrt-llm"


class Quantization(str, Enum):
    NONE = "none"
    FP8 = "fp8"
    INT8_SQ = "int8_sq"
    INT4_AWQ = "int4_awq"
    NVFP4 = "nvfp4"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=True)


class ModelSpec(_Strict):
    """Which weights the image serves. They are mounted at run time, never baked in."""

    id: str = Field(description="Hugging Face model id (org/name) or an absolute local path")
    revision: str | None = Field(
        None, description="Pinned Hugging Face commit (40 hex digits); required for hub ids")
    mount_path: str = Field("/models/model", description="Where the weights are mounted at run time")

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not (_HF_ID.match(value) or _ABS_PATH.match(value)) or ".." in value:
            raise ValueError("must be a Hugging Face id like 'Qwen/Qwen2-7B-Instruct' or an "
                             "absolute path of [A-Za-z0-9._/-] (no spaces, newlines or shell "
                             "metacharacters)")
        return value

    @field_validator("revision")
    @classmethod
    def _revision(cls, value: str | None) -> str | None:
        if value is not None and not _COMMIT.match(value):
            raise ValueError("must be a full 40-hex commit id (a branch or tag is not pinned); "
                             "copy it from the model's 'Files and versions' history")
        return value

    @field_validator("mount_path")
    @classmethod
    def _mount(cls, value: str) -> str:
        if not _ABS_PATH.match(value) or ".." in value or value.rstrip("/") in ("", "/opt", "/usr"):
            raise ValueError("must be an absolute path of [A-Za-z0-9._/-], e.g. /models/qwen2-7b")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _pinned(self) -> "ModelSpec":
        if not self.id.startswith("/") and self.revision is None:
            raise ValueError("revision: a Hugging Face id needs a pinned 40-hex commit revision")
        return self


class TargetSpec(_Strict):
    """The GPU fleet the image is for."""

    gpu: str = Field(description="GPU name from compat/gpus.yaml, e.g. H100-SXM, L4, A100-80GB")
    count: Annotated[int, Field(ge=1, le=64)] = Field(1, description="GPUs per replica (tensor parallel size)")
    pipeline_parallel: Annotated[int, Field(ge=1, le=64)] = 1
    driver: str = Field(description="Driver floor the fleet guarantees, e.g. '>=535.104.05'")
    driver_policy: Literal["strict", "minor-compat", "forward-compat"] = Field(
        STRICT, description="strict: image CUDA ≤ what the driver ships; minor-compat: CUDA "
                            "minor-version compatibility within the major (with its limits); "
                            "forward-compat: the image's cuda-compat libcuda on an older "
                            "datacenter driver branch (datacenter GPUs only)")

    @field_validator("driver")
    @classmethod
    def _driver(cls, value: str) -> str:
        if not _DRIVER_SPEC.match(value.strip()):
            raise ValueError("must be a floor like '>=535.104.05' (the oldest driver in the fleet)")
        return value.strip()

    @property
    def driver_floor(self) -> str:
        match = _DRIVER_SPEC.match(self.driver)
        assert match
        return match.group(1)


class BackendSpec(_Strict):
    name: Backend
    version: str | None = Field(None, description="PEP 440 specifier, e.g. '>=0.10,<0.12' or '==0.11.0'")
    trtllm_path: Literal["pytorch", "engine"] | None = Field(
        None, description="TensorRT-LLM only: serve a checkpoint with the PyTorch backend, or a "
                          "compiled TensorRT engine")

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

    prompts: str = Field(description="Path of a prompt file (one prompt per line), relative to the recipe")
    samples: Annotated[int, Field(ge=1, le=100000)] = 512

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9._/-]+$", value) or ".." in value.split("/"):
            raise ValueError("must be a relative path of [A-Za-z0-9._/-] without '..'")
        return value


class EngineSpec(_Strict):
    dtype: Literal["auto", "bfloat16", "float16"] = "auto"
    quantization: Quantization = Quantization.NONE
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    max_batch_size: Annotated[int, Field(ge=1, le=4096)] = 64
    max_input_len: Annotated[int, Field(ge=16, le=1048576)] = 4096
    max_seq_len: Annotated[int, Field(ge=16, le=1048576)] = 8192
    max_num_tokens: Annotated[int, Field(ge=16, le=1048576)] | None = None
    calibration: CalibrationSpec | None = None

    @model_validator(mode="after")
    def _lengths(self) -> "EngineSpec":
        if self.max_input_len > self.max_seq_len:
            raise ValueError("max_input_len: must be ≤ max_seq_len")
        return self


class ServeLimits(_Strict):
    """Scheduler limits for one workload shape."""

    max_num_seqs: Annotated[int, Field(ge=1, le=4096)] | None = None
    max_num_batched_tokens: Annotated[int, Field(ge=16, le=1048576)] | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None


# Operator-known workload shapes. Chat: many short concurrent turns, share the system prompt.
# Long documents: few sequences, big prefill chunks. Recipe values override these.
PRESET_DEFAULTS: dict[str, dict[str, Any]] = {
    "chat": {"max_num_seqs": 256, "max_num_batched_tokens": 8192,
             "enable_chunked_prefill": True, "enable_prefix_caching": True},
    "long-context": {"max_num_seqs": 16, "max_num_batched_tokens": 32768,
                     "enable_chunked_prefill": True, "enable_prefix_caching": False},
}


class ServeSpec(_Strict):
    port: Annotated[int, Field(ge=1024, le=65535)] = 8000
    served_model_name: str | None = None
    max_model_len: Annotated[int, Field(ge=16, le=1048576)] | None = None
    gpu_memory_utilization: Annotated[float, Field(gt=0.05, le=0.99)] = 0.90
    preset: Literal["chat", "long-context"] = "chat"
    presets: dict[Literal["chat", "long-context"], ServeLimits] = Field(default_factory=dict)

    @field_validator("served_model_name")
    @classmethod
    def _served(cls, value: str | None) -> str | None:
        if value is not None and not _HF_ID.match(value):
            raise ValueError("must be [A-Za-z0-9._-] with at most one '/'")
        return value


class ImageSpec(_Strict):
    registry: str | None = Field(None, description="Registry host[:port]; default from --registry / IMGFAB_REGISTRY")
    repository: str = Field(description="Repository path, e.g. llm/qwen2-7b")
    uid: Annotated[int, Field(ge=1001, le=2147483647)] = Field(
        10001, description="The non-root runtime user's uid and gid (not 1000: Ubuntu 24.04 "
                            "bases already have the 'ubuntu' user there)")
    shm_size: str = Field("16g", description="Shared memory for the container, e.g. 16g")
    os: Literal["ubuntu22.04", "ubuntu24.04"] | None = Field(
        None, description="Base OS; default: the newest the stack's Python allows")

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
        if value is not None and not _REGISTRY.match(value):
            raise ValueError("must be host[:port], e.g. registry.example.com or 127.0.0.1:5000")
        return value

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str) -> str:
        if not _REPOSITORY.match(value):
            raise ValueError("must be lowercase path components like 'llm/qwen2-7b'")
        return value

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, value: str) -> str:
        if not _SIZE.match(value):
            raise ValueError("must be a size like 16g or 1024m")
        return value.lower()


class Recipe(_Strict):
    """A whole recipe. ``name`` doubles as the image name and the build directory name."""

    name: str = Field(description="Lowercase name, e.g. qwen2-7b-h100")
    model: ModelSpec
    target: TargetSpec
    backend: BackendSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    serve: ServeSpec = Field(default_factory=ServeSpec)
    image: ImageSpec

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
        msg = f"{msg} (got {err.get('input')!r})"
    return loc or "recipe", msg


def parse_recipe(data: Any, *, source: str = "recipe") -> Recipe:
    """Validate already-parsed YAML data. Raises RecipeError naming the first bad field."""
    if not isinstance(data, dict):
        raise RecipeError(f"{source} must be a YAML mapping", field="recipe")
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        field, message = _error_line(errors[0])
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise RecipeError(f"{message}{more}", field=field) from None
    except (TypeError, ValueError) as exc:  # a validator raised outside pydantic's wrapping
        raise RecipeError(str(exc), field="recipe") from None


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe file. Raises RecipeError (exit 2) on any problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"no such file: {path}", field="recipe") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"cannot read {path}: {exc.__class__.__name__}", field="recipe") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise RecipeError(f"{path} is not valid YAML{where}", field="recipe") from None
    return parse_recipe(data, source=str(path))


def recipe_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) for recipe files."""
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "imgfab recipe"
    return schema


def driver_version_ok(text: str) -> bool:
    try:
        parse_version(text)
    except ValueError:
        return False
    return True


__all__ = ["Recipe", "RecipeError", "load_recipe", "parse_recipe", "recipe_hash",
           "recipe_json_schema", "PRESET_DEFAULTS", "POLICIES"]
