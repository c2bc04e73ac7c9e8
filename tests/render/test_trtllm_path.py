"""TensorRT-LLM paths: every rendered command checked against the recorded flags, the cache key,
the compile strategy, and the two-phase orchestration with a recording fake engine (no GPU)."""

from __future__ import annotations

import ast
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from imgfab.render import trtllm
from imgfab.errors import CompatibilityError, EngineError
from imgfab.recipe import load_recipe
from imgfab.render.context import render_context
from imgfab.stack.resolve import resolve
from imgfab.render.trtllm_flags import check_command, load_flags

from conftest import REPO

ENGINE_RECIPES = ["llama31-8b-h100-fp8-engine", "qwen2-7b-l40s-awq-engine"]
PYTORCH_RECIPE = "mistral-7b-a100-trtllm"


def _load(name, matrix):
    recipe = load_recipe(REPO / "recipes" / f"{name}.yaml")
    return recipe, resolve(recipe, matrix).stack


def _table(argv):
    if argv[0] == "python3":
        return trtllm.QUANTIZE_TABLE
    return argv[0]


@pytest.mark.parametrize("name", ENGINE_RECIPES)
@pytest.mark.parametrize("strategy", ["two-phase", "at-start"])
def test_every_rendered_engine_command_exists(name, strategy, matrix):
    recipe, stack = _load(name, matrix)
    files = render_context(recipe, stack, matrix, engine_strategy=strategy)
    flags = load_flags(stack.backend_version)
    script = files["imgfab-compile.sh"]
    commands = [shlex.split(line.split("=(", 1)[1].rstrip(")"))
                for line in script.splitlines() if line.strip().startswith(("checkpoint=(", "build=("))]
    entry = files["entrypoint.sh"]
    commands += [shlex.split(line.strip().removeprefix("exec ").removeprefix("step "))
                 for line in entry.splitlines()
                 if line.strip().startswith(("exec trtllm-serve", "step trtllm-refit"))]
    assert len(commands) == 4 + 2 + (1 if strategy == "two-phase" else 0)
    for argv in commands:
        assert check_command(argv[1:], flags, _table(argv)) == [], argv
    plan = trtllm.engine_plan(recipe, stack, strategy=strategy)
    assert "--strip_plan" in plan.build_argv and "--strip_plan" not in plan.start_build_argv
    assert files["Dockerfile"].count("COPY engine/") == (1 if strategy == "two-phase" else 0)
    labels = {k: v for k, v in plan.labels.items()}
    assert labels["org.imgfab.engine.cc"] == stack.compute_capability
    assert labels["org.imgfab.engine.strip_plan"] == ("true" if strategy == "two-phase" else "false")
    assert f'org.imgfab.engine.cache_key="{plan.cache_key}"' in files["Dockerfile"]


def test_quantize_argv_matches_recipe(matrix):
    recipe, stack = _load("llama31-8b-h100-fp8-engine", matrix)
    argv = trtllm.engine_plan(recipe, stack).checkpoint_argv
    pairs = dict(zip(argv[2::2], argv[3::2]))
    assert pairs == {"--model_dir": "/models/llama3.1-8b", "--output_dir": "/opt/imgfab/out/checkpoint",
                     "--dtype": "bfloat16", "--qformat": "fp8", "--tp_size": "1", "--pp_size": "1",
                     "--kv_cache_dtype": "fp8", "--calib_dataset": trtllm.CALIBRATION_DIR,
                     "--calib_size": "512"}
    awq, awq_stack = _load("qwen2-7b-l40s-awq-engine", matrix)
    awq_argv = trtllm.engine_plan(awq, awq_stack).checkpoint_argv
    assert awq_argv[awq_argv.index("--qformat") + 1] == "int4_awq" and "--kv_cache_dtype" not in awq_argv


def test_unquantized_recipe_converts_with_full_prec(matrix):
    recipe, stack = _load("llama31-8b-h100-fp8-engine", matrix)
    plain = recipe.model_copy(update={"engine": recipe.engine.model_copy(
        update={"quantization": "none", "calibration": None, "kv_cache_dtype": "auto"})})
    argv = trtllm.engine_plan(plain, stack).checkpoint_argv
    assert argv[argv.index("--qformat") + 1] == "full_prec" and "--calib_dataset" not in argv


def test_quantize_script_flags_are_quantize_py_flags(matrix):
    recipe, stack = _load("llama31-8b-h100-fp8-engine", matrix)
    source = render_context(recipe, stack, matrix)["imgfab-quantize.py"]
    table = load_flags(stack.backend_version).command(trtllm.QUANTIZE_TABLE)[0]
    names = [node.args[0].value for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"]
    assert names and all(name in table.flags for name in names)
    for node in ast.walk(ast.parse(source)):  # same choices as the recorded quantize.py
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for kw in node.keywords:
                if kw.arg == "choices":
                    assert set(ast.literal_eval(kw.value)) <= set(table.flags[node.args[0].value].choices)


def test_pytorch_path_serves_the_checkpoint(matrix):
    recipe, stack = _load(PYTORCH_RECIPE, matrix)
    files = render_context(recipe, stack, matrix)
    assert "imgfab-compile.sh" not in files and "COPY engine/" not in files["Dockerfile"]
    line = next(l for l in files["entrypoint.sh"].splitlines() if "exec trtllm-serve" in l)
    argv = shlex.split(line.strip().removeprefix("exec "))
    assert argv[:2] == ["trtllm-serve", recipe.model.mount_path]
    assert argv[argv.index("--backend") + 1] == "pytorch" and argv[argv.index("--tp_size") + 1] == "2"
    assert check_command(argv[1:], load_flags(stack.backend_version), "trtllm-serve") == []


@pytest.mark.parametrize("command,flag,pointer", [
    ("trtllm-build", "--quantization_type", "quantize.py --qformat"),
    ("trtllm-build", "--max_output_len", "--max_seq_len"),
    ("trtllm-build", "--tp_size", "quantize.py --tp_size"),
])
def test_tutorial_flags_are_rejected_with_pointer(command, flag, pointer, matrix):
    _, stack = _load("llama31-8b-h100-fp8-engine", matrix)
    flags = trtllm.flag_table(stack)
    with pytest.raises(CompatibilityError) as err:
        trtllm.check_argv([command, "--checkpoint_dir", "c", flag, "1"], flags, command)
    assert pointer in err.value.message and flag in err.value.message


def test_release_without_flag_table_is_refused(matrix):
    recipe, stack = _load("llama31-8b-h100-fp8-engine", matrix)
    old = replace(stack, backend_version="1.1.0")
    with pytest.raises(CompatibilityError) as err:
        trtllm.engine_plan(recipe, old)
    assert "compat/trtllm_flags/1.1.0.yaml" in err.value.one_line()
    with pytest.raises(CompatibilityError):
        render_context(recipe, old, matrix)


def test_cache_key_changes_with_each_component():
    base = ("9.0", "10.14.1.48.post1", "1.2.1", "a" * 64)
    keys = {trtllm.engine_cache_key(*base)}
    for i, other in enumerate(("8.9", "10.14.1.48", "1.2.0", "b" * 64)):
        parts = list(base)
        parts[i] = other
        keys.add(trtllm.engine_cache_key(*parts))
    assert len(keys) == 5
    shell = subprocess.run(["bash", "-c", "printf '%s\\n' \"$@\" | sha256sum", "x", *base],
                           capture_output=True, text=True, check=True).stdout.split()[0]
    assert shell == trtllm.engine_cache_key(*base)


def test_cache_key_follows_the_recipe(matrix):
    recipe, stack = _load("llama31-8b-h100-fp8-engine", matrix)
    changed = recipe.model_copy(update={"engine": recipe.engine.model_copy(update={"max_batch_size": 32})})
    a, b = trtllm.engine_plan(recipe, stack), trtllm.engine_plan(changed, stack)
    assert a.cache_key != b.cache_key and a.cache_dir.endswith(a.cache_key)
    assert a.tensorrt == "10.14.1.48.post1"


@pytest.mark.parametrize("caps,requested,expected", [
    (trtllm.EngineCaps(buildkit_device=True, gpu_visible=True), "auto", "buildkit-device"),
    (trtllm.EngineCaps(buildkit_device=False, gpu_visible=True), "auto", "two-phase"),
    (trtllm.EngineCaps(buildkit_device=True, gpu_visible=True), "at-start", "at-start"),
    (trtllm.EngineCaps(), "at-start", "at-start"),
])
def test_strategy_choice(caps, requested, expected):
    strategy, reason = trtllm.choose_compile_strategy(caps, requested)
    assert strategy == expected and reason and "\n" not in reason


def test_strategy_refuses_without_gpu_or_device():
    with pytest.raises(CompatibilityError) as err:
        trtllm.choose_compile_strategy(trtllm.EngineCaps(), "auto")
    assert "--engine-at-start" in err.value.one_line()
    with pytest.raises(CompatibilityError, match="RUN --device"):
        trtllm.choose_compile_strategy(trtllm.EngineCaps(gpu_visible=True), "buildkit-device")


class FakeContainer:
    def __init__(self, exit_code):
        self.attrs = {"State": {"ExitCode": exit_code}}
        self.name = "fake"


class RecordingEngine:
    """Records every call; run_container writes what the compile would into the out mount."""

    def __init__(self, exit_code=0):
        self.calls = []
        self.exit_code = exit_code

    def build(self, context_dir, **kwargs):
        self.calls.append(("build", context_dir, kwargs))
        return type("Built", (), {"hold_ref": "imgfab-unverified/build:recorded"})()

    def remove_image(self, ref):
        self.removed = [*getattr(self, "removed", []), ref]

    def run_container(self, image, **kwargs):
        self.calls.append(("run_container", image, kwargs))
        out = next(Path(src) for src, dst, ro in kwargs["mounts"] if dst == trtllm.COMPILE_OUT)
        if self.exit_code == 0:
            (out / "engine").mkdir(parents=True)
            (out / "engine" / "config.json").write_text("{}")
            (out / "engine" / "rank0.engine").write_bytes(b"stripped")
            (out / "checkpoint").mkdir()
        return FakeContainer(self.exit_code)

    def container_running(self, container):
        self.calls.append(("container_running",))
        return False

    def container_logs(self, container, tail=200):
        return "imgfab-compile: no GPU visible\n"

    def remove_container(self, container):
        self.calls.append(("remove_container",))


def _inputs(tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    context = tmp_path / "ctx"
    context.mkdir()
    return weights, prompts, context


def test_two_phase_runs_builder_with_gpus_and_readonly_mounts(tmp_path, matrix):
    recipe, stack = _load("llama31-8b-h100-fp8-engine", matrix)
    weights, prompts, context = _inputs(tmp_path)
    engine = RecordingEngine()
    result = trtllm.two_phase(context, recipe, stack, engine=engine, weights_dir=weights,
                              calibration_file=prompts, out_dir=tmp_path / "out", poll_s=0)
    kind, ctx, kwargs = engine.calls[0]
    assert kind == "build" and ctx == context and kwargs["target"] == "builder"
    assert engine.removed == ["imgfab-unverified/build:recorded"], "the build's private name goes"
    kind, image, kwargs = engine.calls[1]
    assert kind == "run_container" and image == result.builder_image == kwargs_image(engine)
    assert kwargs["gpus"] == 1
    assert kwargs["mounts"] == [(str(weights.resolve()), "/models/llama3.1-8b", True),
                                (str(prompts.resolve()), trtllm.CALIBRATION_FILE, True),
                                (str((tmp_path / "out").resolve()), trtllm.COMPILE_OUT, False)]
    assert engine.calls[-1] == ("remove_container",)
    assert (context / "engine" / "rank0.engine").read_bytes() == b"stripped"
    assert result.checkpoint_dir == tmp_path / "out" / "checkpoint"
    assert not (context / "checkpoint").exists(), "the checkpoint (weights) stays out of the context"
    assert result.runtime_checkpoint.startswith("/models/llama3.1-8b/imgfab-trtllm/")
    # The builder stage's CMD is the compile command the run relies on.
    dockerfile = render_context(recipe, stack, matrix)["Dockerfile"]
    builder = dockerfile.split("AS runtime")[0]
    assert 'CMD ["/opt/imgfab/bin/imgfab-compile", "two-phase"]' in builder


def kwargs_image(engine):
    return engine.calls[0][2]["tags"][0]


def test_two_phase_reports_compile_failure(tmp_path, matrix):
    recipe, stack = _load("qwen2-7b-l40s-awq-engine", matrix)
    weights, prompts, context = _inputs(tmp_path)
    engine = RecordingEngine(exit_code=5)
    with pytest.raises(EngineError, match="no GPU visible"):
        trtllm.two_phase(context, recipe, stack, engine=engine, weights_dir=weights,
                         calibration_file=prompts, out_dir=tmp_path / "out", poll_s=0)
    assert engine.calls[-1] == ("remove_container",)
    assert not (context / "engine").exists()


def test_two_phase_refuses_output_inside_context(tmp_path, matrix):
    recipe, stack = _load("llama31-8b-h100-fp8-engine", matrix)
    weights, prompts, context = _inputs(tmp_path)
    engine = RecordingEngine()
    with pytest.raises(Exception, match="outside the build context"):
        trtllm.two_phase(context, recipe, stack, engine=engine, weights_dir=weights,
                         calibration_file=prompts, out_dir=context / "out")
    assert engine.calls == []


def test_compile_script_print_and_no_gpu(tmp_path, matrix):
    recipe, stack = _load("llama31-8b-h100-fp8-engine", matrix)
    files = render_context(recipe, stack, matrix)
    script = tmp_path / "imgfab-compile"
    script.write_text(files["imgfab-compile.sh"])
    plan = trtllm.engine_plan(recipe, stack)
    out = subprocess.run(["bash", str(script), "two-phase", "--print"], capture_output=True, text=True)
    assert out.returncode == 0
    assert out.stdout.splitlines() == [" ".join(plan.checkpoint_argv), " ".join(plan.build_argv)]
    env = {"PATH": str(tmp_path)}  # no nvidia-smi on PATH
    out = subprocess.run(["/bin/bash", str(script), "two-phase"], capture_output=True, text=True, env=env)
    assert out.returncode == 5 and "no GPU visible" in out.stderr
