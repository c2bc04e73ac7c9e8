"""Multi-node serving on a real two-container Ray cluster (issue 22), on the local engine.

The image: the stand-in base under its nvidia/cuda mirror name, bookworm's python3, the real
``ray`` wheel and its dependencies from PyPI (downloaded on this host, where PyPI is reachable,
into ``$XDG_CACHE_HOME/imgfab/test-wheels``, and copied in: builds cannot reach it), and the
RENDERED entrypoint and ``imgfab/in_image`` modules of a two-node recipe (tp 2 within a node,
pp 2 across the nodes), so the real roles and the real leader's wait (in_image/cluster.py) run.

The GPU edge: ``vllm serve`` is the fake payload's ``vllm`` console script (a test double,
tests/fixtures/fake_payload.py: an OpenAI-compatible echo server taking vLLM's flags), found on
PATH where the real image has vLLM's; no GPU is needed: each node declares its 2 GPUs to Ray
with ``--num-gpus`` as the entrypoint passes it. ``IMGFAB_RAY_ARGS`` keeps Ray small on a
shared 2-core host (one CPU, a 100 MiB object store; the entrypoint turns the head's dashboard off).

Issue 34: every node runs Ray with token authentication, the token a file mounted read-only at
/run/secrets/imgfab-ray-token (the entrypoint sets RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH).
The last two tests go around the entrypoint, as an attacker on the network would: a node
without the token (Ray's auth off, or a wrong token) does not join the leader's cluster, and a
client without it can neither read nor write the leader's GCS; the same calls with the token do
(the control).

    source .stack/env && python -m pytest -m integration tests/integration/test_multinode_ray.py
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))

if not os.environ.get("DOCKER_HOST"):
    if os.environ.get("CI") == "true":
        pytest.fail("DOCKER_HOST is unset under CI=true: the integration stack is missing",
                    pytrace=False)
    pytest.skip("DOCKER_HOST unset: source .stack/env to run the integration tests",
                allow_module_level=True)

DOCKER = os.environ.get("IMGFAB_DOCKER_CLI", "/usr/bin/docker")
MIRROR = os.environ.get("IMGFAB_MIRROR", "127.0.0.1:5000/mirror")
PREFIX = "imgfab-i22-"
# The ray a multi-node lock of the recipe's stack pins (vLLM 0.33.0's era: `imgfab lock` of
# tests/render/test_multinode.py's 405B recipe locks ray==2.60.0), with token authentication
# (>= 2.52.0); cp311: bookworm's python3, which the stand-in base (debootstrap bookworm under the
# nvidia/cuda names) installs.
RAY_VERSION = "2.60.0"
PYTHON = "3.11"
# Small on purpose: 1 CPU each, a 100 MiB object store (Ray's floor is 75 MiB) in a 256 MiB shm.
RAY_ARGS = "--num-cpus=1 --object-store-memory=104857600"
SHM = "256m"
WAIT_S = 150  # the leader's bound in the two-node test: generous, it returns as soon as both joined
SHORT_WAIT_S = 12  # the bound the lone leader runs out of
ROGUE_S = 90  # how long a tokenless node or client gets to join or submit (a tokened one: seconds)


def _recipe() -> dict:
    data = yaml.safe_load((REPO / "recipes" / "qwen2-7b-h100.yaml").read_text())
    data = copy.deepcopy(data)
    data["name"] = "imgfab-i22-qwen2-7b-2node"
    data["target"] |= {"count": 2, "pipeline_parallel": 2, "nodes": 2}
    data["image"]["repository"] = "imgfab-test/qwen2-7b-2node"
    return data


def _docker(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])}: {result.stderr[-2000:]}")
    return result


def _ray_wheels() -> Path:
    """The ray wheel and its dependencies for cp311 manylinux x86_64, from PyPI, cached."""
    cache = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "imgfab"
             / "test-wheels" / f"ray-{RAY_VERSION}-cp{PYTHON.replace('.', '')}")
    if not list(cache.glob(f"ray-{RAY_VERSION}-*.whl")):
        cache.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", f"ray=={RAY_VERSION}", "--only-binary=:all:",
             "--platform", "manylinux2014_x86_64", "--python-version", PYTHON,
             "--implementation", "cp", "--dest", str(cache), "--quiet",
             "--disable-pip-version-check"], capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
    return cache


@pytest.fixture(scope="module")
def cluster_image(tmp_path_factory):
    """(image tag, the recipe's stack, its served model name, its port): built once, removed
    at the end."""
    from fake_payload import make_wheel
    from imgfab.matrix.compat import load_matrix
    from imgfab.recipe import parse_recipe
    from imgfab.render.context import render_context, served_name, write_context
    from imgfab.stack.resolve import resolve

    root = tmp_path_factory.mktemp("ray")
    matrix = load_matrix()
    recipe = parse_recipe(_recipe())
    stack = resolve(recipe, matrix).stack
    assert (stack.tensor_parallel, stack.pipeline_parallel, stack.nodes) == (2, 2, 2)
    files = render_context(recipe, stack, matrix)
    rendered = root / "rendered"
    write_context(files, rendered, force=True)
    base = f"{MIRROR.rstrip('/')}/{stack.runtime_image}"  # as `imgfab build --mirror` pulls it
    context = root / "context"
    context.mkdir()
    shutil.copytree(rendered / "imgfab", context / "imgfab")
    shutil.copy(rendered / "entrypoint.sh", context / "entrypoint.sh")
    wheels = context / "wheels"
    shutil.copytree(_ray_wheels(), wheels)
    make_wheel(wheels, "vllm", stack.backend_version)
    (context / "Dockerfile").write_text(f"""\
FROM {base}
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \\
    && rm -rf /var/lib/apt/lists/*
COPY wheels/ /wheels/
RUN python3 -m venv /opt/venv \\
    && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels \\
       ray=={RAY_VERSION} vllm=={stack.backend_version} \\
    && rm -rf /wheels
COPY imgfab/ /opt/imgfab/imgfab/
COPY --chmod=0755 entrypoint.sh /opt/imgfab/entrypoint.sh
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    PYTHONPATH=/opt/imgfab PYTHONUNBUFFERED=1 HOME=/tmp IMGFAB_SKIP_PROBE=1
USER 1000:1000
ENTRYPOINT ["/opt/imgfab/entrypoint.sh"]
""")
    tag = f"{PREFIX}ray:{uuid.uuid4().hex[:8]}"
    _docker("build", "--network", "host", "--tag", tag, str(context), timeout=900)
    try:
        yield tag, stack, served_name(recipe), recipe.serve.port
    finally:
        _docker("image", "rm", "--force", tag, check=False)


# Ray's cluster token (issue 34): the file every node mounts where the entrypoint looks for it.
TOKEN_TARGET = "/run/secrets/imgfab-ray-token"


@pytest.fixture
def ray_token(tmp_path) -> Path:
    path = tmp_path / "ray-token"
    path.write_text(uuid.uuid4().hex + uuid.uuid4().hex + "\n")
    path.chmod(0o644)  # readable by the image's user (1000), as the bind mount shows it
    return path


def _token(path: Path, target: str = TOKEN_TARGET) -> list[str]:
    return ["--mount", f"type=bind,source={path},target={target},readonly"]


# The API key a leader serves with: without it the entrypoint refuses to start the server
# (fail closed, exit 2) before it starts Ray at all.
KEY_TARGET = "/run/secrets/api-key"


@pytest.fixture
def api_key(tmp_path) -> Path:
    path = tmp_path / "api-key"
    path.write_text(uuid.uuid4().hex)
    path.chmod(0o644)
    return path


def _key(path: Path) -> list[str]:
    return ["--env", f"IMGFAB_API_KEY_FILE={KEY_TARGET}",
            "--mount", f"type=bind,source={path},target={KEY_TARGET},readonly"]


@contextlib.contextmanager
def _network():
    name = f"{PREFIX}net-{uuid.uuid4().hex[:8]}"
    _docker("network", "create", name)
    containers: list[str] = []
    try:
        yield name, containers
    finally:
        for container in containers:
            _docker("rm", "--force", container, check=False)
        _docker("network", "rm", name, check=False)


def _start(image: str, network: str, containers: list[str], role: str, *extra: str) -> str:
    name = f"{PREFIX}{role}-{uuid.uuid4().hex[:8]}"
    containers.append(name)
    # read-only root, exec tmpfs on /tmp (Ray's session directory): the shape compose.yaml runs
    _docker("run", "--detach", "--name", name, "--network", network, "--shm-size", SHM,
            "--read-only", "--tmpfs", "/tmp:exec,mode=1777",
            "--env", f"IMGFAB_ROLE={role}", *extra, image)
    return name


def _logs(container: str) -> str:
    result = _docker("logs", container, check=False)
    return result.stdout + result.stderr


def _running(container: str) -> bool:
    state = _docker("inspect", "--format", "{{.State.Running}}", container, check=False)
    return state.stdout.strip() == "true"


def test_two_nodes_join_then_the_leader_serves_and_smoke_passes(cluster_image, api_key, ray_token):
    from imgfab.ops.smoke import run_smoke

    image, _, served, port = cluster_image
    key = api_key
    with _network() as (network, containers):
        leader = _start(image, network, containers, "leader", "--network-alias", "leader",
                        "--env", f"IMGFAB_RAY_WAIT_S={WAIT_S}",
                        "--env", f"IMGFAB_RAY_ARGS={RAY_ARGS}", *_token(ray_token), *_key(key),
                        "--publish", f"127.0.0.1::{port}")
        worker = _start(image, network, containers, "worker", *_token(ray_token),
                        "--env", "IMGFAB_LEADER_ADDRESS=leader", "--env", f"IMGFAB_RAY_ARGS={RAY_ARGS}")
        published = _docker("port", leader, f"{port}/tcp").stdout.split()[0].rsplit(":", 1)[1]
        report = run_smoke(f"http://127.0.0.1:{published}", health_timeout_s=WAIT_S + 120,
                           poll_interval_s=1, api_key=key.read_text(),
                           alive=lambda: _running(leader))
        logs = _logs(leader)
        assert report.passed, (report.failures, logs[-4000:], _logs(worker)[-2000:])
        # the leader's wait saw both nodes and all four declared GPUs, then exec'd the server
        out = _docker("logs", leader, check=False).stdout.splitlines()  # stdout, in order
        joined = out.index("2 node(s) with 4 GPU(s) joined the Ray cluster") if \
            "2 node(s) with 4 GPU(s) joined the Ray cluster" in out else -1
        assert joined >= 0, logs[-4000:]
        assert any(re.fullmatch(r"PORT \d+", line) for line in out[joined + 1:]), out[-40:]
        assert report.model_ids == [served]
        # PID 1 is now the server the entrypoint exec'd, with the parallel sizes and Ray executor
        argv = _docker("exec", leader, "cat", "/proc/1/cmdline").stdout.split("\0")
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2", argv
        assert argv[argv.index("--pipeline-parallel-size") + 1] == "2", argv
        assert argv[argv.index("--distributed-executor-backend") + 1] == "ray", argv
        assert _running(worker), _logs(worker)[-2000:]  # the worker blocks in `ray start --block`


def test_a_worker_that_never_joins_stops_the_leader_within_its_bound(cluster_image, api_key, ray_token):
    image = cluster_image[0]
    with _network() as (network, containers):
        leader = _start(image, network, containers, "leader", *_token(ray_token), *_key(api_key),
                        "--env", f"IMGFAB_RAY_WAIT_S={SHORT_WAIT_S}",
                        "--env", f"IMGFAB_RAY_ARGS={RAY_ARGS}")
        status = _docker("wait", leader, timeout=SHORT_WAIT_S + 240).stdout.strip()
        logs = _logs(leader)
        assert status == "1", logs[-4000:]
        lines = [line for line in logs.splitlines() if "joined the Ray cluster" in line]
        assert len(lines) == 1, logs[-4000:]
        assert lines[0].startswith(f"imgfab: 1 of 2 node(s) (2 of 4 GPUs) joined the Ray cluster "
                                   f"within {SHORT_WAIT_S:g} s; start the workers"), lines
        assert "IMGFAB_RAY_WAIT_S" in lines[0]
        assert not re.search(r"(?m)^PORT \d+$", logs), logs[-4000:]  # the server never started


# --- issue 34: no token, no cluster -------------------------------------------------------

# Ray's own settings for a process that is not the entrypoint: the leader's token, as a client.
_AUTH = ["--env", "RAY_AUTH_MODE=token", "--env", f"RAY_AUTH_TOKEN_PATH={TOKEN_TARGET}"]
# A census of the leader's cluster, run inside the leader with the token: "<alive nodes>".
CENSUS = ("import ray; ray.init(address='auto', logging_level='ERROR'); "
          "print(sum(1 for n in ray.nodes() if n.get('Alive')))")
# A client of the leader's GCS (what every driver and node talks to first): reads the node
# table, then writes the key-value store (where a driver puts the functions its tasks run).
# A driver needs a raylet on its own host, so an outside client's way in is the GCS itself.
GCS = ("from ray._raylet import GcsClient; gcs = GcsClient(address='leader:6379'); "
       "print('nodes', len(gcs.get_all_node_info(timeout=20))); "
       "gcs.internal_kv_put(b'imgfab-probe', b'1', True, b'imgfab', timeout=20); print('kv written')")


def _census(leader: str) -> str:
    done = _docker("exec", *_AUTH, leader, "python3", "-c", CENSUS, check=False, timeout=120)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else f"error: {done.stderr[-400:]}"


def _waiting_leader(image: str, network: str, containers: list[str], ray_token: Path,
                    api_key: Path) -> str:
    """A leader that waits (long) for its worker, its Ray head up and answering the census."""
    leader = _start(image, network, containers, "leader", "--network-alias", "leader",
                    *_token(ray_token), *_key(api_key), "--env", f"IMGFAB_RAY_WAIT_S={WAIT_S + 300}",
                    "--env", f"IMGFAB_RAY_ARGS={RAY_ARGS}")
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if _census(leader) == "1":
            return leader
        assert _running(leader), _logs(leader)[-4000:]
        time.sleep(2)
    raise AssertionError(f"the leader's Ray head never answered: {_logs(leader)[-4000:]}")


def _rogue(image: str, network: str, containers: list[str], *args: str) -> str:
    """A container of the same image that skips the entrypoint, as an attacker's would."""
    name = f"{PREFIX}rogue-{uuid.uuid4().hex[:8]}"
    containers.append(name)
    _docker("run", "--detach", "--name", name, "--network", network, "--shm-size", SHM,
            "--read-only", "--tmpfs", "/tmp:exec,mode=1777", *args)
    return name


def test_a_node_without_the_token_cannot_join(cluster_image, tmp_path, api_key, ray_token):
    image = cluster_image[0]
    wrong = tmp_path / "wrong-token"
    wrong.write_text(uuid.uuid4().hex + "\n")
    wrong.chmod(0o644)
    join = ["ray", "start", "--address=leader:6379", "--num-gpus=2", "--block",
            "--disable-usage-stats", *RAY_ARGS.split()]
    with _network() as (network, containers):
        leader = _waiting_leader(image, network, containers, ray_token, api_key)
        # Ray's auth off on the joining node, then a token that is not the cluster's: both
        # get ROGUE_S to join (the control below joins in a fraction of it), and none does.
        rogues = [_rogue(image, network, containers, "--entrypoint", join[0], image, *join[1:]),
                  _rogue(image, network, containers, *_AUTH, *_token(wrong), "--entrypoint", join[0],
                         image, *join[1:])]
        deadline = time.monotonic() + ROGUE_S
        while time.monotonic() < deadline:
            assert _census(leader) == "1", [_logs(r)[-2000:] for r in rogues]
            time.sleep(5)
        # the control: the same command with the cluster's token joins; the rogues, still
        # trying or given up, never do (the count is 2, not more)
        _rogue(image, network, containers, *_AUTH, *_token(ray_token), "--entrypoint", join[0],
               image, *join[1:])
        deadline = time.monotonic() + WAIT_S
        while _census(leader) == "1" and time.monotonic() < deadline:
            time.sleep(2)
        assert _census(leader) == "2", (_logs(leader)[-4000:], [_logs(r)[-2000:] for r in rogues])


def test_a_client_without_the_token_cannot_use_the_gcs(cluster_image, tmp_path, api_key, ray_token):
    image = cluster_image[0]
    wrong = tmp_path / "wrong-token"
    wrong.write_text(uuid.uuid4().hex + "\n")
    wrong.chmod(0o644)
    client = ["--entrypoint", "timeout", image, str(ROGUE_S), "python3", "-c", GCS]
    with _network() as (network, containers):
        _waiting_leader(image, network, containers, ray_token, api_key)
        for args in ([], [*_AUTH, *_token(wrong)]):  # no token at all; a token not the cluster's
            rogue = _rogue(image, network, containers, *args, *client)
            status = _docker("wait", rogue, timeout=ROGUE_S + 120).stdout.strip()
            logs = _logs(rogue)
            assert status != "0", (args, status, logs[-3000:])
            # refused by the GCS for its token, before it read or wrote anything
            assert "InvalidAuthToken" in logs, (args, logs[-3000:])
            out = _docker("logs", rogue, check=False).stdout.splitlines()  # the client's prints
            assert not [line for line in out if line.startswith("nodes ") or line == "kv written"], \
                (args, out)
        # the control: with the cluster's token the same client reads and writes
        ok = _rogue(image, network, containers, *_AUTH, *_token(ray_token), *client)
        assert _docker("wait", ok, timeout=ROGUE_S + 120).stdout.strip() == "0", _logs(ok)[-3000:]
        out = _docker("logs", ok, check=False).stdout.split("\n")
        assert "nodes 1" in out and "kv written" in out, out
