"""The in-image probe against recorded NVML/CUDA answers: no GPU, no pynvml, no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imgfab.in_image import facts, probe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from fake_nvml import A100, H100, L4, FakeCuda, FakeNvml  # noqa: E402
from model_facts import write_model_dir  # noqa: E402

VLLM_LABELS = {
    "org.imgfab.backend": "vllm", "org.imgfab.backend.version": "0.11.0",
    "org.imgfab.cuda": "12.8.1",
    "org.imgfab.driver.floor": "570.124.06", "org.imgfab.driver.policy": "strict",
    "org.imgfab.driver.strict_floor": "570.124.06",
    "org.imgfab.driver.compat_floor": "525.60.13",
    "org.imgfab.gpu": "H100-SXM", "org.imgfab.gpu.cc": "9.0",
    "org.imgfab.archs": "7.0,7.5,8.0,8.6,8.9,9.0,10.0,12.0", "org.imgfab.arch.exact": "false",
    "org.imgfab.precision": "fp8", "org.imgfab.precision.min_cc": "8.9",
    "org.imgfab.precision.max_cc": "",
    "org.imgfab.tp": "1", "org.imgfab.pp": "1", "org.imgfab.shm.min_bytes": "1048576",
    "org.imgfab.model.mount": "/models/qwen2-7b",
    "org.imgfab.weights.required": "config.json,*.safetensors|*.bin",
    "org.imgfab.fit.serving": "precision=fp8,kv=fp8,max_len=32768,utilization=0.9,tp=1,pp=1",
    "org.imgfab.fit.facts": "attention_heads=28,head_size=128,kv_heads=4,layers=28,"
                            "max_positions=32768,parameters=7615616512",
}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    directory = write_model_dir(tmp_path / "model", "Qwen2-7B")
    (directory / "model.safetensors").rename(directory / "model-00001-of-00002.safetensors")
    return directory


@pytest.fixture
def write_labels(tmp_path: Path, model_dir: Path):
    def write(overrides: dict[str, str] | None = None) -> str:
        """VLLM_LABELS with the weights mount at ``model_dir``; keys without ``org.imgfab.``."""
        labels = dict(VLLM_LABELS, **{"org.imgfab.model.mount": str(model_dir)})
        labels.update({f"org.imgfab.{k}": v for k, v in (overrides or {}).items()})
        path = tmp_path / "image.json"
        path.write_text(json.dumps(labels))
        return str(path)
    return write


NATIVE_580 = facts.CudaMode(kernel_driver="580.95.05",
                            libcuda_path="/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
                            libcuda_version="580.95.05", libcuda_cuda="13.0")


def run(image_json: str, *, nvml=None, cuda=None, **kwargs) -> probe.ProbeReport:
    nvml = FakeNvml() if nvml is None else nvml
    cuda = FakeCuda(count=len(nvml.gpus)) if cuda is None else cuda
    kwargs.setdefault("shm_path", os.path.dirname(image_json))  # a real filesystem
    kwargs.setdefault("cuda_mode", NATIVE_580)
    return probe.run_probe(image_json, nvml=nvml, cuda=cuda, **kwargs)


def lines_of(report: probe.ProbeReport, check: str) -> list[str]:
    return [f.line() for f in report.findings if f.verdict.check == check]


def test_passing_host(write_labels):
    report = run(write_labels())
    assert report.exit_code == 0, report.lines()
    assert [f.status for f in report.findings] == ["PASS"] * 8
    assert report.host.driver == "580.95.05"
    assert lines_of(report, "driver") == [
        "PASS driver: driver 580.95.05 ≥ 570.124.06 (CUDA 12.8.1, strict)"]
    assert report.lines()[-1] == "probe: exit 0 (all checks passed)"


def test_driver_line_names_the_runtime_that_sets_the_floor(write_labels):
    """The floor comes from the payload's CUDA runtime (13.0.2 for torch 2.11), not from the
    base image's patch release (13.0.3): the line names the one that decides."""
    labels = write_labels({"cuda": "13.0.3", "cuda.runtime": "13.0.2", "driver.floor": "580.95.05",
                           "driver.strict_floor": "580.95.05"})
    report = run(labels)
    assert lines_of(report, "driver") == [
        "PASS driver: driver 580.95.05 ≥ 580.95.05 (CUDA 13.0.2, strict)"]
    old = run(labels, nvml=FakeNvml(driver="575.57.08"))
    assert "the strict floor for CUDA 13.0.2;" in lines_of(old, "driver")[0]


def test_floor_above_host_driver_is_host_wrong(write_labels):
    report = run(write_labels(), nvml=FakeNvml(driver="535.104.05"))
    assert report.exit_code == probe.EXIT_HOST_WRONG
    assert lines_of(report, "driver") == [
        "FAIL driver: host driver 535.104.05 is older than 570.124.06, the strict floor for "
        "CUDA 12.8.1; fix: upgrade the host driver to ≥ 570.124.06, or resolve with "
        "target.driver_policy: minor-compat (CUDA 12.x floor 525.60.13)"]


# A CUDA 12.8.1 image resolved minor-compat: its floor is the 12.x branch floor, its strict
# floor (driver.strict_floor) the driver that runs 12.8.1 natively.
MINOR_COMPAT_LABELS = {"driver.policy": "minor-compat", "driver.floor": "525.60.13",
                       "driver.strict_floor": "570.124.06", "driver.compat_floor": "525.60.13"}
LIMITS = ("minor-version compatibility: PTX newer than the driver cannot be JIT-compiled, and "
          "features that need a newer driver fail at run time")


@pytest.mark.parametrize("driver, line", [
    ("580.95.05", "PASS driver: driver 580.95.05 ≥ 525.60.13 (CUDA 12.8.1, minor-compat); ≥ 570.124.06, "
                  "the strict floor: the host driver runs CUDA 12.8.1 natively"),
    ("550.54.15", "PASS driver: driver 550.54.15 ≥ 525.60.13 (CUDA 12.8.1, minor-compat); below "
                  f"570.124.06, the strict floor: {LIMITS}"),
    ("520.61.05", "FAIL driver: host driver 520.61.05 is older than 525.60.13, the minor-compat floor "
                  "for CUDA 12.8.1; fix: upgrade the host driver to ≥ 525.60.13 (570.124.06, the "
                  "strict floor, runs CUDA 12.8.1 natively)"),
], ids=["native", "minor-compat", "too-old"])
def test_a_minor_compat_image_judges_the_host_by_its_strict_floor_too(write_labels, driver, line):
    """Issue 31: driver.strict_floor was a label the probe parsed and the rule ignored, so a host
    that runs the image's CUDA natively was told minor-version compatibility's limits, and a host
    too old for the image was not told which driver needs no compatibility layer at all."""
    report = run(write_labels(MINOR_COMPAT_LABELS), nvml=FakeNvml(driver=driver))
    assert lines_of(report, "driver") == [line]


def test_select_judges_the_strict_floor_label_as_the_probe_does():
    from imgfab.stack.verdicts import driver_verdict

    labels = dict(VLLM_LABELS, **{f"org.imgfab.{k}": v for k, v in MINOR_COMPAT_LABELS.items()})
    assert driver_verdict(labels, "520.61.05").fix == (
        "upgrade the host driver to ≥ 525.60.13 (570.124.06, the strict floor, runs CUDA 12.8.1 natively)")


def test_matmul_failure_under_an_old_driver_blames_the_host(write_labels):
    cuda = FakeCuda(count=0)
    report = run(write_labels(), nvml=FakeNvml(driver="535.104.05"), cuda=cuda)
    assert report.exit_code == probe.EXIT_HOST_WRONG
    (cuda_finding,) = [f for f in report.findings if f.verdict.check == "cuda"]
    assert (cuda_finding.status, cuda_finding.blame) == ("FAIL", "host")


def test_the_probe_judges_the_host_gpu_without_a_name_table(write_labels):
    """Issue 18, item 8: inside the image the probe compares the compute capability NVML reports
    with the image's archs and precision labels, so a GPU compat/gpus.yaml does not name (here
    the H100 NVL) is judged like any other, and an image built for another GPU's name is not
    refused for its name."""
    report = run(write_labels({"gpu": "H100-SXM"}), nvml=FakeNvml(gpus=[("NVIDIA H100 NVL", (9, 0))]))
    assert report.exit_code == 0, report.lines()
    assert lines_of(report, "arch")[0].startswith("PASS arch: GPU0 NVIDIA H100 NVL (compute capability 9.0)")


def test_exact_engine_arch_on_other_gpu_is_host_wrong(write_labels):
    image = write_labels({"backend": "tensorrt-llm", "archs": "8.9", "arch.exact": "true",
                          "precision": "bf16", "precision.min_cc": "8.0"})
    report = run(image, nvml=FakeNvml(gpus=[H100]))
    assert report.exit_code == probe.EXIT_HOST_WRONG
    assert lines_of(report, "arch") == [
        "FAIL arch: GPU0 NVIDIA H100 80GB HBM3 (compute capability 9.0) cannot run a TensorRT "
        "engine built for sm_89; fix: pull the image built for this GPU, or rebuild with "
        "target.gpu set to it"]
    assert run(image, nvml=FakeNvml(gpus=[L4])).exit_code == 0


def test_wheel_without_kernels_for_the_gpu_is_host_wrong(write_labels):
    report = run(write_labels({"archs": "8.0,8.6", "precision": "bf16",
                               "precision.min_cc": "8.0"}))
    assert report.exit_code == probe.EXIT_HOST_WRONG
    assert "has no kernels in this build" in lines_of(report, "arch")[0]


def test_fp8_on_compute_capability_8_0_is_host_wrong(write_labels):
    report = run(write_labels(), nvml=FakeNvml(gpus=[A100]))
    assert report.exit_code == probe.EXIT_HOST_WRONG
    assert lines_of(report, "arch")[0].startswith("PASS")
    assert lines_of(report, "precision") == [
        "FAIL precision: fp8 needs compute capability ≥ 8.9; GPU0 NVIDIA A100-SXM4-80GB is 8.0; "
        "fix: use a GPU that supports it or another engine.quantization"]


def test_every_visible_gpu_is_checked(write_labels):
    cuda = FakeCuda(count=2)
    report = run(write_labels(), nvml=FakeNvml(gpus=[H100, A100]), cuda=cuda)
    assert report.exit_code == probe.EXIT_HOST_WRONG
    assert [line[:4] for line in lines_of(report, "precision")] == ["PASS", "FAIL"]
    assert cuda.ran == ["cuda:0", "cuda:1"]


@pytest.mark.parametrize("content, why", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "expected a JSON object of labels"),
    (json.dumps({k: v for k, v in VLLM_LABELS.items() if k != "org.imgfab.driver.floor"}),
     "label org.imgfab.driver.floor is missing"),
    (json.dumps(dict(VLLM_LABELS, **{"org.imgfab.driver.floor": "latest"})),
     "label org.imgfab.driver.floor is not a version: 'latest'"),
    (json.dumps(dict(VLLM_LABELS, **{"org.imgfab.arch.exact": "maybe"})),
     "label org.imgfab.arch.exact is 'maybe'"),
    (json.dumps(dict(VLLM_LABELS, **{"org.imgfab.tp": 2})),
     "label org.imgfab.tp is not a string: 2"),
])
def test_garbled_image_json_is_image_wrong(tmp_path, content, why):
    path = tmp_path / "image.json"
    path.write_text(content)
    report = run(str(path))
    assert report.exit_code == probe.EXIT_IMAGE_WRONG
    (finding,) = report.findings
    assert finding.line().startswith("FAIL image: ")
    assert why in finding.line()


def test_missing_image_json_is_image_wrong(tmp_path):
    report = run(str(tmp_path / "absent.json"))
    assert report.exit_code == probe.EXIT_IMAGE_WRONG
    assert "absent.json not found" in report.lines()[0]


def test_no_nvml_cannot_check(write_labels):
    report = probe.run_probe(write_labels(), nvml=None, cuda=FakeCuda(), cuda_mode=None,
                             shm_path=os.path.dirname(write_labels()))
    assert report.exit_code == probe.EXIT_CANNOT_CHECK
    assert {f.verdict.check: f.status for f in report.findings} == {
        "driver": "NOT RUN", "mode": "SKIP", "arch": "NOT RUN", "precision": "NOT RUN",
        "cuda": "NOT RUN", "shm": "PASS", "fit": "NOT RUN", "weights": "PASS"}
    assert "start the container with --gpus all" in lines_of(report, "driver")[0]


def test_nvml_without_driver_library_cannot_check(write_labels):
    nvml = FakeNvml(init_error="NVML Shared Library Not Found")
    report = run(write_labels(), nvml=nvml)
    assert report.exit_code == probe.EXIT_CANNOT_CHECK
    assert "NVML Shared Library Not Found" in lines_of(report, "driver")[0]


def test_no_gpu_visible_cannot_check(write_labels):
    report = run(write_labels(), nvml=FakeNvml(gpus=[]))
    assert report.exit_code == probe.EXIT_CANNOT_CHECK
    assert lines_of(report, "arch") == [
        "NOT RUN arch: NVML sees no GPU; fix: start the container with --gpus all "
        "(NVIDIA Container Toolkit)"]


def test_torch_absent_is_not_a_pass(write_labels):
    report = probe.run_probe(write_labels(), nvml=FakeNvml(), cuda=None,
                             shm_path=os.path.dirname(write_labels()))
    assert report.exit_code == probe.EXIT_CANNOT_CHECK
    assert lines_of(report, "cuda")[0].startswith(
        "NOT RUN cuda: torch is not installed in this image, so no CUDA matmul was run")


def test_torch_import_broken_is_image_wrong(write_labels):
    report = probe.run_probe(write_labels(), nvml=FakeNvml(), cuda=None,
                             torch_error="import torch failed: libcudnn.so.9: cannot open",
                             shm_path=os.path.dirname(write_labels()))
    assert report.exit_code == probe.EXIT_IMAGE_WRONG


def test_wrong_matmul_under_a_good_driver_is_image_wrong(write_labels):
    report = run(write_labels(), cuda=FakeCuda(errors={"cuda:0": 0.7}))
    assert report.exit_code == probe.EXIT_IMAGE_WRONG
    assert "differs from the CPU by 7.0e-01" in lines_of(report, "cuda")[0]


def test_matmul_raising_under_a_good_driver_is_image_wrong(write_labels):
    error = RuntimeError("CUDA error: no kernel image is available for execution on the device")
    report = run(write_labels(), cuda=FakeCuda(errors={"cuda:0": error}))
    assert report.exit_code == probe.EXIT_IMAGE_WRONG
    assert "no kernel image is available" in lines_of(report, "cuda")[0]


def test_image_wrong_wins_over_host_wrong(write_labels):
    report = run(write_labels({"shm.min_bytes": str(2**62)}),
                 cuda=FakeCuda(errors={"cuda:0": 0.7}))
    assert report.exit_code == probe.EXIT_IMAGE_WRONG


def test_small_shm_is_host_wrong(write_labels):
    report = run(write_labels({"shm.min_bytes": str(2**62)}))
    assert report.exit_code == probe.EXIT_HOST_WRONG
    assert lines_of(report, "shm")[0].endswith("(tp=1 pp=1); fix: start the container with "
                                               "--shm-size=4294967296g or --ipc=host")


def test_missing_weights_mount_is_host_wrong(write_labels, tmp_path):
    report = run(write_labels({"model.mount": str(tmp_path / "nowhere")}))
    assert report.exit_code == probe.EXIT_HOST_WRONG
    assert "nowhere does not exist" in lines_of(report, "weights")[0]


def test_incomplete_weights_are_host_wrong(write_labels, model_dir):
    (model_dir / "model-00001-of-00002.safetensors").unlink()
    report = run(write_labels())
    assert report.exit_code == probe.EXIT_HOST_WRONG
    assert lines_of(report, "weights") == [
        f"FAIL weights: {model_dir} has no *.safetensors|*.bin; fix: mount the model directory "
        f"at {model_dir} (-v /path/to/model:{model_dir}:ro), holding the full model"]
    (model_dir / "pytorch_model.bin").write_bytes(b"\0")
    assert run(write_labels()).exit_code == 0


def test_skip_is_reported_and_not_a_failure(write_labels, tmp_path):
    report = run(write_labels({"model.mount": str(tmp_path / "nowhere")}),
                 nvml=FakeNvml(gpus=[]),
                 skip=frozenset({"weights", "driver", "arch", "precision", "cuda", "fit"}))
    assert report.exit_code == 0
    assert lines_of(report, "weights") == ["SKIP weights: skipped by --skip"]


def test_old_pynvml_bytes_answers(write_labels):
    assert run(write_labels(), nvml=FakeNvml(name_as_bytes=True)).exit_code == 0


def test_cli_json_report_and_exit_code(write_labels, capsys, monkeypatch):
    monkeypatch.setattr(probe, "load_nvml", lambda: FakeNvml(driver="535.104.05"))
    monkeypatch.setattr(probe, "load_cuda_runner", lambda: (FakeCuda(), None))
    code = probe.main(["--image-json", write_labels(), "--json", "--skip", "shm"])
    report = json.loads(capsys.readouterr().out)
    assert code == report["exit_code"] == 3
    assert report["host"]["gpus"] == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}]
    assert [c["status"] for c in report["checks"]] == ["FAIL", "SKIP", "PASS", "PASS", "PASS", "SKIP",
                                                       "PASS", "PASS"]


def test_cli_rejects_unknown_skip(capsys):
    with pytest.raises(SystemExit) as exc:
        probe.main(["--skip", "weights,gpu"])
    assert exc.value.code == 2
    assert "unknown check(s) gpu" in capsys.readouterr().err


def test_probe_imports_only_the_standard_library():
    src = Path(probe.__file__).resolve().parents[2]
    code = ("import sys; import imgfab.in_image.probe; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] not in "
            "sys.stdlib_module_names and m.split('.')[0] not in ('imgfab', '__main__')))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, "
                          f"{str(src)!r}); {code}"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_torch_cuda_runner_on_cpu():
    torch = pytest.importorskip("torch", reason="torch not installed: TorchCuda runs in "
                                                "tests/gpu on the GPU machine")
    assert facts.TorchCuda(torch).matmul_error("cpu") == 0.0


def test_unknown_kernel_archs_are_skipped_not_passed(write_labels):
    # A TensorRT-LLM release whose kernel list the matrix could not confirm has an empty label.
    report = run(write_labels({"archs": ""}))
    assert report.exit_code == 0, report.lines()
    assert lines_of(report, "arch") == [
        "SKIP arch: the image's kernel architectures are unknown (unconfirmed matrix row): not checked"]


# --- mode: which compatibility mode the container really runs in ---------------------------------

def _facts(write_labels, **labels) -> facts.ImageFacts:
    return facts.load_image_facts(write_labels(**labels))


def test_mode_forward_compat_fails_a_strict_image(write_labels):
    compat = facts.CudaMode(kernel_driver="535.104.05",
                            libcuda_path="/usr/local/cuda-12.8/compat/libcuda.so.570.124.06",
                            libcuda_version="570.124.06", libcuda_cuda="12.8")
    [finding] = probe.check_mode(_facts(write_labels), compat)
    assert finding.status == "FAIL" and "runs in forward-compat" in finding.verdict.reason
    assert "kernel driver 535.104.05, libcuda 570.124.06" in finding.verdict.reason
    assert "/usr/local/cuda/compat" in finding.verdict.fix


def test_mode_native_and_minor_compat(write_labels):
    [native] = probe.check_mode(_facts(write_labels), NATIVE_580)
    assert native.status == "PASS" and "runs native" in native.verdict.reason
    old = facts.CudaMode(kernel_driver="535.104.05",
                         libcuda_path="/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05",
                         libcuda_version="535.104.05", libcuda_cuda="12.2")
    [strict] = probe.check_mode(_facts(write_labels), old)
    assert strict.status == "FAIL" and "runs in minor-compat" in strict.verdict.reason


def test_mode_skips_without_libcuda(write_labels):
    [finding] = probe.check_mode(_facts(write_labels), None)
    assert finding.status == "SKIP"


def test_read_cuda_mode_parses_proc_files(tmp_path, monkeypatch):
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  "
                       "Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Sep 25 2025\n")
    maps = tmp_path / "maps"
    lib = tmp_path / "compat" / "libcuda.so.590.48.01"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    maps.write_text(f"7f00-7f01 r-xp 00000000 08:01 1 {lib}\n")

    class FakeLib:
        def cuDriverGetVersion(self, out):
            out._obj.value = 13010
            return 0

    import ctypes
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeLib())
    mode = facts.read_cuda_mode(str(version), str(maps))
    assert mode.kernel_driver == "580.95.05" and mode.libcuda_version == "590.48.01"
    assert mode.libcuda_cuda == "13.1" and mode.mode == "forward-compat"


@pytest.mark.parametrize("kind", ["directory", "fifo"])
@pytest.mark.parametrize("name", ["config.json", "model-00001-of-00002.safetensors"])
def test_weights_must_be_regular_files(write_labels, model_dir, name, kind):
    """issue 21: a directory or a FIFO named like a weights file is refused, without opening
    it (a FIFO would block whoever reads it)."""
    (model_dir / name).unlink()
    if kind == "directory":
        (model_dir / name).mkdir()
    else:
        os.mkfifo(model_dir / name)
    report = run(write_labels())
    assert report.exit_code == probe.EXIT_HOST_WRONG
    assert lines_of(report, "weights") == [
        f"FAIL weights: {model_dir}: {name} is not a regular file; fix: mount the model "
        f"directory at {model_dir} (-v /path/to/model:{model_dir}:ro), holding the model's "
        f"files as they were downloaded"]


def test_weights_reached_through_symbolic_links_are_fine(write_labels, model_dir, tmp_path):
    """A Hugging Face cache snapshot links each file to its blob."""
    blob = tmp_path / "blob"
    blob.write_text("{}")
    (model_dir / "config.json").unlink()
    (model_dir / "config.json").symlink_to(blob)
    assert run(write_labels()).exit_code == 0


# The fit check at start: the mounted weights' config.json on the GPUs NVML sees.

def test_fit_passes_with_the_numbers(write_labels):
    report = run(write_labels())
    (line,) = lines_of(report, "fit")
    assert line.startswith("PASS fit: 7.6 GB of weights + 0.9 GB of KV cache (32768 tokens) = 8.6 GB"
                           " ≤ 77.3 GB (1× NVIDIA H100 80GB HBM3 (80.0 GiB) at 0.9)")


def test_fit_refuses_a_model_that_does_not_fit_the_gpus_seen(write_labels, tmp_path):
    big = write_model_dir(tmp_path / "big", "Llama-3.1-70B")
    report = run(write_labels({"model.mount": str(big), "fit.facts": "",
                               "fit.serving": "precision=bf16,kv=auto,max_len=8192,"
                                              "utilization=0.9,tp=1,pp=1"}))
    assert report.exit_code == probe.EXIT_HOST_WRONG
    (line,) = lines_of(report, "fit")
    assert line.startswith(f"FAIL fit: the model ({big}/config.json) needs 141.1 GB of weights "
                           "(70.6B parameters in bf16), 1× NVIDIA H100 80GB HBM3 (80.0 GiB) hold 77.3 GB")
    two = run(write_labels({"model.mount": str(big), "fit.facts": "",
                            "fit.serving": "precision=bf16,kv=auto,max_len=8192,"
                                           "utilization=0.9,tp=2,pp=1"}),
              nvml=FakeNvml(gpus=[H100, H100]))
    assert lines_of(two, "fit")[0].startswith("PASS fit: 141.1 GB of weights")


def test_fit_judges_the_smallest_gpu_and_counts_them(write_labels, tmp_path):
    labels = write_labels({"fit.serving": "precision=bf16,kv=auto,max_len=32768,"
                                          "utilization=0.9,tp=2,pp=1"})
    one = run(labels)
    assert one.exit_code == probe.EXIT_HOST_WRONG
    assert lines_of(one, "fit") == ["FAIL fit: sees 1 GPU(s); the image serves on 2 per node (tp=2 pp=1); "
                                    "fix: start the container with 2 GPUs (--gpus all on a host "
                                    "that has them)"]
    small = ("NVIDIA T4", (7, 5), 4 * 2**30)
    mixed = run(labels, nvml=FakeNvml(gpus=[H100, small]))
    assert "2× NVIDIA T4 (4.0 GiB) hold 7.7 GB" in lines_of(mixed, "fit")[0]


def test_fit_refuses_heads_and_positions_of_the_mounted_model(write_labels):
    heads = run(write_labels({"fit.serving": "precision=fp8,kv=fp8,max_len=32768,"
                                             "utilization=0.9,tp=3,pp=1"}),
                nvml=FakeNvml(gpus=[H100] * 3))
    assert "28 attention heads are not divisible by tensor parallel size 3" in lines_of(heads, "fit")[0]
    assert heads.exit_code == probe.EXIT_HOST_WRONG
    long = run(write_labels({"fit.serving": "precision=fp8,kv=fp8,max_len=65536,"
                                            "utilization=0.9,tp=1,pp=1"}))
    assert "max length 65536 is above the model's 32768 positions" in lines_of(long, "fit")[0]


def test_fit_without_facts_or_labels_is_skipped_not_passed(write_labels, tmp_path):
    old = run(write_labels({"fit.serving": ""}))
    assert lines_of(old, "fit")[0].startswith("SKIP fit: the image declares no serving shape")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text('{"num_attention_heads": 28}')
    (bare / "w.bin").write_text("")
    none = run(write_labels({"model.mount": str(bare), "fit.facts": ""}))
    assert lines_of(none, "fit")[0].startswith("SKIP fit: fit not checked: ")
    broken = run(write_labels({"fit.serving": "precision=fp8"}))
    assert broken.exit_code == probe.EXIT_IMAGE_WRONG
