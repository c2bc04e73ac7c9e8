"""Resolver: newest-that-fits, driver policies, arch and precision rules, typed rejections.

Every test resolves against the frozen matrix (tests/fixtures/compat_frozen), and each expected
answer is written out from its rows: its vLLM rows are 0.8.0 .. 0.33.0 (16 releases, newest
first 0.33.0, 0.26.0, 0.24.0, 0.22.0, 0.21.0, 0.20.2, 0.19.1, ...), TensorRT-LLM 1.0.0, 1.1.0, 1.2.1."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgfab.errors import CompatibilityError, RecipeError
from imgfab.recipe import parse_recipe
from imgfab.stack.resolve import Host, fits_host, resolve
from imgfab.in_image.rules import compare_versions

from conftest import FROZEN_COMPAT, FROZEN_RECIPES


def _recipe(name: str = "qwen2-7b-h100", **changes) -> dict:
    data = yaml.safe_load((FROZEN_RECIPES / f"{name}.yaml").read_text())
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return data


@pytest.mark.parametrize("path", sorted(FROZEN_RECIPES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_resolves_deterministically(path, frozen_matrix):
    data = yaml.safe_load(path.read_text())
    first = resolve(parse_recipe(copy.deepcopy(data)), frozen_matrix).stack
    second = resolve(parse_recipe(copy.deepcopy(data)), frozen_matrix).stack
    assert first == second
    assert first.cuda.count(".") == 2
    assert compare_versions(first.fleet_driver, first.driver_floor) >= 0


def test_newest_that_fits_is_chosen(frozen_matrix):
    """A driver past every floor: vLLM 0.33.0, the newest vllm.yaml row, with the torch it pins
    (2.14.0: cuda_runtime 13.0.3, toolkit 13.0.3 at 580.95.05) on the supported 13.0 tag (13.0.3)."""
    stack = resolve(parse_recipe(_recipe(**{"target__driver_policy": "strict",
                                            "target__driver": ">=999.0"})), frozen_matrix).stack
    assert (stack.backend_version, stack.torch, stack.cuda) == ("0.33.0", "2.14.0", "13.0.3")
    assert stack.driver_floor == "580.95.05"


def test_newest_that_fits_skips_releases_past_the_driver(frozen_matrix):
    """580.82.07 strict: 0.20.2 .. 0.33.0 need 580.95.05 (torch 2.11.0 / 2.14.0: cuda_runtime
    13.0.2 / 13.0.3), so the newest that fits is 0.19.1 (torch 2.10.0: cudart 12.8.90 → 12.8.1, 570.124.06)."""
    stack = resolve(parse_recipe(_recipe(**{"target__driver_policy": "strict",
                                            "target__driver": ">=580.82.07"})), frozen_matrix).stack
    assert (stack.backend_version, stack.torch, stack.driver_floor) == ("0.19.1", "2.10.0", "570.124.06")


def test_version_pin_is_honoured(frozen_matrix):
    """==0.14.0 on a driver 0.33.0 would fit: the pin wins (0.14.0 pins torch 2.9.1)."""
    stack = resolve(parse_recipe(_recipe(**{"backend__version": "==0.14.0",
                                            "target__driver": ">=999.0"})), frozen_matrix).stack
    assert (stack.backend_version, stack.torch) == ("0.14.0", "2.9.1")


def test_fp8_on_v100_names_the_field_and_capability(frozen_matrix):
    """vLLM's Fp8Config.get_min_capability() is 75 from 0.14.0 (8.9 is where native FP8 starts):
    a V100 (7.0) is refused at 7.5, an A100 is served weight-only (tests/stack/test_quant_floors.py)."""
    data = _recipe(**{"target__gpu": "V100", "target__driver": ">=580.65.06", "engine__dtype": "float16",
                      "engine__kv_cache_dtype": "auto", "target__driver_policy": "strict"})
    with pytest.raises(CompatibilityError) as info:
        resolve(parse_recipe(data), frozen_matrix)
    line = info.value.one_line()
    assert line.startswith("engine.quantization:"), line
    assert "fp8 needs compute capability ≥ 7.5" in line and "7.0" in line
    assert info.value.exit_code == 2
    assert all(reason for _, reason in info.value.rejections)


def test_strict_driver_too_old_suggests_minor_compat(frozen_matrix):
    data = _recipe(**{"target__driver_policy": "strict", "target__driver": ">=535.104.05"})
    with pytest.raises(CompatibilityError) as info:
        resolve(parse_recipe(data), frozen_matrix)
    assert info.value.field == "target.driver"
    assert info.value.fix.startswith("target.driver_policy: minor-compat ")
    assert "(vllm 0.19.1, torch 2.10.0, CUDA 12.8.2 image, ubuntu24.04;" in info.value.fix
    # Every candidate is listed with the constraint that eliminated it.
    assert [candidate.split(" (")[0] for candidate, _ in info.value.rejections] == [
        "vllm 0.33.0", "vllm 0.26.0", "vllm 0.24.0", "vllm 0.22.0", "vllm 0.21.0", "vllm 0.20.2",
        "vllm 0.19.1", "vllm 0.16.0", "vllm 0.14.0", "vllm 0.13.0", "vllm 0.10.1.1", "vllm 0.10.1",
        "vllm 0.9.2", "vllm 0.8.5.post1", "vllm 0.8.5", "vllm 0.8.0"]
    reasons = dict(info.value.rejections)
    assert reasons["vllm 0.8.0 (CUDA 12.4.1, ubuntu22.04)"].startswith(
        "driver: host driver 535.104.05 is older than 550.54.15, the strict floor for CUDA 12.4.1")


def test_minor_compat_accepts_535_with_limits_stated(frozen_matrix):
    """CUDA 13 needs 580 even under minor-compat; the newest CUDA 12 release is 0.19.1, whose floor
    is CUDA 12's minor-version floor (525.60.13), its strict floor 570.124.06 (cudart 12.8.90)."""
    stack = resolve(parse_recipe(_recipe()), frozen_matrix, Host(driver="535.104.05")).stack
    assert (stack.driver_policy, stack.backend_version, stack.cuda) == ("minor-compat", "0.19.1", "12.8.2")
    assert (stack.driver_floor, stack.strict_floor) == ("525.60.13", "570.124.06")
    assert stack.nvidia_require_cuda == "cuda>=12.0"
    assert any("minor-version compatibility" in note for note in stack.notes)


def test_strict_guard_names_the_image_cuda(frozen_matrix):
    stack = resolve(parse_recipe(_recipe(**{"target__driver_policy": "strict",
                                            "target__driver": ">=999.0"})), frozen_matrix).stack
    assert (stack.cuda, stack.nvidia_require_cuda) == ("13.0.3", "cuda>=13.0")


def test_driver_too_old_for_anything(frozen_matrix):
    data = _recipe(**{"target__driver": ">=418.39"})
    with pytest.raises(CompatibilityError) as info:
        resolve(parse_recipe(data), frozen_matrix)
    assert info.value.field == "target.driver"
    assert "16 candidates rejected, every candidate the recipe admits fails driver" in info.value.message
    assert info.value.fix.startswith("raise target.driver to ≥ 525.60.13 (vllm 0.19.1, torch 2.10.0, ")


def test_unknown_gpu_is_a_recipe_error(frozen_matrix):
    with pytest.raises(RecipeError) as info:
        resolve(parse_recipe(_recipe(**{"target__gpu": "GTX-9999"})), frozen_matrix)
    assert info.value.one_line().startswith("target.gpu:")
    assert "H100-SXM" in info.value.fix


def test_rtx4090_is_sm89(frozen_matrix):
    assert frozen_matrix.gpu("RTX-4090").compute_capability == "8.9"
    assert frozen_matrix.gpu("A100-80GB").compute_capability == "8.0"
    assert frozen_matrix.gpu("H100").compute_capability == "9.0"


def test_nvfp4_needs_blackwell_on_tensorrt_llm(frozen_matrix):
    data = _recipe("llama31-8b-h100-fp8-engine", **{"engine__quantization": "nvfp4"})
    with pytest.raises(CompatibilityError) as info:
        resolve(parse_recipe(data), frozen_matrix)
    assert "nvfp4" in info.value.one_line() and "10.0" in info.value.one_line()


def test_engine_path_is_exact_arch(frozen_matrix):
    stack = resolve(parse_recipe(_recipe("llama31-8b-h100-fp8-engine")), frozen_matrix).stack
    assert stack.arch_exact and stack.archs == ("9.0",)
    assert (stack.backend_version, stack.tensorrt) == ("1.2.1", "~=10.14.1")


_drivers = st.tuples(st.integers(300, 700), st.integers(0, 200), st.integers(0, 99)).map(
    lambda t: f"{t[0]}.{t[1]}.{t[2]:02d}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(driver=_drivers, gpu=st.sampled_from(["H100-SXM", "A100-80GB", "L4", "L40S", "T4", "V100", "B200",
                                            "RTX-4090"]),
       quant=st.sampled_from(["none", "fp8", "int4_awq", "nvfp4", "int8_sq"]),
       policy=st.sampled_from(["strict", "minor-compat"]),
       backend=st.sampled_from(["vllm", "tensorrt-llm"]))
def test_property_resolver_returns_a_fitting_stack_or_a_typed_error(frozen_matrix, driver, gpu, quant, policy, backend):
    data = _recipe(**{"target__gpu": gpu, "target__driver": f">={driver}", "target__driver_policy": policy,
                      "engine__quantization": quant, "engine__kv_cache_dtype": "auto",
                      "backend__name": backend,
                      "backend__trtllm_path": "pytorch" if backend == "tensorrt-llm" else None})
    try:
        stack = resolve(parse_recipe(data), frozen_matrix).stack
    except (CompatibilityError, RecipeError) as error:
        assert "\n" not in error.one_line()
        return
    assert compare_versions(driver, stack.driver_floor) >= 0
    assert stack.gpu == frozen_matrix.gpu(gpu).name


def test_a_later_os_can_fit_when_the_first_cannot(frozen_matrix):
    # vLLM 0.8.x is CUDA 12.4, published for ubuntu22.04 only: the ubuntu24.04 miss must not
    # sink the ubuntu22.04 stack that fits a 550.54.15 host under the strict policy.
    rows = fits_host(frozen_matrix, "L40S", "550.54.15", "strict")
    fitting = {r.version: (f["os"].name, f["toolkit"].version) for r, f, _ in rows if f is not None}
    assert fitting == {"0.8.5.post1": ("ubuntu22.04", "12.4.1"), "0.8.5": ("ubuntu22.04", "12.4.1"),
                       "0.8.0": ("ubuntu22.04", "12.4.1")}


# --- issue 10: the payload decides (torch's CUDA runtime and code, per-GPU driver minimum) -------

def _fails(matrix, recipe: dict) -> CompatibilityError:
    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(recipe), matrix)
    return caught.value


def _vllm_bf16(gpu: str, driver: str, **changes) -> dict:
    return _recipe("llama31-8b-l4", target__gpu=gpu, target__driver=f">={driver}", **changes)


def test_b200_with_vllm_0_10_1_is_refused_for_torch_kernels(frozen_matrix):
    """vLLM 0.10.1 ships sm_100, but its torch 2.7.1 (PyPI, cu126) has no sm_100 code."""
    error = _fails(frozen_matrix, _vllm_bf16("B200", "580.65.06", backend__version="==0.10.1"))
    assert "vllm 0.10.1: B200 (compute capability 10.0) has no code in torch 2.7.1" in str(error)
    assert "sm_90; PTX none" in str(error)
    assert error.fix.startswith("backend.version: '==0.19.1'")


def test_tensorrt_llm_on_b200_570_never_pairs_torch_2_7_1(frozen_matrix):
    recipe = _recipe("mistral-7b-a100-trtllm", target__gpu="B200", target__driver=">=570.124.06",
                     target__driver_policy=None, backend__version=None)
    error = _fails(frozen_matrix, recipe)
    reasons = dict(error.rejections)
    assert "has no code in torch 2.7.1" in reasons["tensorrt-llm 1.0.0"]
    assert "590.48.01" in str(error)  # 1.2.x: CUDA 13.1 toolkit in the payload
    assert error.fix.startswith("raise target.driver to ≥ 580.95.05 (tensorrt-llm 1.1.0")


def test_rtx5090_needs_r570(frozen_matrix):
    error = _fails(frozen_matrix, _vllm_bf16("RTX-5090", "560.35.03"))
    assert "RTX-5090 (blackwell) needs driver ≥ 570.26 (R570)" in str(error)
    assert error.field == "target.driver"
    assert error.fix.startswith("raise target.driver to ≥ 570.124.06")


def test_h100_strict_floor_is_the_payload_runtime_not_the_image_patch(frozen_matrix):
    """torch 2.8–2.10 bring cudart 12.8.90 (CUDA 12.8.1: 570.124.06), so 570.86.15 gets torch 2.7.1."""
    stack = resolve(parse_recipe(_recipe(target__driver=">=570.86.15", target__driver_policy="strict")),
                    frozen_matrix).stack
    assert (stack.backend_version, stack.torch) == ("0.10.1.1", "2.7.1")
    assert (stack.payload_runtime, stack.payload_runtime_toolkit) == ("12.6.77", "12.6.2")
    assert stack.strict_floor == stack.driver_floor == "560.35.03"
    assert any("comes from torch 2.7.1 (CUDA runtime 12.6.77)" in n for n in stack.notes)


def test_l40s_strict_580_65_06_stays_on_cuda_12_8_runtime(frozen_matrix):
    """torch 2.11+ bring CUDA 13.0.2/13.0.3 (580.95.05): too new for 580.65.06 under strict."""
    stack = resolve(parse_recipe(_vllm_bf16("L40S", "580.65.06", target__driver_policy="strict")),
                    frozen_matrix).stack
    assert (stack.backend_version, stack.torch, stack.payload_runtime) == ("0.19.1", "2.10.0", "12.8.90")
    assert stack.driver_floor == "570.124.06"
    rejected = resolve(parse_recipe(_vllm_bf16("L40S", "580.65.06")), frozen_matrix).rejections
    reasons = {r.candidate.split(" (")[0]: r.reason for r in rejected}
    assert "580.95.05" in reasons["vllm 0.33.0"] and "torch 2.14.0 (CUDA runtime 13.0.3)" in reasons["vllm 0.33.0"]


def test_t4_on_r470_names_the_smallest_driver_upgrade(frozen_matrix):
    """The cheapest real fix: vLLM 0.8.5.post1 + torch 2.6.0 (cudart 12.4.127 → CUDA 12.4.1)."""
    error = _fails(frozen_matrix, _vllm_bf16("T4", "470.82.01", engine__dtype="float16"))
    assert error.fix.startswith("raise target.driver to ≥ 550.54.15 (vllm 0.8.5.post1, torch 2.6.0")


def test_vllm_0_9_2_nvfp4_needs_8_0(frozen_matrix):
    error = _fails(frozen_matrix, _vllm_bf16("T4", "580.65.06", backend__version="==0.9.2",
                                      engine__quantization="nvfp4", engine__dtype="float16"))
    assert "vllm 0.9.2: nvfp4 needs compute capability ≥ 8.0; T4 is 7.5" in str(error)
    stack = resolve(parse_recipe(_vllm_bf16("A100-80GB", "580.65.06", backend__version="==0.9.2",
                                            engine__quantization="nvfp4")), frozen_matrix).stack
    assert stack.backend_version == "0.9.2"
    assert "nvfp4 on sm_80 runs weight-only (Marlin W4A16); native NVFP4 needs compute capability ≥ 10.0" \
        in stack.notes


def test_nvfp4_on_hopper_says_weight_only(frozen_matrix):
    stack = resolve(parse_recipe(_vllm_bf16("H100-SXM", "580.65.06", engine__quantization="nvfp4")),
                    frozen_matrix).stack
    assert "nvfp4 on sm_90 runs weight-only (Marlin W4A16); native NVFP4 needs compute capability ≥ 10.0" \
        in stack.notes


@pytest.mark.parametrize("name", ["llama31-8b-h100-fp8-engine", "mistral-7b-a100-trtllm",
                                  "qwen2-7b-l40s-awq-engine"])
def test_tensorrt_llm_examples_get_a_cuda13_torch(frozen_matrix, name):
    stack = resolve(parse_recipe(_recipe(name)), frozen_matrix).stack
    assert (stack.backend_version, stack.torch) == ("1.2.1", "2.9.1+cu130")
    assert stack.torch_index == "https://download.pytorch.org/whl/cu130"
    assert stack.cuda == "13.1.2"


def test_pypi_torch_is_never_paired_with_tensorrt_llm_1_2(frozen_matrix):
    release = next(r for r in frozen_matrix.backend_releases("tensorrt-llm") if r.version == "1.2.1")
    from imgfab.stack.resolve import _torch_pin
    assert _torch_pin(frozen_matrix, release) == "2.9.1+cu130"
    vllm = next(r for r in frozen_matrix.backend_releases("vllm") if r.version == "0.16.0")
    assert _torch_pin(frozen_matrix, vllm) == "2.9.1"  # vLLM installs PyPI's torch, not the cu130 build


@pytest.mark.parametrize("gpu", ["GH200", "GB200", "GB300"])
def test_aarch64_superchips_are_refused_in_one_line(frozen_matrix, gpu):
    with pytest.raises(RecipeError) as caught:
        resolve(parse_recipe(_recipe(target__gpu=gpu)), frozen_matrix)
    assert caught.value.field == "target.gpu"
    assert "aarch64" in str(caught.value) and "linux/amd64" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_resolve_json_shows_payload_runtime_and_floor(tmp_path):
    import json

    from click.testing import CliRunner

    from imgfab.cli import cli

    result = CliRunner().invoke(cli, ["resolve", str(FROZEN_RECIPES / "llama31-8b-l4.yaml"), "--json",
                                          "--compat-dir", str(FROZEN_COMPAT)])
    assert result.exit_code == 0, result.output
    stack = json.loads(result.output)["stack"]
    assert stack["payload_runtime"] == "12.8.90" and stack["payload_runtime_toolkit"] == "12.8.1"
    assert stack["strict_floor"] == "570.124.06"
    assert "torch 2.10.0" in stack["payload_runtime_from"]


def test_supported_tags_are_preferred_over_end_of_life(frozen_matrix):
    stack = resolve(parse_recipe(_recipe("llama31-8b-l4")), frozen_matrix).stack
    assert stack.cuda == "12.8.2" and not stack.image_eol
    eol = resolve(parse_recipe(_recipe("llama31-8b-l4", image__os="ubuntu22.04",
                                       backend__version="==0.8.5.post1", target__driver=">=550.54.15")),
                  frozen_matrix).stack
    assert eol.cuda == "12.4.1" and not eol.image_eol


def test_forward_compat_on_a_datacenter_branch_keeps_cuda_compat(frozen_matrix):
    recipe = _vllm_bf16("H100-SXM", "535.104.05", target__driver_policy="forward-compat")
    stack = resolve(parse_recipe(recipe), frozen_matrix).stack
    assert stack.driver_policy == "forward-compat" and stack.cuda_compat == "keep"
    assert stack.nvidia_require_cuda == "cuda>=11.0" and stack.driver_floor == "535"
    assert any("reaches end of life 2026-06" in n for n in stack.notes)
    strict = resolve(parse_recipe(_vllm_bf16("H100-SXM", "580.95.05")), frozen_matrix).stack
    assert strict.cuda_compat == "drop"


def test_forward_compat_is_refused_on_geforce_and_unlisted_branches(frozen_matrix):
    error = _fails(frozen_matrix, _vllm_bf16("RTX-4090", "535.104.05", target__driver_policy="forward-compat"))
    assert "RTX-4090 is not a datacenter GPU" in str(error)
    error = _fails(frozen_matrix, _vllm_bf16("H100-SXM", "550.54.15", target__driver_policy="forward-compat"))
    assert "driver branch R550 is not a forward-compatibility branch" in str(error)


def test_only_an_end_of_life_tag_fits_and_the_stack_says_so(frozen_matrix):
    """TensorRT-LLM links the devel image's CUDA: on 590.44.01 strict only 13.1.0 (EOL) fits."""
    recipe = _recipe("mistral-7b-a100-trtllm", target__driver=">=590.44.01", target__driver_policy="strict")
    stack = resolve(parse_recipe(recipe), frozen_matrix).stack
    assert (stack.cuda, stack.image_eol, stack.driver_floor) == ("13.1.0", True, "590.44.01")
    assert any(n.startswith("only an end-of-life tag fits: nvidia/cuda:13.1.0-devel-ubuntu24.04")
               for n in stack.notes)
