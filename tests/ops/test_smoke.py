"""The smoke client against a real HTTP server process (tests/fixtures/openai_server.py),
``smoke_image`` against a stand-in engine, and the engine's translation to the docker SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from imgfab.docker import engine
from imgfab.ops import smoke
from imgfab.errors import EngineError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SERVER = FIXTURES / "openai_server.py"
sys.path.insert(0, str(FIXTURES))
from fake_nvml import FakeNvml  # noqa: E402


class NoGpu(smoke.GpuMemorySampler):
    """The CI host has no GPU; make that explicit rather than depend on pynvml being absent."""

    def __enter__(self) -> NoGpu:
        self.error = "GPU memory not recorded: test host has no GPU"
        return self


def start_server(log: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, str(SERVER), *args], stdout=subprocess.PIPE,
                            stderr=log.open("w"), text=True,
                            env=None if env is None else dict(os.environ, **env))
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"test server did not start: {line!r} {log.read_text()[-500:]}")
    return proc, int(line.split()[1])


def stop_server(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def openai_server(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    proc, port = start_server(tmp_path / "server.log", "--port", "0", *args, env=env)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(proc)


def smoke_fast(url: str, **kwargs) -> smoke.SmokeReport:
    kwargs.setdefault("health_timeout_s", 10)
    kwargs.setdefault("poll_interval_s", 0.05)
    kwargs.setdefault("gpu_sampler", NoGpu())
    return smoke.run_smoke(url, **kwargs)


def test_pass(tmp_path):
    with openai_server(tmp_path) as url:
        report = smoke_fast(url, completions=True, max_tokens=16)
    assert report.passed, report.failures
    assert report.model_ids == ["imgfab-test-model"]
    assert report.model == "imgfab-test-model"
    assert len(report.answers) == 5  # 3 streamed chats, 1 streamed completion, 1 plain chat
    assert all(answer.startswith("echo: ") for answer in report.answers)
    assert report.completion_tokens == 4 * 16
    assert report.ttft_ms is not None and report.ttft_ms > 0
    assert report.tokens_per_s is not None and report.tokens_per_s > 0
    assert report.notes == ["GPU memory not recorded: test host has no GPU"]
    assert json.loads(report.to_json())["passed"] is True


@pytest.mark.parametrize("framing", [[], ["--close-delimited"]], ids=["chunked", "close"])
def test_ttft_is_the_first_token_not_the_whole_answer(tmp_path, framing):
    # 4 tokens, 2 s apart: first token after ~2 s, decode rate ~0.5 tokens/s. A client that
    # waits for a 512-byte read buffer (requests' iter_lines on a close-delimited body) sees
    # the first token only with a later event, after ≥ 4 s. The server's own sleeps bound
    # the figures from one side; the other side leaves a busy CI machine 2 s of slack.
    with openai_server(tmp_path, "--token-delay", "2.0", *framing) as url:
        report = smoke_fast(url, prompts=["one two three"], max_tokens=4)
    assert report.passed, report.failures
    assert 1990 <= report.ttft_ms < 3990
    assert 0 < report.tokens_per_s <= 0.55


def test_empty_answer_fails(tmp_path):
    with openai_server(tmp_path, "--mode", "empty") as url:
        report = smoke_fast(url, prompts=["hello"])
    assert not report.passed
    assert report.failures == ["chat 1: the streamed answer is empty (0 token(s) reported)",
                               "chat (not streamed): the answer is empty"]
    assert report.ttft_ms is None


def test_health_never_comes_fails_within_the_deadline(tmp_path):
    with openai_server(tmp_path, "--mode", "no-health") as url:
        start = time.monotonic()
        report = smoke_fast(url, health_timeout_s=1.5, poll_interval_s=0.2)
        elapsed = time.monotonic() - start
    assert not report.passed
    assert report.failures == [f"health: {url}/health did not answer 200 within 1.5s "
                               f"(last: HTTP 503)"]
    assert 1.5 <= elapsed < 30  # waits the deadline out; the upper bound only catches a hang
    assert report.model_ids == []


def test_nothing_listening_fails_within_the_deadline():
    port = smoke.free_port()
    start = time.monotonic()
    report = smoke_fast(f"http://127.0.0.1:{port}", health_timeout_s=1.0, poll_interval_s=0.2)
    assert time.monotonic() - start < 30  # only catches a hang
    assert report.failures == [f"health: http://127.0.0.1:{port}/health did not answer 200 "
                               f"within 1s (last: ConnectionError)"]


def test_dead_server_stops_the_wait_at_once(tmp_path):
    with openai_server(tmp_path, "--mode", "no-health") as url:
        start = time.monotonic()
        report = smoke_fast(url, health_timeout_s=600, alive=lambda: False)
    assert time.monotonic() - start < 60  # not the 600 s deadline
    assert report.failures[0].startswith("health: the server exited before")


def test_unserved_model_fails(tmp_path):
    with openai_server(tmp_path) as url:
        report = smoke_fast(url, model="qwen2-7b")
    assert report.failures == ["models: qwen2-7b is not served (served: imgfab-test-model)"]


def test_gpu_memory_peaks_come_from_nvml():
    nvml = FakeNvml(gpus=[("GPU A", (9, 0)), ("GPU B", (9, 0))])
    with smoke.GpuMemorySampler(interval_s=0.01, nvml=nvml) as sampler:
        time.sleep(0.1)
    assert len(sampler.peaks) == 2 and all(p >= 2 * 2**30 for p in sampler.peaks)
    assert sampler.error is None and nvml.calls[-1] == "shutdown"


def test_gpu_memory_without_nvml_is_a_note_not_a_failure():
    nvml = FakeNvml(init_error="NVML Shared Library Not Found")
    with smoke.GpuMemorySampler(nvml=nvml) as sampler:
        pass
    assert sampler.peaks == []
    assert sampler.error == ("GPU memory not recorded: NVML unavailable here "
                             "(NVML Shared Library Not Found)")


class ServerEngine:
    """Stands in for imgfab.docker.engine: a "container" is the test server process."""

    def __init__(self, tmp_path: Path, *server_args: str):
        self.tmp_path = tmp_path
        self.server_args = server_args
        self.removed: list[str] = []
        self.execs: list[list[str]] = []
        self.run_kwargs: dict = {}

    def run_container(self, image: str, **kwargs):
        self.run_kwargs = dict(kwargs, image=image)
        (_, (host, port)), = kwargs["ports"].items()
        proc, _ = start_server(self.tmp_path / "container.log", "--host", host, "--port",
                               str(port), *self.server_args)
        return proc

    def container_running(self, proc) -> bool:
        return proc.poll() is None

    def container_logs(self, proc, *, tail: int) -> str:
        return "\n".join((self.tmp_path / "container.log").read_text().splitlines()[-tail:])

    def exec_in(self, proc, command, *, env=None):
        self.execs.append(command)
        return 3, json.dumps({"exit_code": 3, "meaning": "host is wrong"})

    def remove_container(self, proc) -> None:
        stop_server(proc)
        self.removed.append(self.run_kwargs["name"])


SETTINGS = smoke.RunSettings(name="imgfab-smoke-test", health_timeout_s=10,
                             poll_interval_s=0.05, mounts=(("/srv/m", "/models/m", True),))


def test_smoke_image_passes_and_removes_the_container(tmp_path, monkeypatch):
    monkeypatch.setattr(smoke, "GpuMemorySampler", NoGpu)
    fake = ServerEngine(tmp_path)
    report = smoke.smoke_image("registry.local/llm:1", SETTINGS, fake)
    assert report.passed, report.failures
    assert fake.removed == ["imgfab-smoke-test"]
    assert fake.execs == [] and report.probe is None
    assert fake.run_kwargs["gpus"] == "all" and fake.run_kwargs["shm_size"] == "16g"
    assert fake.run_kwargs["mounts"] == [("/srv/m", "/models/m", True)]


def test_smoke_image_failure_collects_logs_and_probe(tmp_path, monkeypatch):
    monkeypatch.setattr(smoke, "GpuMemorySampler", NoGpu)
    fake = ServerEngine(tmp_path, "--mode", "empty")
    report = smoke.smoke_image("registry.local/llm:1", SETTINGS, fake)
    assert not report.passed
    assert "POST /v1/chat/completions" in report.log_tail
    assert fake.execs == [smoke.PROBE_COMMAND]
    assert report.probe == {"exit_code": 3, "meaning": "host is wrong"}
    assert fake.removed == ["imgfab-smoke-test"]


def test_smoke_image_removes_the_container_when_health_never_comes(tmp_path):
    fake = ServerEngine(tmp_path, "--mode", "no-health")
    settings = smoke.RunSettings(name="imgfab-smoke-test", health_timeout_s=0.5,
                                 poll_interval_s=0.1)
    report = smoke.smoke_image("registry.local/llm:1", settings, fake)
    assert not report.passed and report.failures[0].startswith("health: ")
    assert fake.removed == ["imgfab-smoke-test"]


class FakeContainers:
    def __init__(self, error: Exception | None = None):
        self.error = error
        self.kwargs: dict = {}

    def run(self, image, **kwargs):
        self.kwargs = dict(kwargs, image=image)
        if self.error:
            raise self.error
        return "container"


class FakeClient:
    def __init__(self, containers: FakeContainers):
        self.containers = containers


def test_engine_run_container_translates_to_the_sdk(monkeypatch):
    docker = pytest.importorskip("docker")
    containers = FakeContainers()
    monkeypatch.setattr(docker, "from_env", lambda: FakeClient(containers))
    engine.run_container("img:1", gpus=2, shm_size="16g",
                         ulimits={"memlock": -1, "stack": (67108864, 67108864)},
                         mounts=[("/srv/m", "/models/m", True)],
                         ports={8000: ("127.0.0.1", 18000)}, env={"A": "1"}, name="n")
    kwargs = containers.kwargs
    assert kwargs["detach"] is True and kwargs["name"] == "n"
    (request,) = kwargs["device_requests"]
    assert request["Count"] == 2 and request["Capabilities"] == [["gpu"]]
    assert [(u.name, u.soft, u.hard) for u in kwargs["ulimits"]] == [
        ("memlock", -1, -1), ("stack", 67108864, 67108864)]
    (mount,) = kwargs["mounts"]
    assert (mount["Source"], mount["Target"], mount["ReadOnly"]) == ("/srv/m", "/models/m", True)
    assert kwargs["ports"] == {"8000/tcp": ("127.0.0.1", 18000)}
    assert kwargs["environment"] == {"A": "1"} and kwargs["shm_size"] == "16g"


def test_engine_missing_image_is_one_line(monkeypatch):
    docker = pytest.importorskip("docker")
    containers = FakeContainers(docker.errors.ImageNotFound("No such image: img:1"))
    monkeypatch.setattr(docker, "from_env", lambda: FakeClient(containers))
    with pytest.raises(EngineError) as exc:
        engine.run_container("img:1", gpus=None)
    assert exc.value.one_line() == ("engine: image img:1 is not on the engine; fix: build it "
                                    "(imgfab build) or docker pull it first")
    assert containers.kwargs["device_requests"] is None


def test_engine_unreachable_is_one_line(monkeypatch):
    docker = pytest.importorskip("docker")

    def refuse():
        raise docker.errors.DockerException("Error while fetching server API version")
    monkeypatch.setattr(docker, "from_env", refuse)
    with pytest.raises(EngineError) as exc:
        engine.run_container("img:1")
    assert exc.value.one_line() == (
        "engine: cannot reach the Docker engine: Error while fetching server API version; "
        "fix: start Docker, or point DOCKER_HOST at a running engine")


# --- run shapes ---------------------------------------------------------------------------------

class ShapeEngine(ServerEngine):
    """ServerEngine that also answers `cat /proc/mounts` with a chosen mount table and records
    which cache volumes were removed."""

    def __init__(self, tmp_path: Path, mounts: str, *server_args: str):
        super().__init__(tmp_path, *server_args)
        self.mounts = mounts
        self.volumes_removed: list[str] = []
        self.runs: list[dict] = []

    def run_container(self, image: str, **kwargs):
        self.runs.append(dict(kwargs))
        return super().run_container(image, **kwargs)

    def exec_in(self, proc, command, *, env=None):
        if command == ["cat", "/proc/mounts"]:
            return 0, self.mounts
        return super().exec_in(proc, command, env=env)

    def remove_volume(self, name: str) -> None:
        self.volumes_removed.append(name)


GOOD_MOUNTS = ("overlay / overlay ro 0 0\ntmpfs /tmp tmpfs rw,nosuid,nodev 0 0\n"
               "tmpfs /home/imgfab tmpfs rw,nosuid,nodev,uid=10001 0 0\n")


def test_every_shape_is_started_with_its_own_options_and_reported(tmp_path, monkeypatch):
    from imgfab.ops.smoke_shapes import smoke_shapes

    monkeypatch.setattr(smoke, "GpuMemorySampler", NoGpu)
    fake = ShapeEngine(tmp_path, GOOD_MOUNTS)
    settings = smoke.RunSettings(health_timeout_s=10, poll_interval_s=0.05, completions=True)
    report = smoke_shapes("registry.local/llm:1", settings, ("runsh", "compose", "k8s"), uid=10001,
                          engine=fake)
    assert report.passed, [r.failures for r in report.shapes]
    assert [r.shape for r in report.shapes] == ["runsh", "compose", "k8s"]
    runsh, compose, k8s = fake.runs
    volume = runsh["volumes"][0][0]
    assert runsh["read_only"] is False and runsh["volumes"] == [(volume, "/home/imgfab/.cache")]
    assert compose["read_only"] is True and compose["volumes"] == runsh["volumes"]
    assert all("exec" in o.split(",") for o in compose["tmpfs"].values())
    assert k8s["read_only"] is True and k8s["cap_drop"] == ["ALL"]
    assert k8s["security_opt"] == ["no-new-privileges"] and k8s["user"] == "10001:10001"
    assert k8s["volumes"] == [(None, "/tmp"), (None, "/home/imgfab")] and not k8s["tmpfs"]
    assert fake.volumes_removed == [volume], "a cache volume smoke made is removed"
    assert all(r.log_tail for r in report.shapes), "the log of a passing start is kept too"


def test_a_noexec_code_path_fails_its_shape(tmp_path, monkeypatch):
    """Docker's tmpfs default (noexec) broke Triton in the compose shape: smoke must see it."""
    from imgfab.ops.smoke_shapes import smoke_shapes

    monkeypatch.setattr(smoke, "GpuMemorySampler", NoGpu)
    fake = ShapeEngine(tmp_path, GOOD_MOUNTS.replace("rw,nosuid,nodev 0", "rw,nosuid,nodev,noexec 0"))
    settings = smoke.RunSettings(health_timeout_s=10, poll_interval_s=0.05)
    report = smoke_shapes("registry.local/llm:1", settings, ("compose",), uid=10001,
                          cache_volume="kept", engine=fake)
    (result,) = report.shapes
    assert not report.passed and result.noexec == ["/tmp"]
    assert result.failures[0].startswith("mounts: /tmp mounted noexec in the compose shape")
    assert fake.volumes_removed == [], "a named --cache-volume stays"


def test_engine_run_container_passes_the_shape_options(monkeypatch):
    docker = pytest.importorskip("docker")
    containers = FakeContainers()
    monkeypatch.setattr(docker, "from_env", lambda: FakeClient(containers))
    engine.run_container("img:1", gpus=None, read_only=True, tmpfs={"/tmp": "exec,mode=1777"},
                         volumes=[(None, "/tmp2"), ("cache", "/home/imgfab/.cache")],
                         cap_drop=["ALL"], security_opt=["no-new-privileges"], user="10001:10001",
                         group_add=["10001"], devices=["/dev/nvidia0"], network_mode="host",
                         ports={8000: ("127.0.0.1", 8000)})
    kwargs = containers.kwargs
    assert kwargs["read_only"] is True and kwargs["tmpfs"] == {"/tmp": "exec,mode=1777"}
    assert [(m["Type"], m.get("Source"), m["Target"]) for m in kwargs["mounts"]] == [
        ("volume", None, "/tmp2"), ("volume", "cache", "/home/imgfab/.cache")]
    assert kwargs["cap_drop"] == ["ALL"] and kwargs["security_opt"] == ["no-new-privileges"]
    assert kwargs["devices"] == ["/dev/nvidia0:/dev/nvidia0:rwm"]
    assert kwargs["network_mode"] == "host" and kwargs["ports"] is None


def test_synthetic_model_generator_writes_a_loadable_checkpoint(tmp_path):
    """The generator runs inside the image with its own numpy, safetensors and tokenizers;
    here it runs with the test environment's, and the checkpoint is checked by reading the
    safetensors header (every weight of the architecture, the shapes config.json implies)."""
    pytest.importorskip("numpy")
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    import struct

    from imgfab.ops import synthetic_model

    script = Path(synthetic_model.__file__).read_text()
    for architecture in synthetic_model.ARCHITECTURES:
        out = tmp_path / architecture
        done = subprocess.run([sys.executable, "-", str(out), architecture], input=script,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout)
        config = json.loads((out / "config.json").read_text())
        assert config["architectures"] == [architecture]
        assert config["vocab_size"] == summary["vocab_size"] > 100
        data = (out / "model.safetensors").read_bytes()
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + size])
        header.pop("__metadata__")
        expected = synthetic_model.tensor_shapes(architecture, config["vocab_size"])
        assert {k: tuple(v["shape"]) for k, v in header.items()} == expected
        assert ("model.layers.0.self_attn.q_proj.bias" in header) == (architecture == "Qwen2ForCausalLM")
        tokenizer = json.loads((out / "tokenizer.json").read_text())
        assert {t["content"] for t in tokenizer["added_tokens"]} >= {"<|im_end|>", "<|endoftext|>"}
        assert "<|im_start|>" in json.loads((out / "tokenizer_config.json").read_text())["chat_template"]
        # Random weights emit random tokens: every sequence must still decode to text (a
        # byte-level vocabulary's random byte tokens decoded to nothing on the H200, and the
        # smoke test then saw an empty answer).
        import random

        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(out / "tokenizer.json"))
        rng = random.Random(0)
        for _ in range(200):
            ids = [rng.randrange(backend.get_vocab_size()) for _ in range(32)]
            assert backend.decode(ids, skip_special_tokens=True).strip(), ids
    bad = subprocess.run([sys.executable, "-", str(tmp_path / "x"), "GPT2LMHeadModel"], input=script,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_smoke_cli_needs_weights_or_synthetic_in_one_line():
    result = subprocess.run([sys.executable, "-m", "imgfab.cli", "smoke", "img:1"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "--weights" in result.stderr and "--synthetic-model" in result.stderr
    bad = subprocess.run([sys.executable, "-m", "imgfab.cli", "smoke", "img:1", "--synthetic-model",
                          "--mount", "/a,b:/c"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--mount" in bad.stderr and bad.stderr.count("\n") == 1


# --- the API key (issue 23), on every route (issue 34) -------------------------------------

GATE = "imgfab.in_image.gate.ApiKeyGate"


def gated_server(tmp_path: Path, key: str, gate: str = GATE):
    """The test server as an image of imgfab serves: vLLM's own /v1 check and, in front of every
    route, the in-image gate reading the key file the entrypoint would."""
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    return openai_server(tmp_path, "--api-key-file", str(key_file), "--middleware", gate,
                         env={"IMGFAB_API_KEY_FILE": str(key_file)})


# The route table of the gated test server, by hand: what its /openapi.json lists, sorted by
# path, then the routes a FastAPI server serves unlisted; each refused but GET /health.
GATED_TABLE = [
    {"method": "POST", "path": "/detokenize", "status": 401, "verdict": "refused"},
    {"method": "GET", "path": "/health", "status": 200, "verdict": "open"},
    {"method": "POST", "path": "/invocations", "status": 401, "verdict": "refused"},
    {"method": "POST", "path": "/tokenize", "status": 401, "verdict": "refused"},
    {"method": "POST", "path": "/v1/chat/completions", "status": 401, "verdict": "refused"},
    {"method": "POST", "path": "/v1/completions", "status": 401, "verdict": "refused"},
    {"method": "GET", "path": "/v1/models", "status": 401, "verdict": "refused"},
    {"method": "GET", "path": "/v1/responses/{response_id}", "status": 401, "verdict": "refused"},
    {"method": "GET", "path": "/version", "status": 401, "verdict": "refused"},
    {"method": "GET", "path": "/metrics", "status": 401, "verdict": "refused"},
    {"method": "GET", "path": "/openapi.json", "status": 401, "verdict": "refused"},
    {"method": "GET", "path": "/docs", "status": 401, "verdict": "refused"},
    {"method": "GET", "path": "/redoc", "status": 401, "verdict": "refused"},
]


def test_the_client_sends_the_key_and_every_listed_route_refuses_without_it(tmp_path):
    with gated_server(tmp_path, "k-123") as url:
        report = smoke_fast(url, api_key="k-123", completions=True)
        assert report.passed, report.failures
        assert report.routes == GATED_TABLE
        assert json.loads(report.to_json())["routes"] == GATED_TABLE
        without = smoke_fast(url)
        assert not without.passed and "401" in without.failures[0]


def test_a_server_whose_key_guards_v1_only_fails_listing_each_open_route(tmp_path):
    """vLLM's own --api-key: /v1 refuses, /invocations generates for anyone (issue 34). The
    smoke of main e4cd16e asked /v1/models alone and passed this server."""
    with openai_server(tmp_path, "--api-key", "k-123") as url:
        report = smoke_fast(url, api_key="k-123")
    assert not report.passed
    only = "without the key; only GET /health may"
    assert report.failures == [
        f"routes: POST /detokenize answered HTTP 400 {only}",
        f"routes: POST /invocations answered HTTP 400 {only}",
        f"routes: POST /tokenize answered HTTP 400 {only}",
        f"routes: GET /version answered HTTP 200 {only}",
        f"routes: GET /metrics answered HTTP 200 {only}",
        f"routes: GET /openapi.json answered HTTP 200 {only}"]
    assert {r["path"]: r["verdict"] for r in report.routes}["/docs"] == "absent"
    assert report.answers == [], "a server that answers without the key is not asked further"


def test_a_server_that_answers_without_the_key_fails(tmp_path):
    with openai_server(tmp_path) as url:
        report = smoke_fast(url, api_key="k-123")
    assert not report.passed
    assert "routes: GET /v1/models answered HTTP 200 without the key; only GET /health may" \
        in report.failures
    # a listed route whose handler ran (no such response) is not a refusal
    assert ("routes: GET /v1/responses/{response_id} answered HTTP 404 without the key; only "
            "GET /health may") in report.failures


def test_the_metrics_opt_in_opens_get_metrics_and_nothing_else(tmp_path):
    metrics = ("GET", "/metrics")
    with gated_server(tmp_path, "k-123", "imgfab.in_image.gate.ApiKeyGateOpenMetrics") as url:
        opted = smoke_fast(url, api_key="k-123", open_routes=frozenset({("GET", "/health"), metrics}))
        unannounced = smoke_fast(url, api_key="k-123")
    assert opted.passed, opted.failures
    assert {"method": "GET", "path": "/metrics", "status": 200, "verdict": "open"} in opted.routes
    assert unannounced.failures == [
        "routes: GET /metrics answered HTTP 200 without the key; only GET /health may"]


def test_a_server_without_an_openapi_document_fails(tmp_path, monkeypatch):
    from imgfab.ops import smoke_routes

    monkeypatch.setattr(smoke_routes, "listed_routes", lambda document: (_ for _ in ()).throw(
        ValueError("it has no 'paths' mapping")))
    with gated_server(tmp_path, "k-123") as url:
        report = smoke_fast(url, api_key="k-123")
    assert report.failures == [
        f"routes: GET {url}/openapi.json with the key failed (it has no 'paths' mapping): the "
        f"server's routes cannot be listed, so they cannot be checked without the key"]


def test_the_gate_without_its_key_file_serves_nothing(tmp_path):
    proc = subprocess.run([sys.executable, str(SERVER), "--port", "0", "--middleware", GATE],
                          env=dict(os.environ, IMGFAB_API_KEY_FILE=str(tmp_path / "absent")),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "PORT" not in proc.stdout
    assert "no API key file at" in proc.stderr


class KeyedShapeEngine(ShapeEngine):
    """Starts the server with the key file mounted where the entrypoint reads it, as the image
    does: what smoke mounts there is what the server (vLLM's check and the gate) enforces."""

    def run_container(self, image: str, **kwargs):
        from imgfab.render.shapes import API_KEY_FILE

        files = [(src, ro) for src, dst, ro in kwargs["mounts"] if dst == API_KEY_FILE]
        self.key_mounts = files
        args = ["--api-key-file", files[0][0], "--middleware", GATE] if files else []
        self.runs.append(dict(kwargs))
        (_, (host, port)), = kwargs["ports"].items()
        self.run_kwargs = dict(kwargs, image=image)
        proc, _ = start_server(self.tmp_path / "container.log", "--host", host, "--port",
                               str(port), *args, *self.server_args,
                               env={"IMGFAB_API_KEY_FILE": files[0][0]} if files else None)
        return proc


def test_every_shape_gets_a_fresh_key_file_that_is_removed(tmp_path, monkeypatch):
    from imgfab.ops.smoke_shapes import smoke_shapes

    monkeypatch.setattr(smoke, "GpuMemorySampler", NoGpu)
    fake = KeyedShapeEngine(tmp_path, GOOD_MOUNTS)
    settings = smoke.RunSettings(health_timeout_s=10, poll_interval_s=0.05, completions=True)
    report = smoke_shapes("registry.local/llm:1", settings, ("runsh", "k8s"), uid=10001,
                          engine=fake, api_key=True)
    assert report.passed, [r.failures for r in report.shapes]
    assert [r.routes for r in report.shapes] == [GATED_TABLE, GATED_TABLE]
    ((key_file, read_only),) = fake.key_mounts
    assert read_only and not Path(key_file).exists(), "the key file is removed afterwards"
    assert all(any(m[1] == "/run/secrets/imgfab-api-key" for m in r["mounts"]) for r in fake.runs)
    plain = smoke_shapes("registry.local/llm:1", settings, ("runsh",), uid=10001,
                         engine=KeyedShapeEngine(tmp_path, GOOD_MOUNTS), api_key=False)
    assert plain.passed, [r.failures for r in plain.shapes]
    assert plain.notes == ["routes not checked without a key: registry.local/llm:1 is given no "
                           "API key (trtllm-serve checks none)"]
    assert plain.shapes[0].routes == []


def test_the_image_label_opens_metrics_to_smoke():
    from imgfab.ops.smoke_shapes import open_routes

    assert open_routes({"org.imgfab.serve.metrics_unauthenticated": "true"}) == {
        ("GET", "/health"), ("GET", "/metrics")}
    assert open_routes({"org.imgfab.serve.metrics_unauthenticated": "false"}) == {("GET", "/health")}
    assert open_routes({}) == {("GET", "/health")}


class _AbsentEngine:
    """An engine that does not hold the image; it records the pull and then has no labels."""

    def __init__(self):
        self.pulled = []

    def has_image(self, ref):
        return False

    def pull_image(self, ref, *, auth_config, progress):
        self.pulled.append((ref, auth_config, progress))

    def inspect_image(self, ref):
        return {"Config": {"Labels": {}}}


def test_smoke_pulls_an_image_the_engine_lacks_and_no_pull_refuses(monkeypatch):
    from imgfab.errors import EngineError, RecipeError
    from imgfab.ops import smoke_shapes

    monkeypatch.setenv("IMGFAB_REGISTRY", "127.0.0.1:5999")
    monkeypatch.setenv("IMGFAB_REGISTRY_USER", "ci")
    monkeypatch.setenv("IMGFAB_REGISTRY_PASSWORD", "s3cret")
    from imgfab.progress import Progress

    fake, marker = _AbsentEngine(), Progress("quiet")
    ref = "127.0.0.1:5999/llm/qwen@sha256:" + "3" * 64
    with pytest.raises(RecipeError):  # pulled, then: no org.imgfab labels
        smoke_shapes.smoke_command(ref, weights=Path("/nonexistent"), engine=fake, progress=marker)
    assert fake.pulled == [(ref, {"username": "ci", "password": "s3cret",
                                  "serveraddress": "127.0.0.1:5999"}, marker)]
    with pytest.raises(EngineError) as caught:
        smoke_shapes.smoke_command(ref, weights=Path("/nonexistent"), engine=_AbsentEngine(), pull=False)
    assert "not on the engine" in caught.value.one_line() and "s3cret" not in caught.value.one_line()


def test_the_smoke_command_prints_each_shape_s_route_table(tmp_path, monkeypatch):
    """What `imgfab smoke` prints: each route asked without the key, with its status and
    verdict, under the shape's line (the JSON report carries the same table)."""
    from click.testing import CliRunner

    from imgfab import cli
    from imgfab.ops import smoke_shapes

    shape = smoke.SmokeReport(base_url="http://127.0.0.1:1", passed=False, shape="runsh", routes=[
        {"method": "GET", "path": "/health", "status": 200, "verdict": "open"},
        {"method": "POST", "path": "/invocations", "status": 200, "verdict": "answered"},
        {"method": "GET", "path": "/metrics", "status": None, "verdict": "error"}],
        failures=["routes: POST /invocations answered HTTP 200 without the key; only GET /health may"])
    report = smoke_shapes.ShapesReport(image="img:1", weights="/w", synthetic=False, shapes=[shape])
    monkeypatch.setattr(smoke_shapes, "smoke_command", lambda *a, **k: report)
    weights = tmp_path / "w"
    weights.mkdir()
    result = CliRunner().invoke(cli.cli, ["smoke", "img:1", "--weights", str(weights), "--quiet"])
    assert result.exit_code == 1
    assert result.output.splitlines()[1:6] == [
        "  routes without the key (3):",
        "    200 open     GET /health",
        "    200 answered POST /invocations",
        "    - error    GET /metrics",
        "  routes: POST /invocations answered HTTP 200 without the key; only GET /health may"]
