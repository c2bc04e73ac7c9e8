"""Issue 20 (compatibility truth, round 3, part 2): quantization floors and fallbacks per vLLM
release, read from each release's own source (compat/precisions.yaml names the files).

The expected answers, from vllm-project/vllm at the release tags (the Python files of each
release's PyPI wheel):
- fp8 (online, ``--quantization fp8``): ``Fp8Config.get_min_capability()`` is 80 in 0.8.0-0.13.0
  and 75 from 0.14.0; below 8.9 (``has_device_capability(89)`` / ``supports_fp8()``) the
  linear layers run weight-only through FP8 Marlin.
- GPTQ: ``GPTQConfig`` / ``AutoGPTQConfig.get_min_capability()`` is 60 in every release.
- AWQ: ``AWQConfig`` / ``AutoAWQConfig.get_min_capability()`` is 75 in every release.
- int8 W8A8: ``CompressedTensorsW8A8Int8.get_min_capability()`` is 75 in every release.
- nvfp4: ``ModelOptNvFp4Config.get_min_capability()`` is 100 in 0.8.x, 80 in 0.9.0-0.13.0, 75 from
  0.14.0; FP4 Marlin (weight-only) first ships in 0.9.0.
- fp8 KV cache: 0.8.0/0.8.1 run it on the V0 engine only; 0.8.2-0.9.2 keep V1 only with
  FlashAttention 3 (major 9); 0.10.x also on exactly 10.0; from 0.11.0 V1 selects a backend.

The stacks are resolved against the frozen matrix (tests/fixtures/compat_frozen) on driver
580.65.06 under strict: the CUDA 13 releases need 580.95.05, so an unpinned recipe gets 0.19.1.
"""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from imgfab.cli import cli
from imgfab.errors import CompatibilityError, RecipeError
from imgfab.recipe import parse_recipe
from imgfab.stack.resolve import resolve

from conftest import FROZEN_COMPAT, FROZEN_RECIPES

MARLIN = "fp8 on sm_{} runs weight-only (FP8 Marlin W8A16); native fp8 needs compute capability ≥ 8.9"


def _recipe(gpu: str, quantization: str = "fp8", version: str | None = None, *, kv: str = "auto",
            backend: str = "vllm", driver: str = ">=580.65.06") -> dict:
    data = yaml.safe_load((FROZEN_RECIPES / "qwen2-7b-h100.yaml").read_text())
    data["target"].update(gpu=gpu, driver=driver, driver_policy="strict")
    data["engine"].update(quantization=quantization, dtype="float16", kv_cache_dtype=kv)
    if version:
        data["backend"]["version"] = version
    data["backend"]["name"] = backend
    return data


def _stack(matrix, *args, **kwargs):
    return resolve(parse_recipe(_recipe(*args, **kwargs)), matrix).stack


def _refusal(matrix, *args, **kwargs) -> str:
    with pytest.raises(CompatibilityError) as info:
        resolve(parse_recipe(_recipe(*args, **kwargs)), matrix)
    assert info.value.exit_code == 2
    return info.value.one_line()


# --- fp8: the floor moved from 8.0 to 7.5 in 0.14.0; native from 8.9 throughout ---------------

def test_fp8_floor_is_8_0_up_to_0_13_and_names_the_marlin_fallback(frozen_matrix):
    line = _refusal(frozen_matrix, "T4", version="==0.13.0")
    assert line.startswith("engine.quantization:"), line
    assert ("vllm 0.13.0: fp8 needs compute capability ≥ 8.0; T4 is 7.5 (vllm 0.13.0 runs it "
            "weight-only (FP8 Marlin W8A16) from 8.0; native needs compute capability ≥ 8.9)") in line
    # the nearest fix is a release past the lowered floor (the newest that fits), not another quantization
    assert "fix: backend.version: '==0.19.1' (vllm 0.19.1, torch 2.10.0, CUDA 12.8.2 image" in line


def test_fp8_from_0_14_runs_weight_only_on_turing(frozen_matrix):
    stack = _stack(frozen_matrix, "T4", version="==0.14.0")
    assert stack.backend_version == "0.14.0" and stack.precision_min_cc == "7.5"
    assert MARLIN.format("75") in stack.notes


@pytest.mark.parametrize("version, picked", [("==0.9.2", "0.9.2"), ("==0.19.1", "0.19.1"), (None, "0.19.1")])
def test_fp8_on_ampere_is_served_weight_only_not_refused(frozen_matrix, version, picked):
    stack = _stack(frozen_matrix, "A100-80GB", version=version)
    assert stack.backend_version == picked
    assert MARLIN.format("80") in stack.notes


@pytest.mark.parametrize("gpu", ["L40S", "H100-SXM"])
def test_fp8_from_8_9_is_native(frozen_matrix, gpu):
    stack = _stack(frozen_matrix, gpu)
    assert not [n for n in stack.notes if n.startswith("fp8 on")]


def test_fp8_on_volta_is_refused_at_the_fallback_floor(frozen_matrix):
    line = _refusal(frozen_matrix, "V100")
    assert "fp8 needs compute capability ≥ 7.5; V100 is 7.0" in line
    assert "weight-only (FP8 Marlin W8A16) from 7.5; native needs compute capability ≥ 8.9" in line


# --- GPTQ: offered, floor 6.0; TensorRT-LLM's quantize.py has no GPTQ format ------------------

def test_gptq_is_a_recipe_quantization():
    assert parse_recipe(_recipe("T4", "gptq")).engine.quantization == "gptq"
    with pytest.raises(RecipeError):
        parse_recipe(_recipe("T4", "gptq4"))


def test_gptq_serves_volta_where_awq_and_fp8_do_not(frozen_matrix):
    stack = _stack(frozen_matrix, "V100", "gptq")
    assert stack.precision == "gptq" and stack.precision_min_cc == "6.0"
    assert "int4_awq needs compute capability ≥ 7.5; V100 is 7.0" in _refusal(frozen_matrix, "V100", "int4_awq")


def test_gptq_render_passes_no_quantization_flag(frozen_matrix):
    """vLLM reads GPTQ from the checkpoint's quantization_config; only online fp8 needs the flag."""
    from imgfab.render.context import serve_commands

    recipe = parse_recipe(_recipe("T4", "gptq"))
    argv = next(iter(serve_commands(recipe, resolve(recipe, frozen_matrix).stack).values()))
    assert "--quantization" not in argv


def test_gptq_under_tensorrt_llm_is_refused_with_the_reason(frozen_matrix):
    data = yaml.safe_load((FROZEN_RECIPES / "mistral-7b-a100-trtllm.yaml").read_text())
    data["engine"]["quantization"] = "gptq"
    with pytest.raises(CompatibilityError) as info:
        resolve(parse_recipe(data), frozen_matrix)
    assert "does not support gptq" in info.value.one_line()


# --- AWQ, int8 W8A8: 7.5 in every release ---------------------------------------------------

@pytest.mark.parametrize("quantization", ["int4_awq", "int8_sq"])
def test_awq_and_int8_floor_is_7_5_in_the_oldest_and_newest_release(frozen_matrix, quantization):
    for version, picked in (("==0.8.0", "0.8.0"), (None, "0.19.1")):
        stack = _stack(frozen_matrix, "T4", quantization, version)
        assert (stack.backend_version, stack.precision_min_cc) == (picked, "7.5")
    assert f"{quantization} needs compute capability ≥ 7.5" in _refusal(frozen_matrix, "V100", quantization)


# --- nvfp4: 10.0 in 0.8.x (no FP4 Marlin yet), 8.0 in 0.9-0.13, 7.5 from 0.14 ------------------

def test_nvfp4_floors_per_release(frozen_matrix):
    assert "vllm 0.8.5: nvfp4 needs compute capability ≥ 10.0; A100-80GB is 8.0;" in \
        _refusal(frozen_matrix, "A100-80GB", "nvfp4", "==0.8.5")
    assert "nvfp4 needs compute capability ≥ 8.0; T4 is 7.5" in _refusal(frozen_matrix, "T4", "nvfp4", "==0.13.0")
    stack = _stack(frozen_matrix, "T4", "nvfp4", "==0.14.0")
    assert "nvfp4 on sm_75 runs weight-only (Marlin W4A16); native NVFP4 needs compute capability ≥ 10.0" \
        in stack.notes


# --- fp8 KV cache: the V0 fallback of the 0.8-0.10 releases ----------------------------------

def test_kv_fp8_before_0_11_says_where_v1_takes_it(frozen_matrix):
    a100 = _stack(frozen_matrix, "A100-80GB", "none", "==0.9.2", kv="fp8")
    assert ("kv_fp8 on sm_80 runs on the V0 engine (vLLM's V1 engine takes an fp8 KV cache only "
            "through FlashAttention 3); native kv_fp8 needs compute capability 9.0") in a100.notes
    assert not [n for n in _stack(frozen_matrix, "H100-SXM", "none", "==0.9.2", kv="fp8").notes
                if n.startswith("kv_fp8")]
    oldest = _stack(frozen_matrix, "H100-SXM", "none", "==0.8.0", kv="fp8")
    assert any(n.startswith("kv_fp8 on sm_90 runs on the V0 engine") and "on no GPU in this release" in n
               for n in oldest.notes)
    rule = frozen_matrix.precision_rule("vllm", "kv_fp8", "0.10.1")
    assert rule.native_on("10.0") and rule.native_on("9.0") and not rule.native_on("10.3")
    assert not [n for n in _stack(frozen_matrix, "A100-80GB", "none", kv="fp8").notes if n.startswith("kv_fp8")]


def test_resolve_json_carries_the_fallback_note(tmp_path):
    path = tmp_path / "t4-fp8.yaml"
    path.write_text(yaml.safe_dump(_recipe("T4")))
    result = CliRunner().invoke(cli, ["resolve", str(path), "--json", "--compat-dir", str(FROZEN_COMPAT)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert MARLIN.format("75") in data["stack"]["notes"]
