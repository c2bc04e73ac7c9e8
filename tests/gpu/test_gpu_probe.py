"""The in-image probe on a real GPU: real NVML answers, a real CUDA matmul, real refusals.

Run on the GPU machine: ``pytest -m gpu tests/gpu -q``. The probe runs as a subprocess the
way an image runs it (``python -m imgfab.in_image.probe`` with ``PYTHONPATH`` at the package), against
label sets written here; nvidia-smi is the independent witness for what NVML should report.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def gpus() -> list[dict[str, str]]:
    """What nvidia-smi says: driver version and compute capability of each GPU."""
    if shutil.which("nvidia-smi") is None:
        pytest.fail("no nvidia-smi: this test needs an NVIDIA GPU; run it on the GPU machine")
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,compute_cap",
                          "--format=csv,noheader"], capture_output=True, text=True, check=True)
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.strip().splitlines()]
    print(f"\nnvidia-smi: {rows}")
    return [dict(zip(("index", "name", "driver", "cc"), row, strict=True)) for row in rows]


@pytest.fixture
def labels(tmp_path: Path) -> dict[str, str]:
    """A vLLM image for this GPU; weights mount with the files the image requires."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 16)
    return {
        "org.imgfab.backend": "vllm", "org.imgfab.backend.version": "0.11.0",
        "org.imgfab.cuda": "12.8.1",
        "org.imgfab.driver.floor": "570.124.06", "org.imgfab.driver.policy": "strict",
        "org.imgfab.driver.strict_floor": "570.124.06",
        "org.imgfab.driver.compat_floor": "525.60.13",
        "org.imgfab.gpu": "H100-SXM", "org.imgfab.gpu.cc": "9.0",
        "org.imgfab.archs": "7.0,7.5,8.0,8.6,8.9,9.0,10.0,12.0",
        "org.imgfab.arch.exact": "false",
        "org.imgfab.precision": "bf16", "org.imgfab.precision.min_cc": "8.0",
        "org.imgfab.precision.max_cc": "",
        "org.imgfab.tp": "1", "org.imgfab.pp": "1",
        "org.imgfab.shm.min_bytes": str(64 * 2**20),  # docker's default --shm-size
        "org.imgfab.model.mount": str(model),
        "org.imgfab.weights.required": "config.json,*.safetensors|*.bin",
    }


def probe(tmp_path: Path, labels: dict[str, str]) -> tuple[int, dict]:
    image_json = tmp_path / "image.json"
    image_json.write_text(json.dumps(labels))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-m", "imgfab.in_image.probe", "--image-json",
                           str(image_json), "--json"], capture_output=True, text=True, env=env,
                          timeout=300)
    report = json.loads(done.stdout)
    print()
    for check in report["checks"]:
        print(check["line"])
    print(f"probe: exit {done.returncode} ({report['meaning']})")
    assert done.returncode == report["exit_code"], done.stderr
    return done.returncode, report


def test_probe_passes_on_this_gpu(tmp_path, labels, gpus):
    code, report = probe(tmp_path, labels)
    assert code == 0, report
    assert report["host"]["driver"] == gpus[0]["driver"]
    assert [g["compute_capability"] for g in report["host"]["gpus"]] == [g["cc"] for g in gpus]
    cuda = [c for c in report["checks"] if c["check"] == "cuda"]
    assert len(cuda) == len(gpus)
    assert all(c["status"] == "PASS" and "matches the CPU" in c["reason"] for c in cuda)
    assert {c["check"] for c in report["checks"]} == {"driver", "mode", "arch", "precision", "cuda",
                                                       "shm", "weights"}
    (mode,) = [c for c in report["checks"] if c["check"] == "mode"]
    assert mode["status"] == "PASS" and mode["reason"].startswith("runs native (kernel driver ")


def test_probe_refuses_a_floor_above_the_host_driver(tmp_path, labels, gpus):
    floor = f"{int(gpus[0]['driver'].split('.')[0]) + 1}.0.0"
    labels["org.imgfab.driver.floor"] = labels["org.imgfab.driver.strict_floor"] = floor
    code, report = probe(tmp_path, labels)
    assert code == 3
    (driver,) = [c for c in report["checks"] if c["check"] == "driver"]
    assert driver["status"] == "FAIL"
    assert driver["reason"].startswith(f"host driver {gpus[0]['driver']} is older than {floor}")


def test_probe_refuses_an_engine_built_for_another_arch(tmp_path, labels, gpus):
    other = "8.9" if gpus[0]["cc"] != "8.9" else "9.0"
    labels.update({"org.imgfab.backend": "tensorrt-llm", "org.imgfab.archs": other,
                   "org.imgfab.arch.exact": "true"})
    code, report = probe(tmp_path, labels)
    assert code == 3
    arch = [c for c in report["checks"] if c["check"] == "arch"]
    assert all(c["status"] == "FAIL" for c in arch)
    assert (f"cannot run a TensorRT engine built for sm_{other.replace('.', '')}"
            in arch[0]["reason"])
