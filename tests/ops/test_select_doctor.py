"""select (pure choice over published labels) and doctor (recorded host answers)."""

from __future__ import annotations

import copy

import pytest
import yaml

from imgfab.ops.doctor import HostView, diagnose, exit_code, image_findings
from imgfab.in_image.facts import GpuFacts, HostFacts
from imgfab.recipe import parse_recipe, recipe_hash
from imgfab.render.context import image_labels
from imgfab.stack.resolve import resolve
from imgfab.ops.select import HostGpu, Published, choose, what_host_needs

from conftest import REPO

AMD64 = "linux/amd64"  # the platform imgfab builds, and the hosts these tables judge


def _labels(matrix, name: str, **changes) -> dict[str, str]:
    data = yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text())
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        data[section][key] = value
    recipe = parse_recipe(copy.deepcopy(data))
    stack = resolve(recipe, matrix).stack
    return image_labels(recipe, stack, recipe_hash(recipe), "config.json")


@pytest.fixture(scope="module")
def published(matrix) -> list[Published]:
    """Images as `imgfab build` labels them: several CUDA floors, archs, backends, precisions."""
    specs = [
        ("a-strict-new", "qwen2-7b-h100", {"target__driver_policy": "strict", "target__driver": ">=999.0"}),
        # the examples as they were before issue 34 moved them to forward-compat: vLLM 0.19.1,
        # its critical advisory accepted by name
        ("b-compat-cu12", "qwen2-7b-h100", {"target__driver_policy": "minor-compat",
                                            "backend__accept_advisories": ["CVE-2026-48746"]}),
        ("c-l4-bf16", "llama31-8b-l4", {"target__driver_policy": "strict",
                                        "backend__accept_advisories": ["CVE-2026-48746"]}),
        ("d-engine-sm90", "llama31-8b-h100-fp8-engine", {}),
        ("e-engine-sm89", "qwen2-7b-l40s-awq-engine", {}),
    ]
    return [Published("127.0.0.1:5000/llm/x", tag, f"sha256:{i:064x}", _labels(matrix, name, **changes))
            for i, (tag, name, changes) in enumerate(specs)]


@pytest.mark.parametrize("driver, gpu, cc, backend, expected", [
    ("999.1.1", "H100-SXM", "9.0", "vllm", "a-strict-new"),     # newest strict image fits a new driver
    ("535.104.05", "H100-SXM", "9.0", "vllm", "b-compat-cu12"),  # old driver: the minor-compat image
    # vLLM serves fp8 on 8.0 weight-only (FP8 Marlin from 7.5, compat/precisions.yaml): the fp8 image fits
    ("999.1.1", "A100-80GB", "8.0", "vllm", "a-strict-new"),
    ("999.1.1", "V100", "7.0", "vllm", None),                    # fp8 and bf16 images refused on 7.0
    ("999.1.1", "L40S", "8.9", "tensorrt-llm", "e-engine-sm89"),  # exact engine arch
    ("999.1.1", "H100-SXM", "9.0", "tensorrt-llm", "d-engine-sm90"),
    ("999.1.1", "A100-80GB", "8.0", "tensorrt-llm", None),       # no engine built for sm_80
    ("470.57.02", "H100-SXM", "9.0", "vllm", None),              # driver too old for all
])
def test_select_table(published, driver, gpu, cc, backend, expected):
    best, candidates = choose(published, HostGpu(driver, gpu, cc, AMD64), backend=backend)
    assert (best.image.tag if best else None) == expected, [(c.image.tag, c.reason()) for c in candidates]
    assert all(c.reason() for c in candidates)
    if best:
        assert best.image.reference.startswith("127.0.0.1:5000/llm/x@sha256:")


def test_refusal_names_what_the_host_needs(published):
    best, candidates = choose(published, HostGpu("470.57.02", "H100-SXM", "9.0", AMD64), backend="vllm")
    assert best is None
    assert what_host_needs(candidates, HostGpu("470.57.02", "H100-SXM", "9.0", AMD64)).startswith("driver ≥ 525.60.13")


def test_model_filter(published):
    best, _ = choose(published, HostGpu("999.1.1", "L4", "8.9", AMD64), model="llama31-8b-l4")
    assert best.image.tag == "c-l4-bf16"


NO_GPU = HostView(files={"/proc/modules": "ext4 1 0 - Live\n", "/proc/driver/nvidia/version": None},
                  host=HostFacts(error="NVML is not available"), shm_bytes=64 * 1024**2, memlock_soft=8 * 1024**2,
                  free_disk_bytes=100 * 1024**3, docker_info={"ServerVersion": "20.10.24", "Runtimes": {"runc": {}}})


def test_doctor_no_gpu_says_so_and_checks_the_rest():
    findings = diagnose(NO_GPU)
    lines = "\n".join(f.line() for f in findings)
    assert "no NVIDIA GPU" in lines
    assert any(f.check == "shm" and f.severity == "warn" for f in findings)
    assert any(f.check == "memlock" for f in findings)
    assert any(f.check == "docker" and f.severity == "ok" for f in findings)


def test_doctor_failure_cases():
    view = copy.deepcopy(NO_GPU)
    view.files["/proc/modules"] = "nouveau 1 0 - Live\nnvidia 1 0 - Live\n"
    view.host = HostFacts(error="NVML did not start (Driver/library version mismatch)")
    view.docker_info = {"ServerVersion": "24.0", "Runtimes": {"runc": {}}, "CgroupDriver": "systemd",
                        "CgroupVersion": "2"}
    view.free_disk_bytes = 1024**3
    checks = {f.check: f for f in diagnose(view)}
    assert checks["nouveau"].severity == "error" and "blacklist" in checks["nouveau"].fix
    assert checks["driver"].severity == "error"
    assert checks["nvidia-runtime"].severity == "error" and "nvidia-ctk" in checks["nvidia-runtime"].fix
    assert checks["cgroups"].severity == "warn"
    assert checks["disk"].severity == "error"
    assert exit_code(list(checks.values())) == 1


def test_doctor_docker_down():
    view = copy.deepcopy(NO_GPU)
    view.docker_info, view.docker_error = None, "connection refused"
    finding = next(f for f in diagnose(view) if f.check == "docker")
    assert finding.severity == "error" and "DOCKER_HOST" in finding.fix


def test_doctor_image_against_a_recorded_h200(matrix):
    host = HostFacts(driver="580.159.04", gpus=[GpuFacts(0, "NVIDIA H200", "9.0")])
    ok = image_findings(_labels(matrix, "llama31-8b-h100-fp8-engine"), host)
    assert all(f.severity == "ok" for f in ok), ok
    wrong = image_findings(_labels(matrix, "qwen2-7b-l40s-awq-engine"), host)
    assert any(f.check == "image-arch" and f.severity == "error" for f in wrong)


def test_doctor_on_this_machine_runs_without_gpu():
    from imgfab.ops.doctor import live_view

    findings = diagnose(live_view(None))
    assert findings and all(f.line() for f in findings)
