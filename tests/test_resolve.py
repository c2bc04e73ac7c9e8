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
from imgfab.resolve import Host, fits_host, resolve
from imgfab.rules import compare_versions

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


def test_fp8_on_a100_names_the_field_and_capability(matrix):
    data = _recipe(**{"target__gpu": "A100-80GB", "target__driver": ">=999.0"})
    with pytest.raises(CompatibilityError) as info:
        resolve(parse_recipe(data), matrix)
    line = info.value.one_line()
    assert line.startswith("engine.quantization:"), line
    assert "fp8 needs compute capability ≥ 8.9" in line and "8.0" in line
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
