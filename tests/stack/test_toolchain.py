"""Run-time toolchains per backend, GPU and precision (compat/backends.yaml, imgfab.stack.toolchain).

The stacks are resolved against the frozen matrix (tests/fixtures/compat_frozen): on 580.65.06 the
newest vLLM that fits is 0.19.1 (torch 2.10.0; the CUDA 13 releases need 580.95.05); on 580.95.05
it is 0.33.0 (torch 2.14.0, cuda_runtime 13.0.3); 0.20.2 .. 0.26.0 pin torch 2.11.0 (13.0.2)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from conftest import FROZEN_COMPAT, FROZEN_RECIPES, REPO


def _recipe(gpu: str, driver: str = ">=580.65.06", kv: str = "auto", **extra):
    from imgfab.recipe import parse_recipe

    # vLLM before 0.22.0 is inside CVE-2026-48746 (critical): accepted by name (issue 34), so
    # the releases these rules are about still resolve.
    data = {"name": "jit", "model": {"id": "/models/m"},
            "backend": {"name": "vllm", "accept_advisories": ["CVE-2026-48746"]},
            "target": {"gpu": gpu, "driver": driver}, "engine": {"kv_cache_dtype": kv},
            "image": {"repository": "imgfab-test/jit"}} | extra
    return parse_recipe(data)


@pytest.mark.parametrize(("gpu", "kv", "flavor", "jit"), [
    ("H100-SXM", "fp8", "base", ()),            # Hopper: FlashAttention 3 serves fp8 KV
    ("L4", "auto", "base", ()),                 # Ada without fp8 KV: FlashAttention 2
    ("L40S", "fp8", "devel", ("flashinfer-attention",)),  # Ada + fp8 KV: FlashInfer JIT
    ("B200", "auto", "devel", ("flashinfer-attention",)),  # Blackwell 10.x: FlashInfer first
    ("T4", "auto", "devel", ("flashinfer-attention",)),  # Turing: no FlashAttention
])
def test_vllm_019_runtime_flavor_follows_the_attention_rules(gpu, kv, flavor, jit, frozen_matrix):
    """Driver 580.65.06 resolves vLLM 0.19.1 (sampler off by default there)."""
    from imgfab.stack.resolve import resolve

    stack = resolve(_recipe(gpu, kv=kv), frozen_matrix).stack
    assert stack.backend_version == "0.19.1"
    assert stack.runtime_flavor == flavor and stack.runtime_image.endswith(f"-{flavor}-{stack.os}")
    assert stack.jit == jit
    assert {"gcc", "libc6-dev", "python3-dev"} <= set(stack.runtime_toolchain)
    assert ("nvcc" in stack.runtime_toolchain) == bool(jit)
    assert stack.cuda_home == ("/usr/local/cuda" if jit else "")
    assert not stack.payload_toolchain
    if jit:
        assert any("flashinfer-attention (nvidia/cuda devel)" in note for note in stack.notes)
        assert not any("jit flashinfer" in u for u in stack.unconfirmed)  # rows read at tags


@pytest.mark.parametrize(("gpu", "version", "jit", "toolkit"), [
    ("H200", "==0.26.0", ("flashinfer-sampler",), "13.0.2"),   # the case that crashed on -base
    ("H100-SXM", "==0.21.0", ("flashinfer-sampler",), "13.0.2"),  # the default turned on in 0.21.0
    ("L4", None, ("flashinfer-sampler",), "13.0.3"),            # newest release (0.33.0): every GPU in 8.0-12.1
    ("B200", "==0.24.0", ("flashinfer-sampler",), "13.0.2"),
    ("H100-SXM", "==0.20.2", (), ""),                           # 0.20.x: sampler off by default
])
def test_vllm_021_and_later_carry_the_payload_toolchain(gpu, version, jit, toolkit, frozen_matrix):
    """vLLM >= 0.21 samples with FlashInfer by default: its kernels compile at the first start,
    so the runtime stays -base but carries nvcc from the payload (CUDA_HOME view)."""
    from imgfab.stack.resolve import resolve

    backend = {"name": "vllm", "accept_advisories": ["CVE-2026-48746"]} | ({"version": version} if version else {})
    stack = resolve(_recipe(gpu, driver=">=580.95.05", backend=backend), frozen_matrix).stack
    assert stack.jit == jit, (stack.backend_version, stack.jit)
    assert stack.runtime_flavor == "base"
    if jit:
        assert stack.cuda_home == "/opt/imgfab/cuda"
        assert {"g++", "nvcc"} <= set(stack.runtime_toolchain) and "g++" in stack.runtime_packages
        assert stack.payload_toolchain == (f"cuda-toolkit[cccl,crt,nvcc,nvvm]=={toolkit}",)
        assert any("sampl" in line for line in stack.jit_compiles)
    else:
        assert stack.cuda_home == "" and not stack.payload_toolchain


def test_turing_leaves_flashinfer_from_vllm_024(frozen_matrix):
    """FlashInfer's floor moved to 8.0 in vLLM 0.24.0 (flashinfer-ai/flashinfer#3620)."""
    from imgfab.stack.toolchain import runtime_plan

    profile = frozen_matrix.profiles["vllm"]
    def plan(version):
        return runtime_plan(profile, backend_version=version, compute_capability="7.5",
                            kv_cache_dtype="auto", precision="bf16", cuda_major="13")
    assert plan("0.23.0").jit == ("flashinfer-sampler",)
    assert plan("0.24.0").jit == ()
    assert runtime_plan(profile, backend_version="0.10.1", compute_capability="7.0",
                        kv_cache_dtype="auto", precision="bf16", cuda_major="12").flavor == "devel"
    assert runtime_plan(profile, backend_version="0.10.0", compute_capability="9.0",
                        kv_cache_dtype="auto", precision="bf16", cuda_major="12").jit == ()


def test_payload_toolchain_on_cuda_12_is_refused(frozen_matrix):
    from imgfab.stack.toolchain import PayloadToolchainUnavailable, runtime_plan

    with pytest.raises(PayloadToolchainUnavailable, match="CUDA 12"):
        runtime_plan(frozen_matrix.profiles["vllm"], backend_version="0.26.0", compute_capability="9.0",
                     kv_cache_dtype="auto", precision="bf16", cuda_major="12")


def test_verify_allows_exactly_the_stacks_toolchain(frozen_matrix):
    from imgfab.stack.resolve import resolve
    from imgfab.docker.verify import policy_for

    recipe = _recipe("L40S", kv="fp8")
    stack = resolve(recipe, frozen_matrix).stack
    assert "nvcc" in policy_for(recipe, stack, frozen_matrix).declared_toolchain
    plain = _recipe("L4")
    assert "nvcc" not in policy_for(plain, resolve(plain, frozen_matrix).stack, frozen_matrix).declared_toolchain


def test_rendered_runtime_declares_cuda_home_only_with_nvcc(frozen_matrix):
    from imgfab.render.context import render_context
    from imgfab.stack.resolve import resolve

    for recipe, expected in ((_recipe("L40S", kv="fp8"), True), (_recipe("L4"), False)):
        dockerfile = render_context(recipe, resolve(recipe, frozen_matrix).stack, frozen_matrix)["Dockerfile"]
        assert ("CUDA_HOME=/usr/local/cuda" in dockerfile) == expected
        assert "VLLM_NO_USAGE_STATS=1" in dockerfile and "DO_NOT_TRACK=1" in dockerfile
        assert "/usr/local/cuda/bin" in dockerfile.split("ENV PATH=", 1)[1].split()[0]


def test_missing_flavor_is_refused_at_resolve_with_the_fix(tmp_path):
    """A JIT toolchain only a flavor without a tag could carry: refused, naming the fix."""
    from imgfab.matrix.compat import load_matrix
    from imgfab.errors import CompatibilityError
    from imgfab.stack.resolve import resolve

    compat = tmp_path / "compat"
    shutil.copytree(FROZEN_COMPAT, compat)
    backends = yaml.safe_load((compat / "backends.yaml").read_text())
    vllm = next(b for b in backends["backends"] if b["backend"] == "vllm")
    for rule in vllm["jit_toolchains"]:
        if rule.get("toolchain") == "image":
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
    assert "flashinfer-attention" in str(caught.value)
    assert resolve(_recipe("L40S"), matrix).stack.runtime_flavor == "base"


def test_malformed_jit_rule_is_a_matrix_error(tmp_path):
    from imgfab.matrix.compat import load_matrix
    from imgfab.errors import MatrixError

    compat = tmp_path / "compat"
    shutil.copytree(FROZEN_COMPAT, compat)
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
    from imgfab.render.placement import driver_floor_terms

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


def test_payload_toolchain_renders_its_cuda_home_view_and_lock_pins(frozen_matrix):
    """The H200 recipe (vLLM 0.26.0, torch 2.11.0: cuda_runtime 13.0.2): CUDA_HOME is the view of
    the payload's nvidia/cu13 tree, made in the OS layer (links, libcudart.so, a libcuda.so link
    stub), and the lock is asked for the toolchain's cuda-toolkit wheels at torch's release."""
    from imgfab.payload.lock import payload_request
    from imgfab.recipe import load_recipe
    from imgfab.render.context import render_context
    from imgfab.stack.resolve import resolve

    recipe = load_recipe(FROZEN_RECIPES / "qwen2-7b-h200.yaml")
    stack = resolve(recipe, frozen_matrix).stack
    assert (stack.backend_version, stack.torch) == ("0.26.0", "2.11.0")
    files = render_context(recipe, stack, frozen_matrix)
    dockerfile = files["Dockerfile"]
    assert "CUDA_HOME=/opt/imgfab/cuda \\" in dockerfile
    # made after the payload, from where it is, and checked there: nvcc must run
    view = dockerfile.index("tree=$(echo /opt/venv/lib/python3*/site-packages/nvidia/cu13)")
    assert view > dockerfile.rindex("COPY --link --from=builder /opt/imgfab/layers/")
    assert 'ln -s "$tree/$part" "/opt/imgfab/cuda/$part"' in dockerfile
    assert "&& /opt/imgfab/cuda/bin/nvcc --version" in dockerfile
    assert "ln -s ../lib/libcudart.so.13 /opt/imgfab/cuda/lib64/libcudart.so" in dockerfile
    assert "-Wl,-soname,libcuda.so.1 -o /opt/imgfab/cuda/lib64/stubs/libcuda.so" in dockerfile
    assert "apt-get install -y --no-install-recommends g++ gcc" in dockerfile
    labels = json.loads(files["image.json"])
    assert labels["org.imgfab.jit"] == "flashinfer-sampler"
    assert "sampling kernels" in labels["org.imgfab.jit.compiles"]
    pins = payload_request(recipe, stack, FROZEN_COMPAT).pins
    assert "cuda-toolkit[cccl,crt,nvcc,nvvm]==13.0.2" in pins


def test_the_h200_lock_holds_the_payload_toolchain_wheels():
    """The example's committed lock (recorded against the shipped compat/) pins the wheels of
    the toolchain's cuda-toolkit extras."""
    lock = (REPO / "recipes" / "qwen2-7b-h200.lock").read_text()
    for wheel in ("nvidia-cuda-nvcc==13.0.88", "nvidia-cuda-crt==13.0.88", "nvidia-nvvm==13.0.88"):
        assert f"\n{wheel} " in lock, wheel
