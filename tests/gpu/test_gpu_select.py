"""`imgfab select` on a real GPU host, with no ``--gpu``: the host's GPU is read from NVML.

Run on the GPU machine after the stand-in image exists (tests/gpu/test_gpu_vllm_shapes.py) and
``tests/gpu/standin.sh registry`` started a registry on loopback (plain http there, as on any
loopback registry)::

    IMGFAB_GPU_PROOF_OUT=/tmp/proof python -m pytest -m gpu tests/gpu/test_gpu_select.py -s

The fleet repository holds three images, each carrying the labels of the stand-in built from the
rendered runtime stage of ``recipes/qwen2-7b-h200.yaml`` (read back with ``docker inspect``, so
they are what the build wrote), on a one-file image so that the GPU machine's minutes go to
select and not to pushing 8 GB:
  - ``h200``: those labels, unchanged: the one that must be picked;
  - ``a100-only``: the same, but built for compute capability 8.0 only and a newer vLLM, so it
    wins on version alone and must lose on the architecture the host's GPU reports;
  - ``newer-driver``: the same, but with a driver floor above this host's driver and a newer
    vLLM, so it must lose on the driver the host reports (``--driver`` omitted) or is given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
IMAGE = "imgfab-proof/qwen2-7b-h200:standin"
P = "org.imgfab"


def _registry() -> str:
    registry = os.environ.get("IMGFAB_STANDIN_REGISTRY")
    if not registry:
        pytest.fail("IMGFAB_STANDIN_REGISTRY is not set: run tests/gpu/standin.sh registry and "
                    "eval its env on the GPU machine")
    return registry


def _host_driver() -> str:
    done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, check=True)
    return done.stdout.split()[0]


def _select(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "imgfab.cli", "select", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def _push_labelled(tmp_path: Path, name: str, labels: dict[str, str]) -> str:
    """A one-file image with ``labels``, pushed as ``name``; returns its manifest digest."""
    context = tmp_path / name.rsplit(":", 1)[1]
    context.mkdir()
    (context / "marker").write_text(name + "\n")
    lines = ["FROM scratch", "COPY marker /marker", "LABEL \\"]
    lines += [f"      {json.dumps(k)}={json.dumps(v)} \\" for k, v in sorted(labels.items())]
    lines[-1] = lines[-1].removesuffix(" \\")
    (context / "Dockerfile").write_text("\n".join(lines) + "\n")
    subprocess.run(["docker", "build", "-q", "-t", name, str(context)], check=True,
                   capture_output=True, env=dict(os.environ, DOCKER_BUILDKIT="0"))
    subprocess.run(["docker", "push", name], check=True, capture_output=True)
    digests = subprocess.run(["docker", "image", "inspect", name, "--format",
                              "{{json .RepoDigests}}"], check=True, capture_output=True, text=True)
    (digest,) = [d.split("@")[1] for d in json.loads(digests.stdout) if d.startswith(name.rsplit(":", 1)[0])]
    return digest


def test_select_reads_the_h200_and_picks_the_image_built_for_it(tmp_path):
    inspected = subprocess.run(["docker", "image", "inspect", IMAGE, "--format",
                                "{{json .Config.Labels}}"], capture_output=True, text=True)
    if inspected.returncode != 0:
        pytest.fail(f"{IMAGE} is not built here: run tests/gpu/test_gpu_vllm_shapes.py first")
    labels = {k: v for k, v in json.loads(inspected.stdout).items() if k.startswith(P)}
    assert labels[f"{P}.gpu"] == "H200" and "9.0" in labels[f"{P}.archs"].split(","), labels
    driver = _host_driver()
    fleet = f"{_registry()}/llm/fleet-{uuid.uuid4().hex[:8]}"
    digests = {
        "h200": _push_labelled(tmp_path, f"{fleet}:h200", labels),
        "a100-only": _push_labelled(tmp_path, f"{fleet}:a100-only", dict(
            labels, **{f"{P}.archs": "8.0", f"{P}.arch.exact": "true", f"{P}.gpu": "A100-80GB",
                       f"{P}.gpu.cc": "8.0", f"{P}.backend.version": "0.99.0"})),
        "newer-driver": _push_labelled(tmp_path, f"{fleet}:newer-driver", dict(
            labels, **{f"{P}.driver.floor": "999.10.01", f"{P}.driver.strict_floor": "999.10.01",
                       f"{P}.driver.compat_floor": "999", f"{P}.backend.version": "0.99.0"})),
    }
    runs = {}
    for name, args in (("given driver", ["--driver", driver]), ("nothing given", [])):
        picked = _select("--registry", fleet, *args)
        explained = _select("--registry", fleet, *args, "--explain")
        as_json = _select("--registry", fleet, *args, "--json")
        runs[name] = {"argv": ["imgfab", "select", "--registry", fleet, *args],
                      "rc": picked.returncode, "stdout": picked.stdout, "stderr": picked.stderr,
                      "explain": explained.stdout.splitlines(), "json": json.loads(as_json.stdout or "null")}
        print(f"\n{name}: {' '.join(runs[name]['argv'])}\n{picked.stdout}{explained.stdout}")
        assert picked.returncode == 0, picked.stderr
        assert picked.stdout.strip() == f"{fleet}@{digests['h200']}"
        host = runs[name]["json"]["host"]
        assert host["gpu"] == "H200" and host["compute_capability"] == "9.0", host
        assert host["driver"] == driver and "H200" in host["seen"], host
        assert explained.stdout.splitlines()[0].startswith("host: H200 (cc 9.0)")
        reasons = {c["tag"]: c for c in runs[name]["json"]["candidates"]}
        assert not reasons["a100-only"]["fits"] and not reasons["newer-driver"]["fits"], reasons
    out = os.environ.get("IMGFAB_GPU_PROOF_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "select.json").write_text(json.dumps(
            {"fleet": fleet, "digests": digests, "labels": labels, "runs": runs}, indent=1) + "\n")
