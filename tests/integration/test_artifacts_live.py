"""The rendered run artifacts used for real on the local stack (light payload).

- ``docker-compose up`` of the rendered compose.yaml serves and passes the smoke client's
  health, model-list and completion checks, with the read-only root and tmpfs it declares.
  This engine has no GPU and refuses ``memlock=-1``: the file that comes up is the rendered
  one as ``docker-compose config`` resolves it, less the GPU reservation, with memlock at this
  engine's hard limit (compose 1.29 merges an override's ``devices`` list into the base's
  instead of replacing it, so an override file cannot drop the reservation).
- ``docker buildx bake`` (Debian 13's docker-buildx, docker driver on this engine) builds the
  whole example fleet from ``imgfab bake`` output.

Both use their own repositories (``imgfab-test/...``): no example recipe's tag moves.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from fake_payload import INDEX_BUILD_ENV, INDEX_TIMEOUT_S  # noqa: E402

if not os.environ.get("DOCKER_HOST"):
    if os.environ.get("CI") == "true":
        pytest.fail("DOCKER_HOST is unset under CI=true: the integration stack is missing",
                    pytrace=False)
    pytest.skip("DOCKER_HOST unset: source .stack/env to run the integration tests",
                allow_module_level=True)

DOCKER = os.environ.get("IMGFAB_DOCKER_CLI", "/usr/bin/docker")
MIRROR = os.environ.get("IMGFAB_MIRROR", "127.0.0.1:5000/mirror")
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=check)


def _copy_recipe(recipe: Path, directory: Path, repository: str) -> Path:
    data = yaml.safe_load(recipe.read_text())
    data["image"]["repository"] = repository
    copy = directory / recipe.name
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


@pytest.fixture(scope="module")
def bridge_index(tmp_path_factory):
    """The same index on the engine's bridge gateway: bake's build steps run on the default
    network, where the build host's loopback is not the host's."""
    from fake_payload import fleet_pins, real_wheels, serve_index

    gateway = _docker("network", "inspect", "bridge", "--format",
                      "{{(index .IPAM.Config 0).Gateway}}").stdout.strip()
    with serve_index(fleet_pins(RECIPES), real_wheels(*RECIPES), host=gateway) as url:
        yield url, gateway


def _build(recipe: Path, out: Path, index_url: str, lock: Path) -> dict:
    env = dict(os.environ, **INDEX_BUILD_ENV)
    result = subprocess.run(
        [sys.executable, "-m", "imgfab.cli", "build", str(recipe), "--json", "--pip-index-url",
         index_url, "--lock", str(lock), "--network", "host", "--mirror", MIRROR, "--output", str(out)],
        capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)["images"][0]


def _weights(directory: Path, name: str) -> Path:
    weights = directory / name
    weights.mkdir(parents=True)
    (weights / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}\n')
    (weights / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    weights.chmod(0o755)
    return weights


@pytest.mark.parametrize("recipe_name", ["qwen2-7b-h100", "mistral-7b-a100-trtllm"])
def test_compose_up_serves_and_smokes(recipe_name, tmp_path):
    from fake_payload import locked_index
    from imgfab.recipe import load_recipe
    from imgfab.ops.smoke import free_port, run_smoke

    recipe_path = _copy_recipe(REPO / "recipes" / f"{recipe_name}.yaml", tmp_path,
                               f"imgfab-test/compose-{recipe_name}")
    recipe = load_recipe(recipe_path)
    with locked_index(recipe_path, tmp_path) as (index, lock):
        built = _build(recipe_path, tmp_path / "ctx", index, lock)
    assert built["verify"]["passed"], built["verify"]
    # The weights directory is named like the mount, as the server sees it.
    weights = _weights(tmp_path / "host", recipe.model.mount_path.rsplit("/", 1)[1])
    port = free_port()
    key = tmp_path / "api-key"  # read by the image's user through the secret's bind mount
    key.write_text(f"k-{uuid.uuid4().hex}")
    key.chmod(0o644)
    vllm = recipe.backend.name == "vllm"
    env = dict(os.environ, WEIGHTS_DIR=str(weights), HOST_PORT=str(port), API_KEY_FILE=str(key))
    compose = ["docker-compose", "--project-name", f"imgfab-test-{uuid.uuid4().hex[:8]}"]
    resolved = subprocess.run(compose + ["-f", str(tmp_path / "ctx" / "compose.yaml"), "config"],
                              env=env, capture_output=True, text=True, check=True).stdout
    config = yaml.safe_load(resolved)
    service = config["services"][recipe.name]
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    del service["deploy"]  # no GPU on this engine
    hard = subprocess.run(["sh", "-c", "ulimit -Hl"], capture_output=True, text=True).stdout.strip()
    service["ulimits"]["memlock"] = -1 if hard == "unlimited" else int(hard) * 1024
    local = tmp_path / "ctx" / "compose.local.yaml"
    local.write_text(yaml.safe_dump(config, sort_keys=False))
    up = subprocess.run(compose + ["-f", str(local), "up", "--detach", "--no-build"], env=env,
                        capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        report = run_smoke(f"http://127.0.0.1:{port}", health_timeout_s=90, poll_interval_s=0.5,
                           model=recipe.serve.served_model_name,
                           api_key=key.read_text() if vllm else None)
        logs = subprocess.run(compose + ["-f", str(local), "logs", "--no-color"], env=env,
                              capture_output=True, text=True).stdout
        assert report.passed, (report.failures, logs[-3000:])
        assert report.model_ids == [recipe.serve.served_model_name]
        (container,) = subprocess.run(compose + ["-f", str(local), "ps", "-q"], env=env,
                                      capture_output=True, text=True, check=True).stdout.split()
        host_config = json.loads(_docker("inspect", container).stdout)[0]["HostConfig"]
        assert host_config["ReadonlyRootfs"] is True
        assert set(host_config["Tmpfs"]) == {"/tmp", "/home/imgfab"}
        from imgfab.render.context import size_bytes

        assert host_config["ShmSize"] == size_bytes(recipe.image.shm_size)
        writable = _docker("exec", container, "sh", "-c",
                           "touch /home/imgfab/x /tmp/x && ! touch /opt/x 2>/dev/null && echo ok",
                           check=False)
        assert writable.stdout.strip() == "ok", writable.stderr
        # Serving loads the code it compiles (Triton, FlashInfer, torch Inductor) from /tmp, the
        # home and the JIT cache: none of them may be noexec (Docker's tmpfs default).
        from imgfab.render.shapes import noexec_code_paths

        mounts = _docker("exec", container, "cat", "/proc/mounts").stdout
        assert noexec_code_paths(mounts) == [], mounts
        ran = _docker("exec", container, "sh", "-c",
                      "for d in /tmp /home/imgfab /home/imgfab/.cache; do cp /bin/true $d/run-me && $d/run-me || exit 1; done; echo ran",
                      check=False)
        assert ran.stdout.strip() == "ran", ran.stderr
    finally:
        subprocess.run(compose + ["-f", str(local), "down", "--volumes", "--timeout", "30"],
                       env=env, capture_output=True, text=True)


@pytest.mark.engine_crash_risk
def test_buildx_bake_builds_the_example_fleet(bridge_index, tmp_path):
    from imgfab.payload.lock import lock_recipe

    buildx = os.environ.get("IMGFAB_BUILDX", str(REPO / ".stack" / "buildx" / "docker-buildx"))
    assert Path(buildx).exists(), "docker-buildx missing: scripts/local-stack.sh up installs it"
    index, gateway = bridge_index
    # Every recipe locked against the fake index (the TensorRT-LLM ones cannot be locked
    # against the real indexes from here): bake takes them from --lock-dir.
    locks = tmp_path / "locks"
    locks.mkdir()
    for recipe in RECIPES:
        lock_recipe(str(recipe), index_url=index, output=locks / f"{recipe.stem}.lock", upgrade=True)
    prefix = f"imgfab-test/bake-{uuid.uuid4().hex[:6]}"
    result = subprocess.run(
        [sys.executable, "-m", "imgfab.cli", "bake", *map(str, RECIPES), "-o",
         "out/docker-bake.json", "--mirror", MIRROR, "--registry", prefix, "--lock-dir", str(locks)],
        capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    definition = json.loads((tmp_path / "out" / "docker-bake.json").read_text())
    assert len(definition["target"]) == len(RECIPES)
    pip_conf = f"[global]\nindex-url = {index}\ntrusted-host = {gateway}\ntimeout = {INDEX_TIMEOUT_S}\nretries = 0\n"
    env = dict(os.environ, IMGFAB_PIP_CONF=pip_conf)
    baked = subprocess.run([buildx, "bake", "-f", "out/docker-bake.json", "--progress", "plain"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=1800)
    assert baked.returncode == 0, baked.stderr[-4000:]
    tags = []
    try:
        for name, target in definition["target"].items():
            (tag,) = target["tags"]
            tags.append(tag)
            labels = json.loads(_docker("image", "inspect", tag).stdout)[0]["Config"]["Labels"]
            rendered = json.loads((tmp_path / target["context"] / "image.json").read_text())
            assert {k: labels.get(k) for k in rendered} == rendered, name
            if labels["org.imgfab.backend.path"] == "engine":  # rendered for --engine-at-start
                assert labels["org.imgfab.engine.strategy"] == "at-start"
        # The fleet shares its base and payload layers where the stacks agree.
        assert len(tags) == len(RECIPES)
    finally:
        for tag in tags:
            with contextlib.suppress(subprocess.CalledProcessError):
                _docker("image", "rm", tag)


def test_the_builder_compiles_the_kernels_and_the_runtime_carries_no_cuda_compiler(tmp_path):
    """vLLM 0.26.0 (qwen2-7b-h200) samples with FlashInfer: the builder's kernels stage compiles
    its sampling module for the H200's 9.0 alone with the payload's own nvcc (the fake
    FlashInfer records what it ran), the runtime gets the library in FlashInfer's AOT layout as
    a layer of its own and FLASHINFER_DISABLE_JIT=1, and carries no nvcc or NVVM (the toolkit
    wheels' layer is left out), no CUDA_HOME view and no g++ (issue 33). Nor gcc, cc1 or
    Python.h: the same stage regenerates, from the real Triton 3.6.0 the fake index serves
    (fake_payload.triton_wheel), the 18 launcher stubs compat/triton_launchers.yaml measured on
    the GPU, each under the key recorded there, and Triton's driver helper, into the seed the
    entrypoint copies into TRITON_CACHE_DIR."""
    from fake_payload import locked_index

    recipe_path = _copy_recipe(REPO / "recipes" / "qwen2-7b-h200.yaml", tmp_path, "imgfab-test/kernels")
    with locked_index(recipe_path, tmp_path) as (index, lock):
        built = _build(recipe_path, tmp_path / "ctx", index, lock)
    assert built["verify"]["passed"], built["verify"]
    image = built["tags"][0]
    probe = _docker("run", "--rm", "--network", "none", "--entrypoint", "/bin/bash", image, "-c",
                    'echo "JIT=$FLASHINFER_DISABLE_JIT CUDA_HOME=${CUDA_HOME:-none}"; '
                    'cat /opt/venv/lib/python3*/site-packages/flashinfer/data/aot/sampling/sampling.so; echo; '
                    'find / -xdev \\( -type f -o -type l \\) \\( -name nvcc -o -name g++ -o -name "cc1plus" -o -name cicc -o -name gcc '
                    '-o -name cc1 -o -name cc -o -name "x86_64-linux-gnu-gcc*" -o -name Python.h \\) -print; '
                    'ls /opt/imgfab', check=False)
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.split("\n")
    assert lines[0] == "JIT=1 CUDA_HOME=none"
    assert lines[1] == "fake sampling module for 9.0"
    assert "imgfab fake 13.0.88" in lines[2]  # the locked nvidia-cuda-nvcc ran in the builder
    rest = [line for line in lines[3:] if line]
    assert not [line for line in rest if line.startswith("/")], rest  # no compiler, no CUDA header
    assert "cuda" not in rest
    labels = json.loads(_docker("image", "inspect", image).stdout)[0]["Config"]["Labels"]
    assert labels["org.imgfab.jit"] == "" and labels["org.imgfab.kernels.arch"] == "9.0"
    assert labels["org.imgfab.kernels"] == "flashinfer-sampler (FlashInfer's top-k/top-p sampling kernels)"
    assert labels["org.imgfab.toolchain"] == "" and labels["org.imgfab.kernels.triton"] == "18 launchers, Triton 3.6.0"
    seed = _docker("run", "--rm", "--network", "none", "--entrypoint", "/bin/bash", image, "-c",
                   "cd /opt/imgfab/triton-seed && for d in *; do echo $d $(ls $d); done", check=False)
    assert seed.returncode == 0, seed.stderr
    built_keys = dict(line.split(" ", 1) for line in seed.stdout.splitlines())
    proof = json.loads((REPO / "tests" / "fixtures" / "gpu_proof" / "h100-vllm-startup-2026-12-05.json").read_text())
    # Triton's cache names a directory by its key in base32 (triton/runtime/cache.py _base32)
    recorded = {base64.b32encode(bytes.fromhex(s["key"])).decode().rstrip("=")
                for s in proof["launchers_recorded"]["launchers"]}
    assert len(recorded) == 18 and recorded < set(built_keys), (sorted(recorded - set(built_keys)), built_keys)
    assert {built_keys[k] for k in recorded} == {"__triton_launcher.cpython-311-x86_64-linux-gnu.so"}
    # Triton's CUDA driver helper, under the key its driver.c gives: the same directory the
    # H100 run's kernels stage wrote (tests/fixtures/gpu_proof/h100-vllm-startup-2026-12-06.json)
    assert built_keys["XU5DT2AO5BD5AEHEYGLPP5LRDFHHCUEJT4LGDVLB4STXUGVGHFPA"] == "cuda_utils.cpython-311-x86_64-linux-gnu.so"
    # each of the 19 twice: under the keys of a runtime with `file` (the GPU run's host root
    # filesystem) and without it (Triton's platform_key ends with platform.architecture()'s linkage)
    assert len(built_keys) == 38 and sorted(set(built_keys.values())) == [
        "__triton_launcher.cpython-311-x86_64-linux-gnu.so", "cuda_utils.cpython-311-x86_64-linux-gnu.so"]
    history = _docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
    assert "FLASHINFER_CUDA_ARCH_LIST" not in history  # the compile ran in the builder, not a runtime layer
