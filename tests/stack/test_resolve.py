"""Resolver: newest-that-fits, driver policies, arch and precision rules, typed rejections."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from packaging.version import Version
from hypothesis import strategies as st

from imgfab.errors import CompatibilityError, RecipeError
from imgfab.recipe import parse_recipe
from imgfab.stack.resolve import Host, fits_host, resolve
from imgfab.in_image.rules import compare_versions

from conftest import RECIPES, REPO


def _recipe(name: str = "qwen2-7b-h100", **changes) -> dict:
    data = yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text())
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


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_example_resolves_deterministically(path, matrix):
    data = yaml.safe_load(path.read_text())
    first = resolve(parse_recipe(copy.deepcopy(data)), matrix).stack
    second = resolve(parse_recipe(copy.deepcopy(data)), matrix).stack
    assert first == second
    assert first.cuda.count(".") == 2
    assert compare_versions(first.fleet_driver, first.driver_floor) >= 0


def test_newest_that_fits_is_chosen(matrix):
    stack = resolve(parse_recipe(_recipe(**{"target__driver_policy": "strict",
                                            "target__driver": ">=999.0"})), matrix).stack
    newest = matrix.backend_releases("vllm")[0]
    assert stack.backend_version == newest.version


def test_version_pin_is_honoured(matrix):
    releases = matrix.backend_releases("vllm")
    older = releases[len(releases) // 2].version
    stack = resolve(parse_recipe(_recipe(**{"backend__version": f"=={older}",
                                            "target__driver": ">=999.0"})), matrix).stack
    assert stack.backend_version == older


def test_fp8_on_v100_names_the_field_and_capability(matrix):
    """vLLM's Fp8Config.get_min_capability() is 75 from 0.14.0 (8.9 is where native FP8 starts):
    a V100 (7.0) is refused at 7.5, an A100 is served weight-only (tests/stack/test_quant_floors.py)."""
    data = _recipe(**{"target__gpu": "V100", "target__driver": ">=580.65.06", "engine__dtype": "float16",
                      "engine__kv_cache_dtype": "auto", "target__driver_policy": "strict"})
    with pytest.raises(CompatibilityError) as info:
        resolve(parse_recipe(data), matrix)
    line = info.value.one_line()
    assert line.startswith("engine.quantization:"), line
    assert "fp8 needs compute capability ≥ 7.5" in line and "7.0" in line
    assert info.value.exit_code == 2
    assert all(reason for _, reason in info.value.rejections)


def test_strict_driver_too_old_suggests_minor_compat(matrix):
    data = _recipe(**{"target__driver_policy": "strict", "target__driver": ">=535.104.05"})
    with pytest.raises(CompatibilityError) as info:
        resolve(parse_recipe(data), matrix)
    assert info.value.field == "target.driver"
    assert "minor-compat" in info.value.fix
    # Every candidate is listed with the constraint that eliminated it.
    assert len(info.value.rejections) == len(matrix.backend_releases("vllm"))


def test_minor_compat_accepts_535_with_limits_stated(matrix):
    stack = resolve(parse_recipe(_recipe()), matrix, Host(driver="535.104.05")).stack
    assert stack.driver_policy == "minor-compat"
    assert compare_versions("535.104.05", stack.driver_floor) >= 0
    assert compare_versions(stack.strict_floor, "535.104.05") > 0
    assert stack.nvidia_require_cuda == f"cuda>={stack.cuda.split('.')[0]}.0"
    assert any("minor-version compatibility" in note for note in stack.notes)


def test_strict_guard_names_the_image_cuda(matrix):
    stack = resolve(parse_recipe(_recipe(**{"target__driver_policy": "strict",
                                            "target__driver": ">=999.0"})), matrix).stack
    major, minor = stack.cuda.split(".")[:2]
    assert stack.nvidia_require_cuda == f"cuda>={major}.{minor}"


def test_driver_too_old_for_anything(matrix):
    data = _recipe(**{"target__driver": ">=418.39"})
    with pytest.raises(CompatibilityError) as info:
        resolve(parse_recipe(data), matrix)
    assert info.value.field == "target.driver"


def test_unknown_gpu_is_a_recipe_error(matrix):
    with pytest.raises(RecipeError) as info:
        resolve(parse_recipe(_recipe(**{"target__gpu": "GTX-9999"})), matrix)
    assert info.value.one_line().startswith("target.gpu:")
    assert "H100-SXM" in info.value.fix


def test_rtx4090_is_sm89(matrix):
    assert matrix.gpu("RTX-4090").compute_capability == "8.9"
    assert matrix.gpu("A100-80GB").compute_capability == "8.0"
    assert matrix.gpu("H100").compute_capability == "9.0"


def test_nvfp4_needs_blackwell_on_tensorrt_llm(matrix):
    data = _recipe("llama31-8b-h100-fp8-engine", **{"engine__quantization": "nvfp4"})
    with pytest.raises(CompatibilityError) as info:
        resolve(parse_recipe(data), matrix)
    assert "nvfp4" in info.value.one_line() and "10.0" in info.value.one_line()


def test_engine_path_is_exact_arch(matrix):
    stack = resolve(parse_recipe(_recipe("llama31-8b-h100-fp8-engine")), matrix).stack
    assert stack.arch_exact and stack.archs == ("9.0",)
    assert stack.tensorrt


def test_every_record_is_sourced(matrix):
    for release in matrix.releases:
        assert release.source
    for gpu in matrix.gpus:
        assert gpu.source
    for toolkit in matrix.toolkits.values():
        assert toolkit.source


_drivers = st.tuples(st.integers(300, 700), st.integers(0, 200), st.integers(0, 99)).map(
    lambda t: f"{t[0]}.{t[1]}.{t[2]:02d}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(driver=_drivers, gpu=st.sampled_from(["H100-SXM", "A100-80GB", "L4", "L40S", "T4", "V100", "B200",
                                            "RTX-4090"]),
       quant=st.sampled_from(["none", "fp8", "int4_awq", "nvfp4", "int8_sq"]),
       policy=st.sampled_from(["strict", "minor-compat"]),
       backend=st.sampled_from(["vllm", "tensorrt-llm"]))
def test_property_resolver_returns_a_fitting_stack_or_a_typed_error(matrix, driver, gpu, quant, policy, backend):
    data = _recipe(**{"target__gpu": gpu, "target__driver": f">={driver}", "target__driver_policy": policy,
                      "engine__quantization": quant, "engine__kv_cache_dtype": "auto",
                      "backend__name": backend,
                      "backend__trtllm_path": "pytorch" if backend == "tensorrt-llm" else None})
    try:
        stack = resolve(parse_recipe(data), matrix).stack
    except (CompatibilityError, RecipeError) as error:
        assert "\n" not in error.one_line()
        return
    assert compare_versions(driver, stack.driver_floor) >= 0
    assert stack.gpu == matrix.gpu(gpu).name


def test_a_later_os_can_fit_when_the_first_cannot(matrix):
    # vLLM 0.8.x is CUDA 12.4, published for ubuntu22.04 only: the ubuntu24.04 miss must not
    # sink the ubuntu22.04 stack that fits a 550.54.15 host under the strict policy.
    rows = fits_host(matrix, "L40S", "550.54.15", "strict")
    fitting = {r.version: f for r, f, _ in rows if f is not None and r.backend == "vllm"}
    assert fitting, "some vLLM release fits a 550.54.15 host"
    newest = max(fitting, key=Version)
    assert fitting[newest]["os"].name == "ubuntu22.04"
    assert fitting[newest]["toolkit"].version.startswith("12.4.")


# --- issue 10: the payload decides (torch's CUDA runtime and code, per-GPU driver minimum) -------

def _fails(matrix, recipe: dict) -> CompatibilityError:
    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(recipe), matrix)
    return caught.value


def _vllm_bf16(gpu: str, driver: str, **changes) -> dict:
    return _recipe("llama31-8b-l4", target__gpu=gpu, target__driver=f">={driver}", **changes)


def test_b200_with_vllm_0_10_1_is_refused_for_torch_kernels(matrix):
    """vLLM 0.10.1 ships sm_100, but its torch 2.7.1 (PyPI, cu126) has no sm_100 code."""
    error = _fails(matrix, _vllm_bf16("B200", "580.65.06", backend__version="==0.10.1"))
    assert "vllm 0.10.1: B200 (compute capability 10.0) has no code in torch 2.7.1" in str(error)
    assert "sm_90; PTX none" in str(error)
    assert error.fix.startswith("backend.version: '==0.19.1'")


def test_tensorrt_llm_on_b200_570_never_pairs_torch_2_7_1(matrix):
    recipe = _recipe("mistral-7b-a100-trtllm", target__gpu="B200", target__driver=">=570.124.06",
                     target__driver_policy=None, backend__version=None)
    error = _fails(matrix, recipe)
    reasons = dict(error.rejections)
    assert "has no code in torch 2.7.1" in reasons["tensorrt-llm 1.0.0"]
    assert "590.48.01" in str(error)  # 1.2.x: CUDA 13.1 toolkit in the payload
    assert error.fix.startswith("raise target.driver to ≥ 580.95.05 (tensorrt-llm 1.1.0")


def test_rtx5090_needs_r570(matrix):
    error = _fails(matrix, _vllm_bf16("RTX-5090", "560.35.03"))
    assert "RTX-5090 (blackwell) needs driver ≥ 570.26 (R570)" in str(error)
    assert error.field == "target.driver"
    assert error.fix.startswith("raise target.driver to ≥ 570.124.06")


def test_h100_strict_floor_is_the_payload_runtime_not_the_image_patch(matrix):
    """torch 2.8–2.10 bring cudart 12.8.90 (CUDA 12.8.1: 570.124.06), so 570.86.15 gets torch 2.7.1."""
    stack = resolve(parse_recipe(_recipe(target__driver=">=570.86.15", target__driver_policy="strict")),
                    matrix).stack
    assert (stack.backend_version, stack.torch) == ("0.10.1.1", "2.7.1")
    assert (stack.payload_runtime, stack.payload_runtime_toolkit) == ("12.6.77", "12.6.2")
    assert stack.strict_floor == stack.driver_floor == "560.35.03"
    assert any("comes from torch 2.7.1 (CUDA runtime 12.6.77)" in n for n in stack.notes)


def test_l40s_strict_580_65_06_stays_on_cuda_12_8_runtime(matrix):
    """torch 2.11+ bring CUDA 13.0.2/13.0.3 (580.95.05): too new for 580.65.06 under strict."""
    stack = resolve(parse_recipe(_vllm_bf16("L40S", "580.65.06", target__driver_policy="strict")),
                    matrix).stack
    assert (stack.backend_version, stack.torch, stack.payload_runtime) == ("0.19.1", "2.10.0", "12.8.90")
    assert stack.driver_floor == "570.124.06"
    rejected = resolve(parse_recipe(_vllm_bf16("L40S", "580.65.06")), matrix).rejections
    reasons = {r.candidate.split(" (")[0]: r.reason for r in rejected}
    assert "580.95.05" in reasons["vllm 0.33.0"] and "torch 2.14.0 (CUDA runtime 13.0.3)" in reasons["vllm 0.33.0"]


def test_t4_on_r470_names_the_smallest_driver_upgrade(matrix):
    """The cheapest real fix: vLLM 0.8.5.post1 + torch 2.6.0 (cudart 12.4.127 → CUDA 12.4.1)."""
    error = _fails(matrix, _vllm_bf16("T4", "470.82.01", engine__dtype="float16"))
    assert error.fix.startswith("raise target.driver to ≥ 550.54.15 (vllm 0.8.5.post1, torch 2.6.0")


def test_vllm_0_9_2_nvfp4_needs_8_0(matrix):
    error = _fails(matrix, _vllm_bf16("T4", "580.65.06", backend__version="==0.9.2",
                                      engine__quantization="nvfp4", engine__dtype="float16"))
    assert "vllm 0.9.2: nvfp4 needs compute capability ≥ 8.0; T4 is 7.5" in str(error)
    stack = resolve(parse_recipe(_vllm_bf16("A100-80GB", "580.65.06", backend__version="==0.9.2",
                                            engine__quantization="nvfp4")), matrix).stack
    assert stack.backend_version == "0.9.2"
    assert "nvfp4 on sm_80 runs weight-only (Marlin W4A16); native NVFP4 needs compute capability ≥ 10.0" \
        in stack.notes


def test_nvfp4_on_hopper_says_weight_only(matrix):
    stack = resolve(parse_recipe(_vllm_bf16("H100-SXM", "580.65.06", engine__quantization="nvfp4")),
                    matrix).stack
    assert "nvfp4 on sm_90 runs weight-only (Marlin W4A16); native NVFP4 needs compute capability ≥ 10.0" \
        in stack.notes


@pytest.mark.parametrize("name", ["llama31-8b-h100-fp8-engine", "mistral-7b-a100-trtllm",
                                  "qwen2-7b-l40s-awq-engine"])
def test_tensorrt_llm_examples_get_a_cuda13_torch(matrix, name):
    stack = resolve(parse_recipe(_recipe(name)), matrix).stack
    assert stack.torch == "2.9.1+cu130"
    assert stack.torch_index == "https://download.pytorch.org/whl/cu130"
    assert matrix.torch[stack.torch].cuda.startswith("13.")


def test_pypi_torch_is_never_paired_with_tensorrt_llm_1_2(matrix):
    release = next(r for r in matrix.backend_releases("tensorrt-llm") if r.version == "1.2.1")
    from imgfab.stack.resolve import _torch_pin
    assert _torch_pin(matrix, release) == "2.9.1+cu130"
    vllm = next(r for r in matrix.backend_releases("vllm") if r.version == "0.16.0")
    assert _torch_pin(matrix, vllm) == "2.9.1"  # vLLM installs PyPI's torch, not the cu130 build


@pytest.mark.parametrize("gpu", ["GH200", "GB200", "GB300"])
def test_aarch64_superchips_are_refused_in_one_line(matrix, gpu):
    with pytest.raises(RecipeError) as caught:
        resolve(parse_recipe(_recipe(target__gpu=gpu)), matrix)
    assert caught.value.field == "target.gpu"
    assert "aarch64" in str(caught.value) and "linux/amd64" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_resolve_json_shows_payload_runtime_and_floor(tmp_path):
    import json

    from click.testing import CliRunner

    from imgfab.cli import cli

    result = CliRunner().invoke(cli, ["resolve", str(REPO / "recipes" / "llama31-8b-l4.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    stack = json.loads(result.output)["stack"]
    assert stack["payload_runtime"] == "12.8.90" and stack["payload_runtime_toolkit"] == "12.8.1"
    assert stack["strict_floor"] == "570.124.06"
    assert "torch 2.10.0" in stack["payload_runtime_from"]


def test_supported_tags_are_preferred_over_end_of_life(matrix):
    stack = resolve(parse_recipe(_recipe("llama31-8b-l4")), matrix).stack
    assert stack.cuda == "12.8.2" and not stack.image_eol
    eol = resolve(parse_recipe(_recipe("llama31-8b-l4", image__os="ubuntu22.04",
                                       backend__version="==0.8.5.post1", target__driver=">=550.54.15")),
                  matrix).stack
    assert eol.cuda == "12.4.1" and not eol.image_eol


def test_forward_compat_on_a_datacenter_branch_keeps_cuda_compat(matrix):
    recipe = _vllm_bf16("H100-SXM", "535.104.05", target__driver_policy="forward-compat")
    stack = resolve(parse_recipe(recipe), matrix).stack
    assert stack.driver_policy == "forward-compat" and stack.cuda_compat == "keep"
    assert stack.nvidia_require_cuda == "cuda>=11.0" and stack.driver_floor == "535"
    assert any("reaches end of life 2026-06" in n for n in stack.notes)
    strict = resolve(parse_recipe(_vllm_bf16("H100-SXM", "580.95.05")), matrix).stack
    assert strict.cuda_compat == "drop"


def test_forward_compat_is_refused_on_geforce_and_unlisted_branches(matrix):
    error = _fails(matrix, _vllm_bf16("RTX-4090", "535.104.05", target__driver_policy="forward-compat"))
    assert "RTX-4090 is not a datacenter GPU" in str(error)
    error = _fails(matrix, _vllm_bf16("H100-SXM", "550.54.15", target__driver_policy="forward-compat"))
    assert "driver branch R550 is not a forward-compatibility branch" in str(error)


def test_only_an_end_of_life_tag_fits_and_the_stack_says_so(matrix):
    """TensorRT-LLM links the devel image's CUDA: on 590.44.01 strict only 13.1.0 (EOL) fits."""
    recipe = _recipe("mistral-7b-a100-trtllm", target__driver=">=590.44.01", target__driver_policy="strict")
    stack = resolve(parse_recipe(recipe), matrix).stack
    assert (stack.cuda, stack.image_eol, stack.driver_floor) == ("13.1.0", True, "590.44.01")
    assert any(n.startswith("only an end-of-life tag fits: nvidia/cuda:13.1.0-devel-ubuntu24.04")
               for n in stack.notes)
