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
shared 2-core host (one CPU, a 100 MiB object store, no dashboard on the head).

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
# ray's newest release when this test was written; cp311: bookworm's python3, which is what the
# stand-in base (debootstrap bookworm under the nvidia/cuda names) installs.
RAY_VERSION = "2.60.0"
PYTHON = "3.11"
# Small on purpose: 1 CPU each, a 100 MiB object store (Ray's floor is 75 MiB) in a 256 MiB shm.
RAY_ARGS = "--num-cpus=1 --object-store-memory=104857600"
SHM = "256m"
WAIT_S = 150  # the leader's bound in the two-node test: generous, it returns as soon as both joined
SHORT_WAIT_S = 12  # the bound the lone leader runs out of


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


def test_two_nodes_join_then_the_leader_serves_and_smoke_passes(cluster_image, tmp_path):
    from imgfab.ops.smoke import run_smoke

    image, _, served, port = cluster_image
    key = tmp_path / "api-key"
    key.write_text(uuid.uuid4().hex)
    key.chmod(0o644)
    with _network() as (network, containers):
        leader = _start(image, network, containers, "leader", "--network-alias", "leader",
                        "--env", f"IMGFAB_RAY_WAIT_S={WAIT_S}",
                        "--env", f"IMGFAB_RAY_ARGS={RAY_ARGS} --include-dashboard=false",
                        "--env", "IMGFAB_API_KEY_FILE=/run/secrets/api-key",
                        "--mount", f"type=bind,source={key},target=/run/secrets/api-key,readonly",
                        "--publish", f"127.0.0.1::{port}")
        worker = _start(image, network, containers, "worker",
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


def test_a_worker_that_never_joins_stops_the_leader_within_its_bound(cluster_image):
    image = cluster_image[0]
    with _network() as (network, containers):
        leader = _start(image, network, containers, "leader",
                        "--env", f"IMGFAB_RAY_WAIT_S={SHORT_WAIT_S}",
                        "--env", f"IMGFAB_RAY_ARGS={RAY_ARGS} --include-dashboard=false")
        status = _docker("wait", leader, timeout=SHORT_WAIT_S + 240).stdout.strip()
        logs = _logs(leader)
        assert status == "1", logs[-4000:]
        lines = [line for line in logs.splitlines() if "joined the Ray cluster" in line]
        assert len(lines) == 1, logs[-4000:]
        assert lines[0].startswith(f"imgfab: 1 of 2 node(s) (2 of 4 GPUs) joined the Ray cluster "
                                   f"within {SHORT_WAIT_S:g} s; start the workers"), lines
        assert "IMGFAB_RAY_WAIT_S" in lines[0]
        assert not re.search(r"(?m)^PORT \d+$", logs), logs[-4000:]  # the server never started
