"""Payload measured inside an image vs the matrix's prediction (imgfab.payload.measure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imgfab.payload import measure as payload
from imgfab.matrix.compat import load_matrix
from imgfab.errors import ValidationFailed
from imgfab.in_image.fatbin import fat_binary
from imgfab.recipe import load_recipe
from imgfab.stack.resolve import resolve

from conftest import FROZEN_RECIPES
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "in_image"))  # run alone, too
from test_fatbin import elf_with_sections  # noqa: E402


@pytest.fixture(scope="module")
def l4_stack():
    matrix = load_matrix()
    # the L4 recipe on vLLM 0.19.1 / torch 2.10.0 (the frozen copy: the example moved to 0.33.0
    # in issue 34), against the shipped matrix, whose rows the measurements below are
    stack = resolve(load_recipe(str(FROZEN_RECIPES / "llama31-8b-l4.yaml")), matrix).stack
    return stack.to_dict(), matrix


def _measured(runtime: str, torch_sass: list[str], vllm_sass: list[str],
              vllm_ptx: tuple[str, ...] = ("5.2", "8.0", "8.9", "9.0")) -> payload.Measured:
    return payload.Measured(
        dists={"nvidia-cuda-runtime-cu12": runtime, "nvidia-cublas-cu12": "12.8.4.1"},
        libraries={"torch": {"path": "torch/lib/libtorch_cuda.so", "sass": torch_sass, "ptx": [], "blobs": 900},
                   "vllm": {"path": "vllm/_C.abi3.so", "sass": vllm_sass, "ptx": list(vllm_ptx), "blobs": 300}})


# compat/torch.yaml torch 2.10.0 and compat/vllm.yaml vllm 0.19.1, as every fat binary of their
# wheels reads (compat refresh of 2026-12-03; the first 54/64 fat binaries missed 8.9 and 5.2).
TORCH_2_10 = ["7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]
VLLM_0_19 = ["5.2", "7.0", "7.5", "8.0", "8.9", "9.0", "10.0", "12.0"]


def test_agreeing_payload_passes_and_labels_the_measured_values(l4_stack):
    stack, matrix = l4_stack
    result = payload.compare(stack, matrix, _measured("12.8.90", TORCH_2_10, VLLM_0_19 + ["8.7"]))
    assert result.mismatches == []
    assert result.labels["org.imgfab.measured.cuda_runtime"] == "12.8.90"
    assert result.labels["org.imgfab.measured.torch.sass"] == ",".join(TORCH_2_10)
    assert any("also carries SASS 8.7" in n for n in result.notes)


def test_wrong_runtime_names_the_torch_row(l4_stack):
    stack, matrix = l4_stack
    result = payload.compare(stack, matrix, _measured("12.6.77", TORCH_2_10, VLLM_0_19))
    assert result.mismatches == ["the image brings CUDA runtime 12.6.77 (nvidia-cuda-runtime), the matrix "
                                 "predicted 12.8.90: fix cuda_runtime of compat/torch.yaml torch 2.10.0"]


def test_missing_architecture_names_the_row_and_check_image_rejects(l4_stack):
    stack, matrix = l4_stack
    result = payload.compare(stack, matrix, _measured("12.8.90", TORCH_2_10[:-2], VLLM_0_19))
    assert len(result.mismatches) == 1
    assert "has no code for 10.0, 12.0 that compat/torch.yaml torch 2.10.0" in result.mismatches[0]

    class FakeEngine:
        @staticmethod
        def run_python(ref, script, args):
            data = _measured("12.8.90", TORCH_2_10, VLLM_0_19[:3])
            return json.dumps({"site": "/x", "dists": data.dists, "libraries": data.libraries})

    with pytest.raises(ValidationFailed, match="compat/vllm.yaml vllm 0.19.1"):
        payload.check_image("img:tag", stack, matrix, engine=FakeEngine)


def test_measure_script_reads_dists_and_fatbins_of_a_site_packages(tmp_path):
    """The very program run inside images, run here on a fake site-packages."""
    site = tmp_path / "site"
    (site / "torch" / "lib").mkdir(parents=True)
    (site / "torch" / "lib" / "libtorch_cuda.so").write_bytes(
        elf_with_sections({".nv_fatbin": fat_binary([(2, 80), (2, 90), (1, 90)])}))
    dist = site / "nvidia_cuda_runtime_cu12-12.8.90.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cuda-runtime-cu12\nVersion: 12.8.90\n")
    wanted = json.dumps([["torch", ["torch/lib/libtorch_cuda.so"]], ["vllm", ["vllm/_C.abi3.so"]]])
    done = subprocess.run([sys.executable, "-", wanted], input=payload.measure_script(), text=True,
                          capture_output=True, env={**os.environ, "IMGFAB_SITE": str(site)}, check=True)
    data = json.loads(done.stdout)
    assert data["dists"] == {"nvidia-cuda-runtime-cu12": "12.8.90"}
    assert data["torch_lib"] is True
    assert data["libraries"] == {"torch": {"path": "torch/lib/libtorch_cuda.so", "sass": ["8.0", "9.0"],
                                           "ptx": ["9.0"], "blobs": 1}}


def test_a_stand_in_payload_is_noted_not_failed_but_a_cpu_torch_fails(l4_stack):
    stack, matrix = l4_stack
    fake = payload.compare(stack, matrix, payload.Measured(dists={}, libraries={}, torch_lib=False))
    assert fake.mismatches == [] and "stand-in payload" in fake.notes[0]
    cpu = payload.compare(stack, matrix, payload.Measured(dists={}, libraries={}, torch_lib=True))
    assert cpu.mismatches[0].startswith("no nvidia-cuda-runtime distribution in the image (a CPU-only "
                                        "torch?), the matrix predicted 12.8.90")


def test_a_metapackage_release_is_measured_as_the_cudart_it_pins(tmp_path):
    """torch 2.14.0 pins cuda-toolkit[cudart]==13.0.3, whose metapackage pins nvidia-cuda-runtime
    13.0.96 (first shipped by 13.0.2): a built image brings 13.0.96, which agrees once the
    toolkit row records it (cuda.yaml toolkits[].cudart), and was refused before (issue 32:
    every vLLM >= 0.27 image failed its measurement). On the frozen fixture."""
    import shutil

    from conftest import FROZEN_COMPAT

    compat = tmp_path / "compat"
    shutil.copytree(FROZEN_COMPAT, compat)
    stack = {"torch": "2.14.0", "backend": "vllm", "backend_version": "0.33.0"}
    measured = payload.Measured(dists={"nvidia-cuda-runtime": "13.0.96"}, libraries={})
    assert payload.compare(stack, load_matrix(compat), measured).mismatches[:1] == [
        "the image brings CUDA runtime 13.0.96 (nvidia-cuda-runtime), the matrix predicted 13.0.3: "
        "fix cuda_runtime of compat/torch.yaml torch 2.14.0"]
    text = (compat / "cuda.yaml").read_text()
    (compat / "cuda.yaml").write_text(text.replace('  - version: "13.0.3"\n    min_driver: "580.95.05"\n',
                                                   '  - version: "13.0.3"\n    min_driver: "580.95.05"\n'
                                                   '    cudart: "13.0.96"\n'))
    result = payload.compare(stack, load_matrix(compat), measured)
    assert not [m for m in result.mismatches if "CUDA runtime" in m], result.mismatches
    assert result.labels["org.imgfab.measured.cuda_runtime"] == "13.0.96"
