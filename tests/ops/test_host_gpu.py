"""select and doctor without --gpu (issue 18, item 8): this host's first GPU, read from NVML
(pynvml) or nvidia-smi, resolved through compat/gpus.yaml by its name and memory. The test
doubles stand at that edge only: a recorded pynvml (tests/fixtures/fake_nvml.py) and a
recorded nvidia-smi run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from imgfab.errors import MatrixError, RecipeError
from imgfab.in_image.facts import GpuFacts, HostFacts, read_host
from imgfab.matrix.compat import load_matrix
from imgfab.ops.doctor import HostView, diagnose, matrix_findings
from imgfab.ops.host import NVIDIA_SMI, read_nvidia_smi, read_this_host
from imgfab.ops.select import host_gpu

from conftest import REPO

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from fake_nvml import A100, H100, H200, FakeNvml  # noqa: E402

# nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version
# --format=csv,noheader,nounits on our H200 (tests/fixtures/gpu_proof: name, 9.0, 143771 MiB).
H200_SMI = "0, NVIDIA H200, 9.0, 143771, 580.159.04\n"


def smi(stdout: str = H200_SMI, returncode: int = 0, stderr: str = ""):
    """A recorded nvidia-smi run (what subprocess.run returns), checking the query it gets."""
    def run(argv):
        assert argv == list(NVIDIA_SMI)
        return subprocess.CompletedProcess(argv, returncode, stdout, stderr)
    return run


def missing(argv):
    raise FileNotFoundError("nvidia-smi")


def test_nvml_reports_name_capability_and_memory():
    facts = read_host(FakeNvml(driver="580.159.04", gpus=[H200]))
    assert facts.gpus == [GpuFacts(0, "NVIDIA H200", "9.0", 150754820096)] and facts.via == "NVML"


def test_nvml_without_memory_info_still_reports_the_gpu():
    class NoMemory(FakeNvml):
        def nvmlDeviceGetMemoryInfo(self, handle):
            raise RuntimeError("Not Supported")
    facts = read_host(NoMemory(gpus=[H200]))
    assert facts.error is None and facts.gpus[0].memory_bytes is None


def test_nvidia_smi_is_read_when_pynvml_is_absent():
    facts = read_this_host(None, smi())
    assert facts.via == "nvidia-smi" and facts.driver == "580.159.04"
    assert facts.gpus == [GpuFacts(0, "NVIDIA H200", "9.0", 143771 * 2**20)]
    assert read_this_host(FakeNvml(gpus=[H200]), missing).via == "NVML"  # NVML first


@pytest.mark.parametrize("run, said", [
    (missing, "neither NVML (python package nvidia-ml-py) nor nvidia-smi is installed"),
    (smi("", 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
     "nvidia-smi failed (exit 9): NVIDIA-SMI has failed"),
    (smi("", 6, "No devices were found"), "No devices were found"),
    (smi('Field "compute_cap" is not a valid field to query.\n'), "not index, name, compute_cap"),
    (smi("0, NVIDIA H200, 9.0, 143771, 580.159.04\n1, NVIDIA H200, 9.0, 143771, 575.57.08\n"),
     "several drivers"),
])
def test_nvidia_smi_failures_say_why(run, said):
    facts = read_nvidia_smi(run)
    assert not facts.gpus and said in facts.error


def test_select_without_gpu_takes_the_first_gpu_by_name_and_memory(matrix):
    host = host_gpu(matrix, lambda: read_host(FakeNvml(driver="580.159.04", gpus=[H200, H100])))
    assert (host.gpu, host.compute_capability, host.driver) == ("H200", "9.0", "580.159.04")
    assert host.seen == "NVML: GPU0 NVIDIA H200, 140.4 GiB, driver 580.159.04"
    via_smi = host_gpu(matrix, lambda: read_nvidia_smi(smi("0, A100-SXM4-40GB, 8.0, 40960, 470.57.02\n")))
    assert (via_smi.gpu, via_smi.compute_capability) == ("A100-40GB", "8.0")


def test_select_passes_the_memory_to_the_match(matrix):
    with pytest.raises(RecipeError) as caught:  # named 40 GB, reports 80 GB: not silently 40 GB
        host_gpu(matrix, lambda: read_nvidia_smi(smi("0, NVIDIA A100-SXM4-40GB, 8.0, 81920, 535.104.05\n")))
    assert caught.value.field == "--gpu" and "80.0 GiB" in caught.value.message


def test_explicit_flags_do_not_read_the_host(matrix):
    def unread():
        raise AssertionError("the host was read although --driver and --gpu were given")
    host = host_gpu(matrix, unread, driver="550.54.15", gpu="NVIDIA L40S")
    assert (host.gpu, host.driver, host.seen) == ("L40S", "550.54.15", "")
    only_gpu = host_gpu(matrix, lambda: read_host(FakeNvml(driver="580.159.04", gpus=[H200])), gpu="L4")
    assert (only_gpu.gpu, only_gpu.driver) == ("L4", "580.159.04")


@pytest.mark.parametrize("facts", [
    HostFacts(error="NVML did not start (NVML Shared Library Not Found): no NVIDIA driver visible"),
    HostFacts(driver="580.159.04", gpus=[]),
])
def test_no_gpu_visible_is_the_clear_error_it_was(matrix, facts):
    with pytest.raises(RecipeError) as caught:
        host_gpu(matrix, lambda: facts)
    assert caught.value.field == "--driver/--gpu" and caught.value.fix == "pass --driver and --gpu explicitly"
    assert "cannot read this host's GPU" in caught.value.message


def test_a_gpu_not_in_the_matrix_names_the_flag(matrix):
    with pytest.raises(RecipeError) as caught:
        host_gpu(matrix, lambda: read_host(FakeNvml(gpus=[("NVIDIA H100 NVL", (9, 0), 95830 * 2**20)])))
    assert caught.value.exit_code == 2
    assert caught.value.one_line().startswith("--gpu: unknown GPU 'NVIDIA H100 NVL'")


def test_the_host_capability_must_agree_with_the_matrix(matrix):
    with pytest.raises(MatrixError) as caught:
        host_gpu(matrix, lambda: read_host(FakeNvml(gpus=[("NVIDIA H200", (8, 9), 150754820096)])))
    assert caught.value.exit_code == 1 and "reports 8.9" in caught.value.message


def test_doctor_says_which_matrix_gpu_each_host_gpu_is(matrix):
    host = read_host(FakeNvml(driver="580.159.04", gpus=[H200, A100, ("NVIDIA H100 NVL", (9, 0))]))
    findings = {f.seen.split(" ")[0]: f for f in matrix_findings(host, matrix)}
    assert findings["GPU0"].severity == "ok" and findings["GPU0"].seen.startswith(
        "GPU0 NVIDIA H200, 140.4 GiB is H200 in compat/gpus.yaml (cc 9.0, hopper) (`imgfab select`")
    assert findings["GPU1"].severity == "ok" and "is A100-80GB" in findings["GPU1"].seen
    assert findings["GPU2"].severity == "warn" and "`imgfab select` needs --gpu" in findings["GPU2"].fix
    assert findings["this"].check == "gpu-mixed"


def test_doctor_with_the_matrix_and_no_gpu_stays_as_it_was(matrix):
    view = HostView(files={"/proc/modules": "ext4 1 0 - Live\n", "/proc/driver/nvidia/version": None},
                    host=read_this_host(None, missing))
    findings = diagnose(view, matrix=matrix)
    assert not any(f.check.startswith("gpu-") and f.check != "gpu" for f in findings)
    assert any(f.check == "gpu" and "no NVIDIA GPU" in f.seen for f in findings)


def test_doctor_flags_a_matrix_capability_the_host_contradicts(tmp_path):
    compat = tmp_path / "compat"
    shutil.copytree(REPO / "compat", compat)
    data = yaml.safe_load((compat / "gpus.yaml").read_text())
    next(row for row in data["gpus"] if row["name"] == "H200")["compute_capability"] = "8.9"
    (compat / "gpus.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    host = read_host(FakeNvml(gpus=[H200]))
    (finding,) = matrix_findings(host, load_matrix(compat))
    assert finding.severity == "error" and "reports compute capability 9.0" in finding.seen
