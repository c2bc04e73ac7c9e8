"""Issue 35 (the right architecture): select refuses an image whose platform is not the host's,
naming both, and doctor on an aarch64 host says the images imgfab builds cannot run there.

The host's platform: with --gpu, its compat/gpus.yaml row's cpu_arch (GH200, GB200: aarch64
Grace → linux/arm64); without, this machine's (platform.machine()). An image's: its
org.imgfab.platform label, else its image config's os/architecture (images built before it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import pytest

from imgfab.in_image.facts import GpuFacts, HostFacts
from imgfab.ops.doctor import HostView, diagnose, image_findings, live_view
from imgfab.ops.select import HostGpu, Published, choose, host_gpu, what_host_needs

from test_select_digest import MANIFEST, _Fake, _sha
from test_select_doctor import _labels

AMD64, ARM64 = "linux/amd64", "linux/arm64"


def _no_host():
    raise AssertionError("select read this host although --driver and --gpu were given")


@pytest.fixture(scope="module")
def good(matrix) -> dict[str, str]:
    return _labels(matrix, "qwen2-7b-h100")


# --- the host's platform ----------------------------------------------------------------------

@pytest.mark.parametrize("gpu, platform", [("GH200", ARM64), ("GB200", ARM64), ("H100", AMD64),
                                           ("B200", AMD64)])
def test_with_gpu_the_platform_is_that_gpus_cpu(matrix, gpu, platform):
    host = host_gpu(matrix, _no_host, driver="580.65.06", gpu=gpu, machine=lambda: "x86_64")
    assert host.platform == platform
    assert host.platform_seen.startswith(f"{host.gpu} hosts are ")


@pytest.mark.parametrize("machine, platform", [("x86_64", AMD64), ("aarch64", ARM64), ("arm64", ARM64),
                                               ("ppc64le", "linux/ppc64le")])
def test_without_gpu_the_platform_is_this_machines(matrix, machine, platform):
    facts = HostFacts(driver="580.65.06", gpus=[GpuFacts(0, "NVIDIA H100 80GB HBM3", "9.0", 85520809984)])
    host = host_gpu(matrix, lambda: facts, machine=lambda: machine)
    assert host.gpu == "H100-SXM" and host.platform == platform
    assert host.platform_seen == f"this machine is {machine}"


# --- the choice -------------------------------------------------------------------------------

def test_gh200_refuses_every_amd64_candidate(matrix, good):
    host = host_gpu(matrix, _no_host, driver="999.1.1", gpu="GH200")
    images = [Published("r/x", f"t{i}", f"sha256:{i:064x}", _labels(matrix, name))
              for i, name in enumerate(["qwen2-7b-h100", "qwen2-7b-h200", "llama31-8b-h100-fp8-engine"])]
    assert all(image.labels["org.imgfab.platform"] == AMD64 for image in images)
    best, candidates = choose(images, host)
    assert best is None and len(candidates) == 3
    for candidate in candidates:
        assert not candidate.fits and candidate.platform == AMD64
        assert candidate.rejection()["constraint"] == "platform"
        assert candidate.reason().startswith(
            "platform: linux/amd64 image: this host is linux/arm64 (GH200 hosts are aarch64, "
            "compat/gpus.yaml cpu_arch)"), candidate.reason()
    assert "linux/arm64" in what_host_needs(candidates, host)
    # the same images on an H100 host: the H100 ones fit (the platform alone refused them)
    h100 = HostGpu("999.1.1", "H100-SXM", "9.0", AMD64)
    assert choose(images, h100)[0] is not None


def test_an_amd64_host_refuses_an_arm64_candidate(good):
    host = HostGpu("999.1.1", "H100-SXM", "9.0", AMD64, platform_seen="this machine is x86_64")
    arm = Published("r/x", "z-arm", "sha256:" + "1" * 64, {**good, "org.imgfab.platform": ARM64})
    amd = Published("r/x", "a-amd", "sha256:" + "2" * 64, good)
    best, candidates = choose([arm, amd], host)
    assert best is not None and best.image.tag == "a-amd"
    (refused,) = [c for c in candidates if c.image.tag == "z-arm"]
    assert not refused.fits and refused.rejection()["constraint"] == "platform"
    assert "linux/arm64 image: this host is linux/amd64 (this machine is x86_64)" in refused.reason()
    # alone, nothing fits: never chosen
    assert choose([arm], host)[0] is None


def test_an_image_without_the_label_is_judged_by_its_config(good):
    """Images built before the label: the config's os/architecture; neither: refused."""
    older = {k: v for k, v in good.items() if k != "org.imgfab.platform"}
    host = HostGpu("999.1.1", "H100-SXM", "9.0", AMD64)
    judged = {tag: choose([Published("r/x", tag, "sha256:" + "3" * 64, older, config_platform=config)],
                          host)[1][0] for tag, config in (("amd", AMD64), ("arm", "linux/arm64"), ("none", ""))}
    assert judged["amd"].fits and judged["amd"].platform == AMD64
    assert not judged["arm"].fits and "linux/arm64 image: this host is linux/amd64" in judged["arm"].reason()
    assert not judged["none"].fits and "records no platform" in judged["none"].reason()
    # the label wins over the config
    labelled = Published("r/x", "l", "sha256:" + "4" * 64, good, config_platform="linux/arm64")
    assert choose([labelled], host)[0] is not None


# --- the CLI, against a registry --------------------------------------------------------------

@pytest.fixture
def fake():
    registry = _Fake()
    yield registry
    registry.close()


def _select(fake, tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMGFAB_", "DOCKER_"))}
    env["DOCKER_CONFIG"] = str(tmp_path)
    return subprocess.run([sys.executable, "-c", "from imgfab.cli import main; main()", "select",
                           "--registry", f"{fake.host}/llm/x", "--driver", "999.1.1", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def _config_image(fake, labels: dict, platform: tuple[str, str] | None) -> bytes:
    """A manifest whose config has ``labels`` and, when given, its os and architecture."""
    config = {"config": {"Labels": labels}}
    if platform:
        config["os"], config["architecture"] = platform
    body = json.dumps(config).encode()
    fake.server.get[f"/v2/llm/x/blobs/{_sha(body)}"] = (200, body, {})
    return json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                       "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                                  "digest": _sha(body), "size": len(body)}, "layers": []}).encode()


def test_select_gpu_gh200_refuses_every_amd64_image(fake, good, tmp_path):
    older = {k: v for k, v in good.items() if k != "org.imgfab.platform"}
    fake.manifest("v1", fake.image(good))                                  # labelled
    config_only = _config_image(fake, older, ("linux", "amd64"))
    fake.manifest("v2", config_only)                                       # config only
    result = _select(fake, tmp_path, "--gpu", "GH200", "--explain")
    assert result.returncode == 1, result.stdout
    lines = [line for line in result.stdout.splitlines() if line.startswith("- ")]
    assert len(lines) == 2 and all(
        "platform: linux/amd64 image: this host is linux/arm64 (GH200 hosts are aarch64" in line
        for line in lines), result.stdout
    assert "(cc 9.0, linux/arm64)" in result.stderr and "linux/arm64" in result.stderr.split("fix:")[-1]
    # the same registry on an H100: both fit, the newest (the tag breaks the tie) is chosen
    chosen = _select(fake, tmp_path, "--gpu", "H100")
    assert chosen.returncode == 0 and chosen.stdout.strip().endswith(_sha(config_only))


def test_select_json_names_each_candidates_platform(fake, good, tmp_path):
    from imgfab.output import output_schema

    fake.manifest("v1", fake.image(good))
    result = _select(fake, tmp_path, "--gpu", "GH200", "--json")
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    jsonschema.Draft202012Validator(output_schema()).validate(doc)
    assert doc["host"]["platform"] == ARM64 and doc["selected"] is None
    (candidate,) = doc["candidates"]
    assert candidate["platform"] == AMD64 and candidate["constraint"] == "platform"
    assert not candidate["fits"] and "this host is linux/arm64" in candidate["reason"]


def test_select_resolves_an_index_to_the_hosts_platform(fake, good, tmp_path):
    """A multi-arch index is judged by the host's entry, as the daemon would pull it."""
    amd = fake.image(good)
    fake.manifest(_sha(amd), amd, tag=False)
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": [{"mediaType": MANIFEST, "digest": _sha(amd), "size": len(amd),
                                       "platform": {"os": "linux", "architecture": "amd64"}}]}).encode()
    fake.manifest("multi", index)
    result = _select(fake, tmp_path, "--gpu", "GH200", "--explain")
    assert result.returncode == 1
    assert any(line.startswith("- multi:") and "has no linux/arm64 image (offers linux/amd64)" in line
               for line in result.stdout.splitlines()), result.stdout


# --- doctor -----------------------------------------------------------------------------------

def _view(machine: str | None) -> HostView:
    return HostView(host=HostFacts(driver="580.65.06", gpus=[GpuFacts(0, "NVIDIA GH200 480GB", "9.0")]),
                    machine=machine)


def test_doctor_on_aarch64_says_imgfabs_images_cannot_run_here():
    found = [f for f in diagnose(_view("aarch64")) if f.check == "platform"]
    assert len(found) == 1, found
    finding = found[0]
    assert finding.severity == "error"
    assert finding.seen.startswith("this host is linux/arm64 (CPU aarch64): the images imgfab builds "
                                   "are linux/amd64 only and cannot run here")
    assert "x86_64" in finding.fix


@pytest.mark.parametrize("machine", ["x86_64", None])
def test_doctor_on_x86_64_says_nothing_new(machine):
    assert not [f for f in diagnose(_view(machine)) if "platform" in f.check]


def test_doctor_reads_the_machine(monkeypatch):
    import platform

    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    view = live_view()
    assert view.machine == "aarch64"
    assert [f.check for f in diagnose(view) if f.check == "platform"] == ["platform"]


def test_doctor_judges_an_images_platform_on_this_machine(good):
    host = HostFacts(driver="999.1.1", gpus=[GpuFacts(0, "NVIDIA H100 80GB HBM3", "9.0")])
    on_arm = {f.check: f for f in image_findings(good, host, machine="aarch64")}
    assert on_arm["image-platform"].severity == "error"
    assert on_arm["image-platform"].seen == ("linux/amd64 image: this host is linux/arm64 "
                                             "(this machine is aarch64)")
    on_x86 = {f.check: f for f in image_findings(good, host, machine="x86_64")}
    assert on_x86["image-platform"].severity == "ok"
