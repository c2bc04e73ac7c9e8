"""TensorRT-LLM command lines, engine cache key and compile strategy. Pure except :func:`two_phase`.

From a :class:`~imgfab.recipe.Recipe` and its resolved :class:`~imgfab.stack.resolve.Stack`,
:func:`engine_plan` computes every TensorRT-LLM command the image runs, each checked against
``compat/trtllm_flags/<version>.yaml`` (the flags the pinned release defines):

1. the checkpoint step: imgfab's own ``imgfab-quantize`` (same flag names as TensorRT-LLM's
   ``examples/quantization/quantize.py``, which the wheel does not ship; it calls
   ``tensorrt_llm.quantization.quantize_and_export``), ``--qformat full_prec`` when the recipe
   does not quantize;
2. ``trtllm-build`` with the recipe's limits and ``--strip_plan`` (a weight-stripped engine);
3. at start, ``trtllm-refit`` (weights from the checkpoint on the mounted volume into the cache
   volume) and ``trtllm-serve <engine> --backend tensorrt --tokenizer <weights>``.

Any unknown flag raises :class:`CompatibilityError`; a release without a flag table refuses the
TensorRT-LLM paths with a line naming the missing table. Nothing here imports Docker:
:func:`two_phase` drives an injected ``engine`` object (``imgfab.docker.engine`` in production, a
recording fake in tests).

>>> plan = engine_plan(recipe, stack)                        # doctest: +SKIP
>>> plan.build_argv[:3]                                      # doctest: +SKIP
['trtllm-build', '--checkpoint_dir', '/opt/imgfab/out/checkpoint']
"""

from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from packaging.version import Version

from imgfab.matrix import compat
from imgfab.errors import CompatibilityError, EngineError, MatrixError, RecipeError
from imgfab.recipe import Recipe, recipe_hash
from imgfab.stack.resolve import Stack
from imgfab.render.trtllm_flags import FlagSet, check_command, flags_dir, load_flags

# Paths inside the images. The compile output of the two-phase build is a bind mount; the
# engine cache is a volume; calibration prompts are bind-mounted as <dir>/train.txt because
# quantize_and_export's get_calib_dataloader loads a local *directory* with
# datasets.load_dataset(dir, split="train")["text"] (quantize_by_modelopt.py), and a directory
# holding one train.txt is exactly that (the "text" builder, split "train", column "text").
COMPILE_OUT = "/opt/imgfab/out"
ENGINE_IN_IMAGE = "/opt/imgfab/engine"
ENGINE_CACHE = "/var/cache/imgfab/engines"
CALIBRATION_DIR = "/run/imgfab/calibration"
CALIBRATION_FILE = f"{CALIBRATION_DIR}/train.txt"
QUANTIZE_SCRIPT = "/opt/imgfab/bin/imgfab-quantize.py"
COMPILE_SCRIPT = "/opt/imgfab/bin/imgfab-compile"
# The quantize entry's flags are those of this TensorRT-LLM example script.
QUANTIZE_TABLE = "examples/quantization/quantize.py"
CHECKPOINT_SUBDIR = "imgfab-trtllm"

STRATEGIES = ("buildkit-device", "two-phase", "at-start")
_QFORMAT = {"none": "full_prec", "fp8": "fp8", "int8_sq": "int8_sq", "int4_awq": "int4_awq",
            "nvfp4": "nvfp4"}


@dataclass(frozen=True)
class EngineCaps:
    """What the Docker engine can do for a compile (probed by the caller, not here)."""

    buildkit_device: bool = False  # BuildKit accepts RUN --device (CDI); Docker 20.10: no
    gpu_visible: bool = False  # `docker run --gpus` works on the engine's host


@dataclass(frozen=True)
class EnginePlan:
    """Every TensorRT-LLM command of one recipe, already checked against the flag table."""

    version: str
    strategy: str
    cache_key: str
    cache_dir: str  # the cache volume's directory for this key
    checkpoint_argv: list[str]  # the checkpoint step as run by the two-phase compile
    build_argv: list[str]  # trtllm-build as run by the two-phase compile (--strip_plan)
    start_checkpoint_argv: list[str]  # the checkpoint step when compiling at start
    start_build_argv: list[str]  # trtllm-build when compiling at start (into the volume)
    refit_argv: list[str]
    runtime_checkpoint: str  # where the two-phase checkpoint must be at run time
    served_engine: str  # the engine directory trtllm-serve reads
    tensorrt: str  # exact TensorRT version pinned in requirements.txt
    flags_confirmed: bool
    flags_note: str
    labels: dict[str, str] = field(default_factory=dict)


def flag_table(stack: Stack, directory: Path | None = None) -> FlagSet:
    """The flag table of the stack's TensorRT-LLM release, or CompatibilityError naming it."""
    directory = directory or flags_dir()
    try:
        return load_flags(stack.backend_version, directory)
    except MatrixError as err:
        if (directory / f"{stack.backend_version}.yaml").is_file():
            raise
        raise CompatibilityError(
            f"TensorRT-LLM {stack.backend_version} is incompatible with imgfab's "
            f"{stack.backend_path} path: no flag table compat/trtllm_flags/"
            f"{stack.backend_version}.yaml, so no rendered command can be checked ({err.message})",
            field="backend.version",
            fix=f"pin a release that has a table (backend.version: '=={_tables(directory)}') or "
                f"run scripts/extract_trtllm_flags.py on {stack.backend_version}'s wheel") from None


def _tables(directory: Path) -> str:
    have = sorted((p.stem for p in directory.glob("*.yaml")), key=Version)
    return have[-1] if have else "<none>"


def check_argv(argv: list[str], flags: FlagSet, command: str) -> list[str]:
    """``argv`` (command name first) checked against ``flags``; raises on any problem."""
    problems = check_command(argv[1:], flags, command)
    if problems:
        raise CompatibilityError(
            f"{command} in TensorRT-LLM {flags.version} is incompatible with the rendered "
            f"command: {'; '.join(problems)}", field="backend.version",
            fix="fix the command in imgfab.render.trtllm, or regenerate the flag table")
    return argv


def tensorrt_pin(stack: Stack, compat_dir: Path | None = None) -> str:
    """The exact TensorRT the image pins for ``stack`` (:func:`imgfab.matrix.compat.tensorrt_pin`)."""
    releases = compat.load_tensorrt(compat_dir or compat.default_compat_dir())
    return compat.tensorrt_pin(stack.tensorrt, stack.backend_version, stack.cuda, releases)


def engine_cache_key(compute_capability: str, tensorrt: str, trtllm: str, recipe_digest: str) -> str:
    """sha256 over the four things an engine depends on, one per line (``"9.0\\n10.14…\\n"``).

    The entrypoint computes the same bytes with ``printf '%s\\n' … | sha256sum``.
    """
    text = "".join(f"{part}\n" for part in (compute_capability, tensorrt, trtllm, recipe_digest))
    return hashlib.sha256(text.encode()).hexdigest()


def choose_compile_strategy(caps: EngineCaps, requested: str = "auto") -> tuple[str, str]:
    """``(strategy, one-line reason)``; ``requested`` is ``auto`` or one of :data:`STRATEGIES`.

    ``--engine-at-start`` passes ``requested="at-start"``, which always wins. A requested
    strategy the engine cannot do raises :class:`CompatibilityError` (never a silent fallback).
    """
    if requested == "at-start":
        return "at-start", "--engine-at-start: the engine is compiled on first start into the cache volume"
    if requested not in ("auto", "buildkit-device", "two-phase"):
        raise RecipeError(f"unknown compile strategy {requested!r}", field="--engine-at-start",
                          fix="one of: auto, " + ", ".join(STRATEGIES))
    if caps.buildkit_device and requested in ("auto", "buildkit-device"):
        return "buildkit-device", "BuildKit supports RUN --device: compiling inside the builder stage"
    if requested == "buildkit-device":
        raise CompatibilityError(
            "the Docker engine is incompatible with buildkit-device: its BuildKit has no "
            "RUN --device (CDI)", field="--engine-at-start",
            fix="let imgfab choose (two-phase needs `docker run --gpus`), or --engine-at-start")
    if caps.gpu_visible:
        return "two-phase", ("no RUN --device in this BuildKit; a GPU is visible to the engine: "
                             "compiling in `docker run --gpus` of the builder image")
    raise CompatibilityError(
        "the Docker engine is incompatible with compiling a TensorRT engine at build time: "
        "no RUN --device in its BuildKit and no GPU visible to `docker run --gpus`",
        field="--engine-at-start", fix="build on a GPU host, or pass --engine-at-start")


def _checkpoint_argv(recipe: Recipe, stack: Stack, out: str) -> list[str]:
    engine = recipe.engine
    argv = ["python3", QUANTIZE_SCRIPT, "--model_dir", recipe.model.mount_path, "--output_dir", out,
            "--dtype", engine.dtype, "--qformat", _QFORMAT[engine.quantization],
            "--tp_size", str(stack.tensor_parallel), "--pp_size", str(stack.pipeline_parallel)]
    if engine.kv_cache_dtype == "fp8":
        argv += ["--kv_cache_dtype", "fp8"]
    if engine.calibration is not None:
        argv += ["--calib_dataset", CALIBRATION_DIR, "--calib_size", str(engine.calibration.samples)]
    return argv


def _build_argv(recipe: Recipe, checkpoint: str, out: str, *, strip: bool) -> list[str]:
    engine = recipe.engine
    argv = ["trtllm-build", "--checkpoint_dir", checkpoint, "--output_dir", out,
            "--max_batch_size", str(engine.max_batch_size),
            "--max_input_len", str(engine.max_input_len),
            "--max_seq_len", str(engine.max_seq_len),
            "--max_num_tokens", str(engine.max_num_tokens or max_num_tokens(recipe)),
            "--gemm_plugin", "auto"]
    return argv + (["--strip_plan"] if strip else [])


def served_model_name(recipe: Recipe) -> str:
    """The name /v1/models answers with: the recipe's ``serve.served_model_name``, else its name."""
    return recipe.serve.served_model_name or recipe.name


def max_num_tokens(recipe: Recipe) -> int:
    """The engine's token budget per step: the recipe's, else trtllm-build's default 8192."""
    return recipe.engine.max_num_tokens or 8192


def engine_plan(recipe: Recipe, stack: Stack, *, strategy: str = "two-phase",
                directory: Path | None = None) -> EnginePlan:
    """Every command of the engine path, checked. Raises CompatibilityError (flag, table)."""
    if stack.backend != "tensorrt-llm" or stack.backend_path != "engine":
        raise RecipeError("engine_plan is for backend.trtllm_path: engine", field="backend.trtllm_path")
    if strategy not in STRATEGIES:
        raise RecipeError(f"unknown compile strategy {strategy!r}", field="--engine-at-start",
                          fix="one of: " + ", ".join(STRATEGIES))
    flags = flag_table(stack, directory)
    digest = recipe_hash(recipe)
    trt = tensorrt_pin(stack)
    key = engine_cache_key(stack.compute_capability, trt, stack.backend_version, digest)
    cache_dir = f"{ENGINE_CACHE}/{key}"
    # trtllm-serve has no served-name option: it names the model after the directory it serves
    # (tensorrt_llm/serve/openai_server.py: model_dir.name), so the engine directory is named
    # after the served model name and /v1/models answers with it.
    if "/" in served_model_name(recipe):
        raise RecipeError(f"the engine directory is named after the served model name "
                          f"{served_model_name(recipe)!r}, which cannot hold a '/'",
                          field="serve.served_model_name", fix="a name without '/', e.g. "
                          + served_model_name(recipe).rsplit("/", 1)[-1])
    served_engine = f"{cache_dir}/{served_model_name(recipe)}"
    runtime_checkpoint = f"{recipe.model.mount_path}/{CHECKPOINT_SUBDIR}/{key[:16]}/checkpoint"
    checkpoint = _checkpoint_argv(recipe, stack, f"{COMPILE_OUT}/checkpoint")
    build = _build_argv(recipe, f"{COMPILE_OUT}/checkpoint", f"{COMPILE_OUT}/engine", strip=True)
    start_checkpoint = _checkpoint_argv(recipe, stack, f"{cache_dir}/checkpoint")
    start_build = _build_argv(recipe, f"{cache_dir}/checkpoint", served_engine, strip=False)
    refit = ["trtllm-refit", "--engine_dir", ENGINE_IN_IMAGE, "--checkpoint_dir", runtime_checkpoint,
             "--output_dir", served_engine]
    for argv in (checkpoint, start_checkpoint):
        check_argv(argv, flags, QUANTIZE_TABLE)
    for argv in (build, start_build):
        check_argv(argv, flags, "trtllm-build")
    check_argv(refit, flags, "trtllm-refit")
    strip = strategy != "at-start"
    p = "org.imgfab.engine"
    labels = {f"{p}.cc": stack.compute_capability, f"{p}.tensorrt": trt,
              f"{p}.tensorrt_llm": stack.backend_version, f"{p}.tp": str(stack.tensor_parallel),
              f"{p}.pp": str(stack.pipeline_parallel),
              f"{p}.max_batch_size": str(recipe.engine.max_batch_size),
              f"{p}.max_input_len": str(recipe.engine.max_input_len),
              f"{p}.max_seq_len": str(recipe.engine.max_seq_len),
              f"{p}.max_num_tokens": str(max_num_tokens(recipe)),
              f"{p}.strip_plan": "true" if strip else "false",
              f"{p}.strategy": strategy, f"{p}.cache_key": key,
              f"{p}.flags_confirmed": "true" if flags.confirmed else "false"}
    return EnginePlan(version=stack.backend_version, strategy=strategy, cache_key=key,
                      cache_dir=cache_dir, checkpoint_argv=checkpoint, build_argv=build,
                      start_checkpoint_argv=start_checkpoint, start_build_argv=start_build,
                      refit_argv=refit, runtime_checkpoint=runtime_checkpoint,
                      served_engine=served_engine, tensorrt=trt,
                      flags_confirmed=flags.confirmed, flags_note=_flags_note(flags), labels=labels)


def _flags_note(flags: FlagSet) -> str:
    if flags.confirmed:
        return f"flags checked against TensorRT-LLM {flags.version}'s own source"
    if flags.stand_in:
        return (f"flags checked against a stand-in table read from TensorRT-LLM {flags.stand_in} "
                f"source, not {flags.version}'s wheel (confirmed: false)")
    return f"flags checked against an unconfirmed table for TensorRT-LLM {flags.version}"


def serve_argv(recipe: Recipe, stack: Stack, limits: dict[str, Any], *,
               served: str | None = None, directory: Path | None = None) -> list[str]:
    """``trtllm-serve`` for one preset, checked. ``served`` is the engine dir (engine path).

    The engine path clamps the scheduler limits to the engine's build-time maxima: an engine
    cannot serve a batch, token budget or sequence longer than it was built for.
    """
    engine = stack.backend_path == "engine"
    name = served_model_name(recipe)
    if not engine and recipe.model.mount_path.rsplit("/", 1)[-1] != name:
        raise RecipeError(
            f"trtllm-serve names the model after the directory it serves "
            f"({recipe.model.mount_path.rsplit('/', 1)[-1]!r}), not {name!r}, and has no option to "
            f"rename it", field="model.mount_path",
            fix=f"mount the weights at /models/{name} (or set serve.served_model_name to the "
                f"mount directory's name)")
    max_len = recipe.serve.max_model_len or recipe.engine.max_seq_len
    tokens = limits["max_num_batched_tokens"]
    if engine:
        max_len = min(max_len, recipe.engine.max_seq_len)
        tokens = min(tokens, max_num_tokens(recipe))
    argv = ["trtllm-serve", served if engine and served else recipe.model.mount_path,
            "--host", "0.0.0.0", "--port", str(recipe.serve.port),
            "--backend", "tensorrt" if engine else "pytorch",
            "--max_batch_size", str(min(limits["max_num_seqs"], recipe.engine.max_batch_size)),
            "--max_num_tokens", str(tokens), "--max_seq_len", str(max_len),
            "--tp_size", str(stack.tensor_parallel), "--pp_size", str(stack.pipeline_parallel),
            "--kv_cache_free_gpu_memory_fraction", str(recipe.serve.gpu_memory_utilization)]
    if engine:
        argv += ["--tokenizer", recipe.model.mount_path]
    return check_argv(argv, flag_table(stack, directory), "trtllm-serve")


# --- two-phase orchestration (drives an injected engine; the only I/O in this module) --------

@dataclass(frozen=True)
class TwoPhaseResult:
    """What the runtime build needs after the GPU compile."""

    builder_image: str
    engine_dir: Path  # <context>/engine: the weight-stripped engine, COPY'd by the runtime stage
    checkpoint_dir: Path  # <out>/checkpoint: NOT in the context; goes next to the weights
    runtime_checkpoint: str  # where the entrypoint expects it: <mount>/imgfab-trtllm/<key16>/checkpoint
    cache_key: str
    target: str = "runtime"


def two_phase(context_dir: Path, recipe: Recipe, stack: Stack, *, engine: Any, weights_dir: Path,
              calibration_file: Path | None, out_dir: Path, builder_tag: str | None = None,
              build_args: dict[str, str] | None = None, secrets: dict[str, str] | None = None,
              network: str | None = None, on_line: Callable[[str], None] | None = None,
              timeout_s: float = 6 * 3600, poll_s: float = 5.0) -> TwoPhaseResult:
    """Build the builder stage, compile on a GPU in ``docker run``, place the engine in the context.

    ``engine`` provides ``build(context_dir, *, tags, build_args, secrets, network, target,
    on_line)``, ``run_container(image, *, gpus, shm_size, mounts, env, name)``,
    ``container_running``, ``container_logs`` and ``remove_container`` (``imgfab.docker.engine``).
    The builder image's CMD is ``imgfab-compile two-phase``; weights and calibration prompts
    are read-only bind mounts, ``out_dir`` the only writable one. Raises EngineError when the
    compile fails (with the log tail), RecipeError for a missing weights/calibration path.
    """
    plan = engine_plan(recipe, stack, strategy="two-phase")
    context_dir, weights_dir, out_dir = Path(context_dir), Path(weights_dir), Path(out_dir)
    if not (weights_dir / "config.json").is_file():
        raise RecipeError(f"{weights_dir} holds no config.json", field="--weights",
                          fix=f"point --weights at the {recipe.model.id} snapshot")
    if recipe.engine.calibration is not None and (calibration_file is None or not Path(calibration_file).is_file()):
        raise RecipeError(f"calibration prompts {calibration_file} not found",
                          field="engine.calibration.prompts", fix="give the prompt file's path")
    if context_dir.resolve() in out_dir.resolve().parents or out_dir.resolve() == context_dir.resolve():
        raise RecipeError("the compile output must be outside the build context (the checkpoint "
                          "holds the weights)", field="--out", fix="choose a directory elsewhere")
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = builder_tag or f"imgfab-builder/{recipe.name}:{plan.cache_key[:12]}"
    built = engine.build(context_dir, tags=[tag], build_args=dict(build_args or {}),
                         secrets=dict(secrets or {}), network=network, target="builder",
                         on_line=on_line)
    engine.remove_image(built.hold_ref)  # `tag` names it
    mounts = [(str(weights_dir.resolve()), recipe.model.mount_path, True),
              (str(out_dir.resolve()), COMPILE_OUT, False)]
    if recipe.engine.calibration is not None:
        mounts.insert(1, (str(Path(calibration_file).resolve()), CALIBRATION_FILE, True))  # type: ignore[arg-type]
    container = engine.run_container(
        tag, gpus=stack.tensor_parallel * stack.pipeline_parallel, shm_size=recipe.image.shm_size,
        mounts=mounts, env={"IMGFAB_CACHE_KEY": plan.cache_key}, name=f"imgfab-compile-{recipe.name}")
    try:
        deadline = time.monotonic() + timeout_s
        while engine.container_running(container):
            if time.monotonic() > deadline:
                raise EngineError(f"compile of {recipe.name} ran past {timeout_s:.0f}s",
                                  field="engine", fix="raise the timeout or check the GPU")
            time.sleep(poll_s)
        status = int(getattr(container, "attrs", {}).get("State", {}).get("ExitCode", 1))
        if status != 0:
            tail = engine.container_logs(container, tail=20).strip().splitlines()[-3:]
            raise EngineError(f"imgfab-compile exited {status}: {' | '.join(tail)}", field="engine",
                              fix="read the compile log: docker logs on the builder container")
    finally:
        engine.remove_container(container)
    built, checkpoint = out_dir / "engine", out_dir / "checkpoint"
    if not (built / "config.json").is_file() or not any(built.glob("rank*.engine")):
        raise EngineError(f"the compile left no engine in {built}", field="engine",
                          fix="read the compile log")
    target = context_dir / "engine"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(built, target)
    return TwoPhaseResult(builder_image=tag, engine_dir=target, checkpoint_dir=checkpoint,
                          runtime_checkpoint=plan.runtime_checkpoint, cache_key=plan.cache_key)
