"""Issue 20 (compatibility truth, round 3): forward compatibility from NVIDIA's table, driver
ceilings per architecture, refusals that name the deciding constraint, exact driver strings.

Every expected answer comes from a primary source named beside it:
- NVIDIA CUDA Compatibility guide, Forward Compatibility, table under "Use the Right CUDA Forward
  Compatibility Package" (edition 615): cuda-compat-13-0 is C on 535+ and 570+; 13-2 .. 13-4 are C
  on 535+; 590+ and 610+ are New Feature Branches, "not supported targets".
- NVIDIA "CUDA Toolkit, Driver, and Architecture Matrix": Volta (7.0) last driver support R580.
- vLLM vllm/platforms/cuda.py: bf16 needs compute capability 8.0, "You can use float16 instead by
  explicitly setting the `dtype` flag".

The stacks are resolved against the frozen matrix (tests/fixtures/compat_frozen): its newest vLLM is
0.33.0 (torch 2.14.0, CUDA 13.0, on the supported 13.0.3 tag), its newest CUDA 12 one 0.19.1
(torch 2.10.0 on the 12.8.2 tag).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from imgfab.cli import cli
from imgfab.errors import CompatibilityError, RecipeError
from imgfab.in_image import rules
from imgfab.recipe import parse_recipe, recipe_hash
from imgfab.render.context import image_labels
from imgfab.render.placement import node_affinity_terms
from imgfab.stack.resolve import resolve
from imgfab.stack.verdicts import gpu_verdicts

from conftest import FROZEN_COMPAT, FROZEN_RECIPES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from fake_nvml import FakeCuda, FakeNvml  # noqa: E402

V100 = ("Tesla V100-SXM2-16GB", (7, 0), 16 * 2**30)


def _recipe(name: str = "qwen2-7b-h100", **changes) -> dict:
    data = yaml.safe_load((FROZEN_RECIPES / f"{name}.yaml").read_text())
    # These are the driver and architecture rules on 16 GB GPUs (V100, T4), which the example's
    # 7B model at 32k tokens does not fit (tests/stack/test_fit.py): without facts, fit is not checked.
    data["model"].pop("facts", None)
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return data


def _resolve(**changes):
    return resolve(parse_recipe(_recipe(**changes)), MATRIX()).stack


def _fails(**changes) -> CompatibilityError:
    with pytest.raises(CompatibilityError) as info:
        _resolve(**changes)
    return info.value


_LOADED = {}


def MATRIX():  # noqa: N802 - one load per module, like the conftest fixture
    from imgfab.matrix.compat import load_matrix

    if "m" not in _LOADED:
        _LOADED["m"] = load_matrix(FROZEN_COMPAT)
    return _LOADED["m"]


# --- forward compatibility: NVIDIA's table ---------------------------------------------------

def test_an_r570_host_runs_a_cuda13_stack_by_forward_compatibility():
    """cuda-compat-13-0 is C in the 570+ column: an H100 on R570 gets the CUDA 13 vLLM."""
    stack = _resolve(target__driver=">=570.124.06", target__driver_policy="forward-compat",
                     engine__quantization="none")
    assert (stack.backend_version, stack.cuda, stack.cuda_compat) == ("0.33.0", "13.0.3", "keep")
    assert stack.driver_policy == "forward-compat"
    assert any("R570 (production) reaches end of life 2026-02" in n for n in stack.notes)


@pytest.mark.parametrize("cuda", ["13.2.0", "13.3.0", "13.4.1"])
def test_r535_runs_the_cuda_13_releases_after_13_1(cuda):
    """cuda-compat-13-2/13-3/13-4 are C in the 535+ column."""
    branches = [(b.branch, list(b.forward_compat_cuda)) for b in MATRIX().driver_branches]
    assert rules.check_forward_compat("535.104.05", cuda=cuda, branches=branches, datacenter=True).ok


@pytest.mark.parametrize("driver", ["590.48.01", "610.43.02"])
def test_new_feature_branches_are_no_forward_compat_target(driver):
    branches = [(b.branch, list(b.forward_compat_cuda)) for b in MATRIX().driver_branches]
    verdict = rules.check_forward_compat(driver, cuda="13.4.1", branches=branches, datacenter=True)
    assert not verdict.ok
    assert "cuda-compat-13-4 on: R535, R570, R580, R595" in verdict.reason


def test_forward_compat_fix_follows_the_table():
    """A B200 fleet on R560 under forward-compat: R560 is in no column of the table, and the
    nearest fix is the lowest branch that lists cuda-compat-13-0 above it, R570 (at the B200's own
    570.26), not the strict floor of "raise target.driver"."""
    error = _fails(target__gpu="B200", target__driver=">=560.35.03", target__driver_policy="forward-compat",
                   engine__quantization="none")
    assert error.field == "target.driver"
    assert error.fix.startswith("move target.driver to branch R570 (≥ 570.26) (NVIDIA's forward-"
                                "compatibility table lists cuda-compat-13-0 on R535, R570)"), error.fix
    assert "every candidate the recipe admits fails gpu-driver" in str(error)
    fixed = _resolve(target__gpu="B200", target__driver=">=570.26", target__driver_policy="forward-compat",
                     engine__quantization="none")
    assert (fixed.backend_version, fixed.cuda, fixed.cuda_compat) == ("0.33.0", "13.0.3", "keep")


# --- driver ceilings per architecture ---------------------------------------------------------

def test_a_v100_fleet_past_r580_cannot_exist():
    error = _fails(target__gpu="V100", target__driver=">=590.48.01", engine__quantization="none",
                   engine__dtype="float16")
    assert error.field == "target.driver"
    assert "R580 is NVIDIA's last driver branch for this architecture" in str(error)
    assert "every candidate the recipe admits fails gpu-driver" in str(error)
    stack = _resolve(target__gpu="V100", target__driver=">=580.65.06", engine__quantization="none",
                     engine__dtype="float16")
    assert "7.0:580" in stack.driver_ceilings
    assert any("cuda-toolkit-driver-and-architecture-matrix" in s for s in stack.sources)


def test_a_hopper_fleet_has_no_ceiling():
    stack = _resolve(target__driver=">=999.0", target__driver_policy="strict", engine__quantization="none")
    assert "9.0" in stack.archs and not any(c.startswith("9.0:") for c in stack.driver_ceilings)


def _v100_labels() -> dict[str, str]:
    recipe = parse_recipe(_recipe(target__gpu="V100", target__driver=">=570.124.06",
                                  engine__quantization="none", engine__dtype="float16",
                                  engine__kv_cache_dtype="auto"))
    stack = resolve(recipe, MATRIX()).stack
    return image_labels(recipe, stack, recipe_hash(recipe), "config.json")


def test_select_refuses_an_image_on_a_v100_past_its_last_branch():
    labels = _v100_labels()
    assert labels["org.imgfab.driver.ceilings"] == "7.0:580"
    past = gpu_verdicts(labels, "V100", "7.0", driver="590.48.01")
    assert [v.ok for v in past if v.check == "driver"] == [False]
    assert "R580" in past[0].reason
    within = gpu_verdicts(labels, "V100", "7.0", driver="580.95.05")
    assert all(v.ok for v in within)
    assert all(v.ok for v in gpu_verdicts(labels, "T4", "7.5", driver="590.48.01"))


def test_k8s_placement_keeps_v100_nodes_on_r580_or_older():
    terms = node_affinity_terms(_v100_labels(), MATRIX())
    volta = [t for t in terms if {"key": "nvidia.com/gpu.compute.major", "operator": "In", "values": ["7"]} in t
             and {"key": "nvidia.com/gpu.compute.minor", "operator": "In", "values": ["0"]} in t]
    turing = [t for t in terms if {"key": "nvidia.com/gpu.compute.minor", "operator": "In", "values": ["5"]} in t]
    assert volta and turing
    ceiling = {"key": "nvidia.com/cuda.driver.major", "operator": "Lt", "values": ["581"]}
    assert all(ceiling in t for t in volta)
    assert not any(ceiling in t for t in turing)


def test_the_probe_refuses_a_v100_on_a_branch_past_r580(tmp_path):
    from imgfab.in_image import facts, probe

    labels = dict(_v100_labels(), **{"org.imgfab.weights.required": ""})
    path = tmp_path / "image.json"
    path.write_text(json.dumps(labels))
    mode = facts.CudaMode(kernel_driver="590.48.01", libcuda_path="/usr/lib/x86_64-linux-gnu/libcuda.so.590.48.01",
                          libcuda_version="590.48.01", libcuda_cuda="13.1")
    report = probe.run_probe(str(path), nvml=FakeNvml(driver="590.48.01", gpus=[V100]), cuda=FakeCuda(count=1),
                             shm_path=str(tmp_path), cuda_mode=mode, skip={"weights", "shm"})
    lines = [f.line() for f in report.findings if f.verdict.check == "driver"]
    assert any("R580 is NVIDIA's last driver branch" in line for line in lines), lines
    assert report.exit_code == 3
    ok = probe.run_probe(str(path), nvml=FakeNvml(driver="580.95.05", gpus=[V100]), cuda=FakeCuda(count=1),
                         shm_path=str(tmp_path), cuda_mode=mode, skip={"weights", "shm", "mode"})
    assert all(f.verdict.ok for f in ok.findings if f.verdict.check == "driver")


def test_a_malformed_ceilings_label_is_image_wrong(tmp_path):
    from imgfab.in_image import facts

    labels = dict(_v100_labels(), **{"org.imgfab.driver.ceilings": "7.0=580"})
    with pytest.raises(facts.ImageFactsError, match="driver.ceilings"):
        facts.ImageFacts.from_labels(labels)


def test_a_gpu_whose_architecture_has_no_row_is_malformed(tmp_path):
    import shutil

    from imgfab.errors import MatrixError
    from imgfab.matrix.compat import load_matrix

    shutil.copytree(FROZEN_COMPAT, tmp_path / "compat")
    gpus = tmp_path / "compat" / "gpus.yaml"
    gpus.write_text(gpus.read_text().replace('architecture: "volta"', 'architecture: "voltaa"', 1))
    with pytest.raises(MatrixError, match="no architectures row"):
        load_matrix(tmp_path / "compat")


# --- refusals name the deciding constraint ----------------------------------------------------

def test_bf16_on_a_gpu_without_bf16_is_a_dtype_refusal_with_vllms_fix():
    """The newest vLLM fails V100 on architecture and dtype, older ones on dtype only: dtype
    decides, and the fix is vLLM's own (float16), on a release that has V100 code."""
    error = _fails(target__gpu="V100", target__driver=">=570.124.06", engine__quantization="none",
                   engine__dtype="bfloat16")
    assert error.field == "engine.dtype"
    assert "every candidate the recipe admits fails dtype" in str(error)
    assert "bf16 needs compute capability ≥ 8.0; V100 is 7.0" in str(error)
    # the CUDA 13 releases need R580 even under minor-compat; 0.19.1, the newest CUDA 12 one, has sm_70 code
    assert error.fix.startswith("engine.dtype: float16 (vllm 0.19.1, torch 2.10.0, CUDA 12.8.2 image"), error.fix
    assert error.exit_code == 2 and "\n" not in error.one_line()


def test_the_nearest_fix_is_searched_over_precision():
    """bf16 + fp8 KV cache on a T4: the nearest fix changes the dtype (one edit), found by
    searching candidates with precision failures instead of skipping them."""
    error = _fails(target__gpu="T4", target__driver=">=570.124.06", engine__quantization="none",
                   engine__dtype="bfloat16")
    assert error.fix.startswith("engine.dtype: float16 (vllm 0.19.1, torch 2.10.0, "), error.fix
    fixed = _resolve(target__gpu="T4", target__driver=">=570.124.06", engine__quantization="none",
                     engine__dtype="float16")
    assert (fixed.backend_version, fixed.torch) == ("0.19.1", "2.10.0")


# --- input edges: driver strings exactly ------------------------------------------------------

def _imgfab(*args: str):
    import subprocess

    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize("driver", ["580.65.06 ", " 580.65.06", "580.65.06\t"])
def test_a_driver_with_surrounding_space_is_refused(driver):
    result = _imgfab("resolve", str(FROZEN_RECIPES / "qwen2-7b-h100.yaml"), "--driver", driver,
                     "--compat-dir", str(FROZEN_COMPAT))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("imgfab: --driver:"), lines
    assert "surrounding space" in lines[0] and not result.stdout


def test_a_two_part_geforce_driver_still_works():
    result = CliRunner().invoke(cli, ["resolve", str(FROZEN_RECIPES / "llama31-8b-l4.yaml"),
                                      "--driver", "999.86", "--json", "--compat-dir", str(FROZEN_COMPAT)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["stack"]["fleet_driver"] == "999.86"


def test_a_recipe_driver_with_surrounding_space_is_refused():
    with pytest.raises(RecipeError) as info:
        parse_recipe(_recipe(target__driver=">=580.65.06 "))
    assert info.value.field == "target.driver" and "surrounding space" in str(info.value)


def test_the_dtype_rejection_itself_carries_the_float16_fix():
    """What `imgfab matrix` and the rejection list show per candidate: a V100 release with
    Volta code fails bf16 under dtype, with vLLM's fix."""
    from imgfab.stack.candidates import evaluate

    matrix = MATRIX()
    release = next(r for r in matrix.backend_releases("vllm") if r.version == "0.19.1")
    fields, failures = evaluate(matrix, release, gpu=matrix.gpu("V100"), precisions=("bf16",),
                                driver="580.95.05", policy="strict", os_names=("ubuntu24.04",))
    assert fields is None and [f.constraint for f in failures] == ["dtype"]
    assert failures[0].fix.startswith("engine.dtype: float16 (use float16 by setting dtype")
