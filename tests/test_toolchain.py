"""Run-time toolchains per backend, GPU and precision (compat/backends.yaml, imgfab.toolchain)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from conftest import REPO


def _recipe(gpu: str, driver: str = ">=580.65.06", kv: str = "auto", **extra):
    from imgfab.recipe import parse_recipe

    data = {"name": "jit", "model": {"id": "/models/m"}, "backend": {"name": "vllm"},
            "target": {"gpu": gpu, "driver": driver}, "engine": {"kv_cache_dtype": kv},
            "image": {"repository": "imgfab-test/jit"}} | extra
    return parse_recipe(data)


@pytest.mark.parametrize(("gpu", "kv", "flavor", "jit"), [
    ("H100-SXM", "fp8", "base", ()),            # Hopper: FlashAttention 3 serves fp8 KV
    ("L4", "auto", "base", ()),                 # Ada without fp8 KV: FlashAttention 2
    ("L40S", "fp8", "devel", ("flashinfer-jit",)),  # Ada + fp8 KV: FlashInfer JIT
    ("B200", "auto", "devel", ("flashinfer-jit",)),  # every Blackwell target
])
def test_vllm_runtime_flavor_follows_the_jit_rules(gpu, kv, flavor, jit, matrix):
    from imgfab.resolve import resolve

    stack = resolve(_recipe(gpu, kv=kv), matrix).stack
    assert stack.runtime_flavor == flavor and stack.runtime_image.endswith(f"-{flavor}-{stack.os}")
    assert stack.jit == jit
    assert {"gcc", "libc6-dev", "python3-dev"} <= set(stack.runtime_toolchain)
    assert ("nvcc" in stack.runtime_toolchain) == bool(jit)
    if jit:
        assert any("flashinfer-jit" in note for note in stack.notes)
        assert any("jit flashinfer-jit" in u for u in stack.unconfirmed)  # confirmed: false rows


def test_verify_allows_exactly_the_stacks_toolchain(matrix):
    from imgfab.resolve import resolve
    from imgfab.verify import policy_for

    recipe = _recipe("L40S", kv="fp8")
    stack = resolve(recipe, matrix).stack
    assert "nvcc" in policy_for(recipe, stack, matrix).declared_toolchain
    plain = _recipe("L4")
    assert "nvcc" not in policy_for(plain, resolve(plain, matrix).stack, matrix).declared_toolchain


def test_rendered_runtime_declares_cuda_home_only_with_nvcc(matrix):
    from imgfab.render import render_context
    from imgfab.resolve import resolve

    for recipe, expected in ((_recipe("L40S", kv="fp8"), True), (_recipe("L4"), False)):
        dockerfile = render_context(recipe, resolve(recipe, matrix).stack, matrix)["Dockerfile"]
        assert ("CUDA_HOME=/usr/local/cuda" in dockerfile) == expected
        assert "VLLM_NO_USAGE_STATS=1" in dockerfile and "DO_NOT_TRACK=1" in dockerfile
        assert "/usr/local/cuda/bin" in dockerfile.split("ENV PATH=", 1)[1].split()[0]


def test_missing_flavor_is_refused_at_resolve_with_the_fix(tmp_path):
    """A JIT toolchain only a flavor without a tag could carry: refused, naming the fix."""
    from imgfab.compat import load_matrix
    from imgfab.errors import CompatibilityError
    from imgfab.resolve import resolve

    compat = tmp_path / "compat"
    shutil.copytree(REPO / "compat", compat)
    backends = yaml.safe_load((compat / "backends.yaml").read_text())
    vllm = next(b for b in backends["backends"] if b["backend"] == "vllm")
    for rule in vllm["jit_toolchains"]:
        rule["runtime_flavor"] = "runtime"
    (compat / "backends.yaml").write_text(yaml.safe_dump(backends))
    images = yaml.safe_load((compat / "cuda_images.yaml").read_text())
    for row in images["images"]:
        row["flavors"] = [f for f in row["flavors"] if f != "runtime"]
    (compat / "cuda_images.yaml").write_text(yaml.safe_dump(images))
    matrix = load_matrix(compat)
    with pytest.raises(CompatibilityError) as caught:
        resolve(_recipe("L40S", kv="fp8"), matrix)
    assert caught.value.field == "engine.kv_cache_dtype"
    assert caught.value.fix == "engine.kv_cache_dtype: auto"
    assert "flashinfer-jit" in str(caught.value)
    assert resolve(_recipe("L40S"), matrix).stack.runtime_flavor == "base"


def test_malformed_jit_rule_is_a_matrix_error(tmp_path):
    from imgfab.compat import load_matrix
    from imgfab.errors import MatrixError

    compat = tmp_path / "compat"
    shutil.copytree(REPO / "compat", compat)
    backends = yaml.safe_load((compat / "backends.yaml").read_text())
    backends["backends"][1]["jit_toolchains"][0]["runtime_flavor"] = "huge"
    (compat / "backends.yaml").write_text(yaml.safe_dump(backends))
    with pytest.raises(MatrixError, match="runtime_flavor"):
        load_matrix(compat)


def test_uid_1000_is_refused_with_the_reason():
    from imgfab.errors import RecipeError

    with pytest.raises(RecipeError) as caught:
        _recipe("L4", image={"repository": "imgfab-test/jit", "uid": 1000})
    assert caught.value.field == "image.uid" and "ubuntu" in str(caught.value)
    assert _recipe("L4", image={"repository": "imgfab-test/jit", "uid": 1001}).image.uid == 1001


@pytest.mark.parametrize("name", ["1abc", "llama3.1-8b", "a_b", "-a", "a-", "A", "x" * 64])
def test_recipe_names_are_dns_1123_labels_starting_with_a_letter(name):
    from imgfab.errors import RecipeError

    with pytest.raises(RecipeError) as caught:
        _recipe("L4", name=name)
    assert caught.value.field == "name"


def test_driver_floor_terms_encode_greater_or_equal():
    from imgfab.placement import driver_floor_terms

    def matches(driver: str) -> bool:
        labels = dict(zip(("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor",
                           "nvidia.com/cuda.driver.rev"), driver.split(".")))
        def ok(e):
            value = labels.get(e["key"])
            if e["operator"] == "In":
                return value in e["values"]
            return value is not None and int(value) > int(e["values"][0])
        return any(all(ok(e) for e in term) for term in driver_floor_terms("535.104.05"))

    assert matches("535.104.05") and matches("535.104.12") and matches("535.129.03")
    assert matches("550.54.15") and not matches("535.104.04") and not matches("535.86.10")
    assert not matches("470.57.02")
