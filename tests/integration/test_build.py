"""`imgfab build` end to end on the local stack, with a light payload and the real Dockerfile.

Fake pure-Python wheels for exactly the stack's top-level pins, and the real uv wheel the builder
installs with (tests/fixtures/fake_payload.py), are served as a PEP 503/691 index by the local
stack's nginx on 127.0.0.1;
each recipe is locked against that index (`imgfab lock --index-url URL --output X.lock`), and
builds run `imgfab build --pip-index-url URL --lock X.lock --network host --mirror $IMGFAB_MIRROR`.

    source .stack/env && python -m pytest -m integration tests/integration/test_build.py
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from fake_payload import INDEX_BUILD_ENV  # noqa: E402
_OWN = Path(tempfile.mkdtemp(prefix="imgfab-it-recipes-"))


def _own_repository(path: Path) -> Path:
    """A copy of example recipe ``path`` (and its calibration files) whose
    ``image.repository`` is ``imgfab-test/<name>``: the integration tests never tag or push
    into an example recipe's repository (the demo's image stays as the demo pushed it)."""
    text = path.read_text()
    own = re.sub(r"(?m)^(\s*repository:\s*)llm/", r"\1imgfab-test/", text)
    assert own != text, f"{path.name}: no llm/ repository to replace"
    (_OWN / path.name).write_text(own)
    if (path.parent / "calibration").is_dir():
        shutil.copytree(path.parent / "calibration", _OWN / "calibration", dirs_exist_ok=True)
    return _OWN / path.name


VLLM = _own_repository(REPO / "recipes" / "qwen2-7b-h100.yaml")
TRTLLM = _own_repository(REPO / "recipes" / "mistral-7b-a100-trtllm.yaml")
ENGINE = _own_repository(REPO / "recipes" / "llama31-8b-h100-fp8-engine.yaml")

if not os.environ.get("DOCKER_HOST"):
    if os.environ.get("CI") == "true":
        pytest.fail("DOCKER_HOST is unset under CI=true: the integration stack is missing "
                    "(scripts/local-stack.sh up)", pytrace=False)
    pytest.skip("DOCKER_HOST unset: source .stack/env to run the build integration tests",
                allow_module_level=True)

DOCKER = os.environ.get("IMGFAB_DOCKER_CLI", "/usr/bin/docker")
MIRROR = os.environ.get("IMGFAB_MIRROR", "127.0.0.1:5000/mirror")


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=check)


# One fake index per recipe for the whole module: the index URL is part of the build's cache
# key (IMGFAB_PIP_SOURCE), so a rebuild must see the same index to reuse its builder steps.
_INDEXES: dict[str, str] = {}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("build")
    marker = f"IMGFAB-SECRET-MARKER-{secrets.token_hex(16)}"
    ca = root / "ca.pem"
    ca.write_bytes(Path(os.environ.get("IMGFAB_CA_CERT", "/etc/ssl/certs/ca-certificates.crt"))
                   .read_bytes() + f"\n# {marker}\n".encode())
    with contextlib.ExitStack() as stack:
        _INDEXES["stack"] = stack  # type: ignore[assignment]
        yield root, ca, marker
        _INDEXES.clear()


def _index_url(recipe: Path, root: Path) -> str:
    """The fake index serving ``recipe``'s pins (one per pin set for the module)."""
    return _locked(recipe, root)[0]


def _lock_of(recipe: Path, root: Path) -> str:
    """The lock of ``recipe`` resolved against its fake index (hashes of the fake wheels)."""
    return str(_locked(recipe, root)[1])


def _locked(recipe: Path, root: Path) -> tuple[str, Path]:
    from fake_payload import locked_index, recipe_pins

    key = json.dumps(recipe_pins(recipe), sort_keys=True)
    if key not in _INDEXES:
        index_root = root / f"index-{uuid.uuid4().hex[:8]}"
        index_root.mkdir()
        _INDEXES[key] = _INDEXES["stack"].enter_context(locked_index(recipe, index_root))  # type: ignore[attr-defined]
    return _INDEXES[key]  # type: ignore[return-value]


def imgfab_build(recipe: Path, root: Path, ca: Path, *extra: str) -> dict:
    """Run `imgfab build --json` as a subprocess against a fresh fake index; the JSON object."""
    env = dict(os.environ, **INDEX_BUILD_ENV)
    url = _index_url(recipe, root)
    result = subprocess.run(
        [sys.executable, "-m", "imgfab.cli", "build", str(recipe), "--json",
         "--pip-index-url", url, "--lock", _lock_of(recipe, root), "--network", "host", "--mirror", MIRROR,
         "--ca-cert", str(ca), "--output", str(root / f"ctx-{recipe.stem}"), *extra],
        capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    built = json.loads(result.stdout)["images"][0]
    built["log"] = result.stderr
    return built


@pytest.fixture(scope="module")
def vllm_image(work):
    root, ca, _ = work
    return imgfab_build(VLLM, root, ca)



@pytest.fixture(scope="module")
def trtllm_image(work):
    root, ca, _ = work
    return imgfab_build(TRTLLM, root, ca)


@pytest.fixture(scope="module")
def trtllm_engine_image(work):
    """The TensorRT engine path built for compile-at-start (this engine has no GPU)."""
    root, ca, _ = work
    return imgfab_build(ENGINE, root, ca, "--engine-at-start")


def test_engine_path_without_gpu_is_refused_with_the_fix(work):
    root, ca, _ = work
    result = subprocess.run(
        [sys.executable, "-m", "imgfab.cli", "build", str(ENGINE), "--mirror", MIRROR,
         "--output", str(root / "ctx-refused")], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "--engine-at-start" in result.stderr
    assert not (root / "ctx-refused").exists(), "nothing rendered for a refused build"


def test_engine_at_start_image_carries_no_engine(trtllm_engine_image):
    ref = trtllm_engine_image["tags"][0]
    labels = json.loads(_docker("image", "inspect", ref).stdout)[0]["Config"]["Labels"]
    assert labels["org.imgfab.engine.strategy"] == "at-start"
    assert labels["org.imgfab.arch.exact"] == "true" and labels["org.imgfab.archs"] == "9.0"
    listing = _docker("run", "--rm", "--entrypoint", "sh", ref, "-c",
                      "ls /opt/imgfab/engine 2>/dev/null | wc -l").stdout.strip()
    assert listing == "0"
    printed = _docker("run", "--rm", "--entrypoint", "imgfab-compile", ref, "at-start", "--print",
                      check=False)
    assert "trtllm-build" in printed.stdout, printed.stdout + printed.stderr


def test_the_committed_tensorrt_llm_golden_builds(work):
    """tests/golden/mistral-7b-a100-trtllm@fake-index is the context of a lock recorded against
    the fake index (tests/fixtures/fake_index_lock.py): `imgfab build --lock` of that committed
    lock, from a fresh fake index (the fake wheels are byte-identical each time), builds and
    verifies, and the payload it pinned is the golden's."""
    from fake_index_lock import LOCK
    from fake_payload import installer_wheel, recipe_pins, serve_index

    root, ca, _ = work
    out = root / "ctx-golden-trtllm"
    with serve_index(recipe_pins(TRTLLM), (installer_wheel(),)) as url:
        result = subprocess.run(
            [sys.executable, "-m", "imgfab.cli", "build", str(TRTLLM), "--json", "--pip-index-url", url,
             "--lock", str(LOCK), "--network", "host", "--mirror", MIRROR, "--ca-cert", str(ca),
             "--output", str(out)], capture_output=True, text=True, timeout=900,
            env=dict(os.environ, **INDEX_BUILD_ENV))
    assert result.returncode == 0, result.stderr[-3000:]
    built = json.loads(result.stdout)["images"][0]
    assert built["verify"]["passed"], built["verify"]
    golden = REPO / "tests" / "golden" / "mistral-7b-a100-trtllm@fake-index"
    assert (out / "requirements.lock").read_text() == (golden / "requirements.lock").read_text()
    assert (out / "installer.lock").read_text() == (golden / "installer.lock").read_text()
    _docker("image", "rm", *built["tags"], check=False)


@pytest.mark.parametrize("which", ["vllm_image", "trtllm_image", "trtllm_engine_image"])
def test_build_passes_verify(which, request):
    built = request.getfixturevalue(which)
    assert built["verify"]["passed"], built["verify"]
    assert {f["check"] for f in built["verify"]["findings"]} >= {
        "user", "labels", "env", "healthcheck", "weights", "secrets", "tools"}
    assert all(ref.startswith(MIRROR + "/") for ref in built["base_images"].values())
    assert built["image_id"].startswith("sha256:") and built["size_bytes"] > 0


@pytest.mark.parametrize("which", ["vllm_image", "trtllm_image", "trtllm_engine_image"])
def test_look_inside(which, request, work, tmp_path):
    root, _ca, marker = work
    built = request.getfixturevalue(which)
    ref = built["tags"][0]
    config = json.loads(_docker("image", "inspect", ref).stdout)[0]["Config"]
    assert config["User"] and config["User"].split(":")[0] not in ("root", "0")
    assert config["Labels"]["org.imgfab.recipe.name"] == built["recipe"]
    assert any(e.startswith("NVIDIA_REQUIRE_CUDA=") for e in config["Env"])
    assert config["Healthcheck"]["Test"][0] != "NONE"
    history = _docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", ref).stdout
    assert marker not in history and "pip.conf" not in history
    uid = _docker("run", "--rm", "--entrypoint", "id", ref, "-u").stdout.strip()
    assert uid != "0"
    tools = _docker("run", "--rm", "--entrypoint", "sh", ref, "-c",
                    "command -v git cmake make g++ ninja || true").stdout.strip()
    assert tools == "", tools
    # Every layer of `docker save`: no weights under the mount path, no secret marker.
    saved = tmp_path / "image.tar"
    _docker("save", "-o", str(saved), ref)
    mount = config["Labels"]["org.imgfab.model.mount"].strip("/")
    with tarfile.open(saved) as outer:
        for member in outer:
            data = outer.extractfile(member) if member.isfile() else None
            if data is None:
                continue
            if member.name.endswith("layer.tar"):
                with tarfile.open(fileobj=data) as layer:
                    for entry in layer:
                        name = entry.name.removeprefix("./")
                        assert not name.startswith(mount + "/"), f"weights file {name}"
                        if entry.isfile():
                            assert marker.encode() not in layer.extractfile(entry).read(), name
            else:
                assert marker.encode() not in data.read(), member.name


def test_vllm_serves_and_smokes(vllm_image, tmp_path):
    from imgfab.ops.smoke import free_port, run_smoke

    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}\n')
    (weights / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    weights.chmod(0o755)
    port = free_port()
    name = f"imgfab-test-{uuid.uuid4().hex[:8]}"
    mount = "/models/qwen2-7b"
    key = tmp_path / "api-key"  # read by the image's user through the bind mount, as run.sh mounts it
    key.write_text(f"k-{uuid.uuid4().hex}")
    key.chmod(0o644)
    # The probe checks /dev/shm against the recipe's shm_size (run.sh's --shm-size). run.sh's
    # --ulimit memlock=-1 is left out: this sandboxed engine may not raise RLIMIT_MEMLOCK.
    _docker("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", "--shm-size", "16g",
            "--mount", f"type=bind,source={weights},target={mount},readonly",
            "--mount", f"type=bind,source={key},target=/run/secrets/imgfab-api-key,readonly",
            vllm_image["tags"][0])
    try:
        report = run_smoke(f"http://127.0.0.1:{port}", health_timeout_s=90, poll_interval_s=0.5,
                           api_key=key.read_text())
        logs = _docker("logs", name, check=False)
        assert report.passed, (report.failures, logs.stdout[-2000:], logs.stderr[-2000:])
        # The image's gate (the fake vLLM loads --middleware as vLLM does): every route the
        # server lists, and the unlisted ones, refuse without the key but GET /health (issue 34).
        assert [r for r in report.routes if r["verdict"] != "refused"] == [
            {"method": "GET", "path": "/health", "status": 200, "verdict": "open"}], report.routes
        assert {"method": "POST", "path": "/invocations", "status": 401, "verdict": "refused"} in report.routes
        # No GPU here: the probe says it cannot check (exit 5) and serving goes on.
        assert "exit 5" in logs.stderr + logs.stdout
    finally:
        _docker("rm", "-f", name, check=False)


def test_a_plain_docker_run_without_a_key_refuses_to_start(vllm_image):
    """`docker run IMAGE` with no key file mounted serves no one: the entrypoint exits 2 in one
    line naming the fix (issue 34); IMGFAB_ALLOW_UNAUTHENTICATED=1 is the explicit way out."""
    result = _docker("run", "--rm", "--shm-size", "16g", "--env", "IMGFAB_SKIP_PROBE=1",
                     vllm_image["tags"][0], check=False)
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    assert result.stderr.startswith("imgfab: no API key file at /run/secrets/imgfab-api-key"), result.stderr
    assert result.stderr.count("\n") == 1


def test_serving_change_rebuilds_no_builder_step(vllm_image, work, tmp_path):
    root, ca, _ = work
    text = VLLM.read_text().replace("port: 8000", "port: 8011")
    assert text != VLLM.read_text()
    recipe = tmp_path / VLLM.name
    recipe.write_text(text)
    started = time.monotonic()
    rebuilt = imgfab_build(recipe, root, ca)
    elapsed = time.monotonic() - started
    from imgfab.docker.engine import BuildLogParser

    parser = BuildLogParser()
    for line in rebuilt["log"].splitlines():
        parser.feed(line)
    builder = [s for s in parser.steps.values() if s.stage == "builder"]
    assert builder, "no builder steps in the log"
    # FROM is resolved, not run: BuildKit reports it DONE; every step that runs is CACHED.
    uncached = [f"{s.index}/{s.total} {s.instruction}" for s in builder
                if not s.cached and not s.instruction.startswith("FROM")]
    assert not uncached, uncached
    assert rebuilt["image_id"] != vllm_image["image_id"]
    # verify read only the few new serving layers; the rest were known from the first scan.
    layers_note = next(n for n in rebuilt["notes"] if n.startswith("layers: "))
    known, total = (int(x) for x in layers_note.split()[1:4:2])
    assert total - known <= 3, layers_note
    assert elapsed < 600  # only catches a hang: the cached steps above are the verdict


def test_verify_rejects_root_and_git(tmp_path):
    from imgfab.docker import engine
    from imgfab.errors import ValidationFailed
    from imgfab.docker.verify import VerifyPolicy, verify_image

    from imgfab.matrix.compat import load_matrix
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import resolve

    # A base the local stack mirrors: the vLLM example's own runtime base (no fixed tag).
    stand_in = f"{MIRROR}/{resolve(load_recipe(VLLM), load_matrix()).stack.runtime_image}"
    (tmp_path / "Dockerfile").write_text(
        f"FROM {stand_in}\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends git "
        "&& rm -rf /var/lib/apt/lists/*\n")
    ref = f"imgfab-test/verify-negative:{uuid.uuid4().hex[:8]}"
    engine.build(tmp_path, tags=[ref], network="host")
    try:
        policy = VerifyPolicy(mount_path="/models/x", required_labels={"org.imgfab.version": "x"})
        with pytest.raises(ValidationFailed) as failed:
            verify_image(ref, policy)
        message = failed.value.one_line()
        assert "user" in message and "git" in message and "healthcheck" in message
        report = verify_image(ref, policy, raise_on_failure=False)
        assert {f.check for f in report.failures} >= {"user", "labels", "env", "healthcheck",
                                                      "tools"}
    finally:
        engine.remove_image(ref, force=True)


def test_cli_errors_are_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "imgfab.cli", "build", str(VLLM),
                             "--ca-cert", str(tmp_path / "missing.pem")],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--ca-cert" in result.stderr
    assert shutil.which(DOCKER) or Path(DOCKER).exists()


REGISTRY = os.environ.get("IMGFAB_REGISTRY", "127.0.0.1:5000")


def _select(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", "select", *args],
                          capture_output=True, text=True)


def test_build_push_then_select_for_a_host_table(vllm_image, trtllm_image, trtllm_engine_image, work):
    """`imgfab build --push` to the real registry, then `imgfab select` over a fleet repository
    holding images built by `imgfab build` for different CUDA floors, GPU archs and backends."""
    from imgfab.docker import registry

    root, ca, _ = work
    pushed = imgfab_build(VLLM, root, ca, "--push", "--registry", REGISTRY)
    assert pushed["pushed"].startswith(f"{REGISTRY}/imgfab-test/qwen2-7b@sha256:")
    credentials = registry.Credentials.load(REGISTRY)
    assert registry.resolve_digest(pushed["tags"][1], credentials).endswith(pushed["pushed"].split("@")[1])

    fleet = f"{REGISTRY}/imgfab-test/fleet-{uuid.uuid4().hex[:8]}"
    digests = {name: registry.push(built["tags"][0], f"{fleet}:{name}", credentials=credentials)
               for name, built in (("vllm-cu12-sm90-fp8", vllm_image), ("trtllm-pytorch", trtllm_image),
                                   ("trtllm-engine-sm90", trtllm_engine_image))}
    table = [
        # (driver, gpu, extra args, expected tag or None)
        ("535.104.05", "H100", ["--backend", "vllm"], "vllm-cu12-sm90-fp8"),
        ("580.65.06", "A100-80GB", [], "trtllm-pytorch"),
        ("580.65.06", "H100", ["--model", "llama31-8b-h100-fp8-engine"], "trtllm-engine-sm90"),
        ("580.65.06", "L40S", ["--model", "llama31-8b-h100-fp8-engine"], None),  # engine is sm_90 only
        ("470.57.02", "H100", [], None),  # too old a driver for every image
    ]
    for driver, gpu, extra, expected in table:
        result = _select("--registry", fleet, "--driver", driver, "--gpu", gpu, *extra)
        if expected is None:
            assert result.returncode == 1, (driver, gpu, result.stdout, result.stderr)
            assert result.stderr.count("\n") == 1 and "would need" in result.stderr
        else:
            assert result.returncode == 0, (driver, gpu, result.stderr)
            digest = digests[expected].split("@")[1]
            assert result.stdout.strip() == f"{fleet}@{digest}", (driver, gpu, result.stdout)
    explained = _select("--registry", fleet, "--driver", "580.65.06", "--gpu", "L40S", "--explain")
    assert explained.stdout.count("\n") >= 3 and "sm_90" in explained.stdout

    down = _select("--registry", "127.0.0.1:5999/x", "--driver", "580.65.06", "--gpu", "H100")
    assert down.returncode == 1 and down.stderr.count("\n") == 1, down.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "imgfab.cli", "select", "--registry", fleet, "--driver", "580.65.06",
         "--gpu", "H100"], capture_output=True, text=True,
        env=dict(os.environ, IMGFAB_REGISTRY_PASSWORD="wrong-password"))
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "401" in refused.stderr and "wrong-password" not in refused.stderr


def test_pin_digests_pins_both_bases(vllm_image, work):
    root, ca, _ = work
    pinned = imgfab_build(VLLM, root, ca, "--pin-digests")
    for ref in pinned["base_images"].values():
        assert ref.startswith(MIRROR + "/") and "@sha256:" in ref, ref
    # The bases by digest are part of the identity: another tag, the same layers, and the
    # runtime base's digest on the image (org.opencontainers.image.base.digest).
    assert pinned["tags"][0] != vllm_image["tags"][0]
    assert pinned["tags"][0].rsplit("-", 1)[0] == vllm_image["tags"][0].rsplit("-", 1)[0]
    inspect = json.loads(_docker("image", "inspect", pinned["tags"][0], vllm_image["tags"][0]).stdout)
    layers = [inspect[i]["RootFS"]["Layers"] for i in (0, 1)]
    assert len(layers[0]) == len(layers[1])
    # only /opt/imgfab/image.json (the labels, base.digest among them) differs
    assert sum(a != b for a, b in zip(*layers)) == 1
    labels = inspect[0]["Config"]["Labels"]
    runtime_name, runtime_digest = pinned["base_images"]["RUNTIME_IMAGE"].split("@")
    assert labels["org.opencontainers.image.base.digest"] == runtime_digest
    assert labels["org.opencontainers.image.base.name"] == runtime_name
    assert "org.opencontainers.image.base.digest" not in inspect[1]["Config"]["Labels"]


def test_smoke_and_doctor_commands_on_the_built_image(vllm_image, tmp_path):
    """`imgfab smoke` drives the real container (no GPU here: the probe exits 5 and serving
    starts); `imgfab doctor --image` reads the pushed image's labels without pulling layers."""
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    (weights / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")  # a header, no tensors: the probe reads it
    result = subprocess.run(
        [sys.executable, "-m", "imgfab.cli", "smoke", vllm_image["tags"][0], "--weights", str(weights),
         "--gpus", "none", "--no-memlock", "--timeout", "120", "--json"],
        capture_output=True, text=True, timeout=300)
    report = json.loads(result.stdout)
    assert "shapes" in report, (result.stdout[-2000:], result.stderr[-2000:])
    failures = [(s["shape"], s["failures"], s["log_tail"][-800:]) for s in report["shapes"]]
    assert result.returncode == 0 and report["passed"], (failures, result.stderr[-2000:])
    # Every run shape its artifacts use, each reported: run.sh, compose (read-only root, exec
    # tmpfs), k8s (read-only root, emptyDir-like volumes, no capabilities, no-new-privileges).
    assert [s["shape"] for s in report["shapes"]] == ["runsh", "compose", "k8s"]
    for shape in report["shapes"]:
        assert shape["passed"] and shape["noexec"] == [], shape["failures"]
        assert shape["answers"] and all(a.strip() for a in shape["answers"])
        assert shape["ttft_ms"] is not None and shape["tokens_per_s"] is not None
        assert shape["healthy_after_s"] is not None
    assert report["synthetic"] is False

    pushed = [t for t in vllm_image["tags"] if t.startswith(REGISTRY + "/")]
    assert pushed, vllm_image["tags"]
    from imgfab.docker import registry  # the push retries what is transient, as imgfab's does
    registry.push(pushed[0], pushed[0], credentials=registry.Credentials.load(REGISTRY), retag=True)
    doctor = subprocess.run([sys.executable, "-m", "imgfab.cli", "doctor", "--image", pushed[0]],
                            capture_output=True, text=True)
    assert doctor.returncode in (0, 1), doctor.stderr
    assert "no NVIDIA GPU" in doctor.stdout and "[ok] docker" in doctor.stdout
    assert "image" in doctor.stdout and "cannot be checked" in doctor.stdout

    # A GPU host smokes the pushed reference it does not hold yet: pulled first, with progress;
    # --no-pull refuses in one line instead.
    subprocess.run([DOCKER, "rmi", pushed[0]], capture_output=True, check=True)
    smoke_pushed = [sys.executable, "-m", "imgfab.cli", "smoke", pushed[0], "--weights", str(weights),
                    "--gpus", "none", "--no-memlock", "--timeout", "120", "--shape", "runsh"]
    refused = subprocess.run([*smoke_pushed, "--no-pull"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and refused.stdout == "", refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "not on the engine" in refused.stderr
    pulled = subprocess.run(smoke_pushed, capture_output=True, text=True, timeout=300)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr[-2000:]
    assert f"pulling {pushed[0]}" in pulled.stderr and "smoke runsh passed" in pulled.stdout


@pytest.mark.parametrize("healthy", [True, False], ids=["smoke-passes", "smoke-fails"])
def test_failed_smoke_blocks_push(vllm_image, work, tmp_path, healthy):
    from imgfab.docker import registry

    root, ca, _ = work
    repository = f"imgfab-test/smoke-{uuid.uuid4().hex[:8]}"
    recipe = tmp_path / VLLM.name
    recipe.write_text(VLLM.read_text().replace("repository: imgfab-test/qwen2-7b",
                                               f"repository: {repository}"))
    weights = tmp_path / "weights"
    weights.mkdir()
    if healthy:  # without config.json the probe refuses to start: the host is wrong
        (weights / "config.json").write_text("{}")
    (weights / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    env = dict(os.environ, **INDEX_BUILD_ENV)
    result = subprocess.run(
        [sys.executable, "-m", "imgfab.cli", "build", str(recipe), "--json", "--pip-index-url",
         _index_url(VLLM, root), "--lock", _lock_of(VLLM, root), "--network", "host",
         "--mirror", MIRROR, "--ca-cert", str(ca), "--output", str(root / f"ctx-smoke-{healthy}"), "--registry", REGISTRY, "--push",
         "--smoke", "--weights", str(weights), "--smoke-gpus", "none", "--no-memlock"],
        capture_output=True, text=True, env=env, timeout=900)
    tags = registry.list_tags(f"{REGISTRY}/{repository}", registry.Credentials.load(REGISTRY))
    if healthy:
        assert result.returncode == 0, result.stderr[-2000:]
        assert json.loads(result.stdout)["images"][0]["smoke"]["passed"] and tags
    else:
        assert result.returncode == 1, result.stderr[-2000:]
        assert "smoke" in result.stderr.strip().splitlines()[-1]
        assert tags == [], "a failed smoke must block the push"
