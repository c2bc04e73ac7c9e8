"""Issue 36 item 4: a GPU a backend does not support at all is a target.gpu refusal.

Expected answers, each from a primary source:
- TensorRT-LLM's support matrix (nvidia.github.io/TensorRT-LLM/reference/support-matrix.html,
  "Hardware"): Blackwell, Hopper, Ada Lovelace and Ampere (SM80, SM86); an architecture not listed
  (Turing: T4, 7.5; Volta: V100, 7.0) has community support only. So TensorRT-LLM on a T4 is
  decided by the GPU, not by engine.dtype.
- NVIDIA's CUDA GPUs page: A100 is compute capability 8.0, the oldest Ampere; of the frozen
  matrix's 8.0 GPUs, A100-40GB (40 GiB) is the one nearest a 16 GiB T4.
- vLLM vllm/platforms/cuda.py: bf16 needs compute capability 8.0 ("You can use float16 instead by
  explicitly setting the `dtype` flag"), so vLLM runs a T4 with engine.dtype: float16.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from imgfab.errors import CompatibilityError
from imgfab.matrix.compat import load_matrix
from imgfab.recipe import parse_recipe
from imgfab.stack.candidates import nearest_supported_gpu
from imgfab.stack.resolve import resolve

from conftest import FROZEN_COMPAT, FROZEN_RECIPES

TRTLLM = "mistral-7b-a100-trtllm"


@pytest.fixture(scope="module")
def matrix():
    return load_matrix(FROZEN_COMPAT)


def _trtllm_on(gpu: str) -> dict:
    data = yaml.safe_load((FROZEN_RECIPES / f"{TRTLLM}.yaml").read_text())
    data["model"].pop("facts", None)  # the 7B model's fit on a 16 GB card is another question
    data["target"]["gpu"] = gpu
    data["target"]["count"] = 1
    return data


def _refusal(matrix, gpu: str) -> CompatibilityError:
    with pytest.raises(CompatibilityError) as info:
        resolve(parse_recipe(_trtllm_on(gpu)), matrix)
    return info.value


@pytest.mark.parametrize("gpu", ["T4", "V100"])
def test_tensorrt_llm_on_a_pre_ampere_gpu_is_a_target_gpu_refusal(matrix, gpu):
    error = _refusal(matrix, gpu)
    assert error.field == "target.gpu", error.one_line()
    assert error.rejected[0]["constraint"] == "gpu"
    assert f"tensorrt-llm does not support {gpu}" in error.message
    assert "starts at compute capability 8.0" in error.message


def test_the_fix_names_the_nearest_supported_gpu_and_vllm(matrix):
    fix = _refusal(matrix, "T4").fix
    assert fix.startswith("target.gpu: A100-40GB (compute capability 8.0"), fix
    assert "or backend.name: vllm and engine.dtype: float16" in fix, fix
    assert "engine.quantization" not in fix


def test_every_tensorrt_llm_release_is_rejected_for_the_gpu(matrix):
    data = _trtllm_on("T4")
    del data["backend"]["version"]
    with pytest.raises(CompatibilityError) as info:
        resolve(parse_recipe(data), matrix)
    assert info.value.field == "target.gpu"
    assert {r["constraint"] for r in info.value.rejected} == {"gpu"}


def test_an_ampere_gpu_is_not_refused_for_the_gpu(matrix):
    resolved = resolve(parse_recipe(_trtllm_on("A100-80GB")), matrix)
    assert resolved.stack.backend == "tensorrt-llm"
    assert all(r.constraint != "gpu" for r in resolved.rejections)


@pytest.mark.parametrize("gpu, nearest", [("T4", "A100-40GB"), ("V100", "A100-40GB")])
def test_the_nearest_supported_gpu(matrix, gpu, nearest):
    assert nearest_supported_gpu(matrix, matrix.gpu(gpu), "8.0").name == nearest


def test_the_nearest_supported_gpu_is_an_x86_64_one(matrix):
    """GH200 (9.0) hosts are aarch64: never the answer, though its 96 GiB is nearest 100."""
    from dataclasses import replace

    big = replace(matrix.gpu("T4"), memory_gib=100.0)
    assert nearest_supported_gpu(matrix, big, "9.0").name == "H100-SXM"


def test_the_frozen_matrix_records_tensorrt_llms_oldest_gpu(matrix):
    support = matrix.gpu_support["tensorrt-llm"]
    assert support.min_compute_capability == "8.0" and support.confirmed
    assert "support-matrix" in support.source and "vllm" not in matrix.gpu_support


def test_the_cli_blames_target_gpu_in_one_line(tmp_path):
    recipe = tmp_path / "t4.yaml"
    recipe.write_text(yaml.safe_dump(_trtllm_on("T4")))
    result = subprocess.run([sys.executable, "-m", "imgfab.cli", "resolve", str(recipe),
                             "--compat-dir", str(FROZEN_COMPAT)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("imgfab: target.gpu: no tensorrt-llm stack fits T4"), line
    assert "fix: target.gpu: A100-40GB" in line
