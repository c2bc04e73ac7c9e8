"""Safe to serve by default (issue 34): the rendered image fails closed and its artifacts
publish on the loopback address; the vLLM server command loads the in-image API-key gate;
no pod mounts a service-account token.

- entrypoint.sh runs with recording stubs: without a key file it refuses in one line naming the
  fix, unless the recipe (serve.unauthenticated) or the run (IMGFAB_ALLOW_UNAUTHENTICATED=1)
  opts out, which it says at start; trtllm-serve, which checks no key, starts only so.
- run.sh and compose.yaml publish on serve.publish_address (default 127.0.0.1), HOST_ADDR over it.
- k8s.yaml: automountServiceAccountToken false in the Deployment's pod and in both pod templates
  of a LeaderWorkerSet, validated by kubernetes-validate as the other artifact tests do.
"""

from __future__ import annotations

import copy
import importlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from test_artifacts import BIN, _compose, _entrypoint, _records, _stubs

H100 = REPO / "recipes" / "qwen2-7b-h100.yaml"
TRTLLM = REPO / "recipes" / "mistral-7b-a100-trtllm.yaml"
VLLM_REFUSAL = ("imgfab: no API key file at {path}, and without one every route answers anyone: "
                "mount the key there (run.sh and compose: API_KEY_FILE=path; k8s: the Secret "
                "qwen2-7b-h100-api-key), or set IMGFAB_ALLOW_UNAUTHENTICATED=1 to serve without a key\n")
TRTLLM_REFUSAL = ("imgfab: trtllm-serve checks no API key, so every route would answer anyone who "
                  "reaches port 8000: put an authenticating proxy in front and set "
                  "IMGFAB_ALLOW_UNAUTHENTICATED=1 (recipe: serve.unauthenticated: true)\n")
OPTED_OUT = ("imgfab: IMGFAB_ALLOW_UNAUTHENTICATED=1: serving without an API key; every route "
             "answers anyone who reaches port 8000\n")


def _data(path: Path, **serve) -> dict:
    data = yaml.safe_load(path.read_text())
    data["serve"] = {k: v for k, v in data["serve"].items() if k != "unauthenticated"} | serve
    return data


def _render(data: dict, matrix, out: Path):
    from imgfab.recipe import parse_recipe
    from imgfab.render.context import render_context, write_context
    from imgfab.stack.resolve import resolve

    recipe = parse_recipe(copy.deepcopy(data))
    stack = resolve(recipe, matrix).stack
    files = render_context(recipe, stack, matrix)
    write_context(files, out)
    return recipe, files


def _start(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    stubs = _stubs(tmp_path / "bin", "vllm", "trtllm-serve")
    log = tmp_path / "calls.log"
    log.unlink(missing_ok=True)
    result = _entrypoint(tmp_path / "ctx", stubs, log, **env)
    return result, _records(log)


# --- the entrypoint fails closed ---------------------------------------------------------------

def test_a_vllm_image_without_a_key_file_refuses_to_start_in_one_line(matrix, tmp_path):
    _render(_data(H100), matrix, tmp_path / "ctx")
    absent = tmp_path / "absent"
    result, calls = _start(tmp_path, IMGFAB_API_KEY_FILE=str(absent))
    assert result.returncode == 2
    assert result.stderr == VLLM_REFUSAL.format(path=absent)
    assert [c[0] for c in calls] == ["imgfab-probe"], "no server starts"


@pytest.mark.parametrize("value", ["0", "", "true"])
def test_only_the_value_1_opts_out_at_run_time(matrix, tmp_path, value):
    _render(_data(H100), matrix, tmp_path / "ctx")
    result, calls = _start(tmp_path, IMGFAB_API_KEY_FILE=str(tmp_path / "absent"),
                           IMGFAB_ALLOW_UNAUTHENTICATED=value)
    assert result.returncode == 2 and [c[0] for c in calls] == ["imgfab-probe"]


def test_the_run_time_opt_out_serves_without_a_key_and_says_so(matrix, tmp_path):
    _render(_data(H100), matrix, tmp_path / "ctx")
    stubs = _stubs(tmp_path / "bin")
    seen = tmp_path / "seen"
    (stubs / "vllm").write_text('#!/bin/sh\nprintf "%s|%s|%s" "${VLLM_API_KEY-unset}" '
                                '"$IMGFAB_ALLOW_UNAUTHENTICATED" "$IMGFAB_API_KEY_FILE" > "$SEEN"\n')
    (stubs / "vllm").chmod(0o755)
    absent = tmp_path / "absent"
    result = _entrypoint(tmp_path / "ctx", stubs, tmp_path / "log", IMGFAB_API_KEY_FILE=str(absent),
                         IMGFAB_ALLOW_UNAUTHENTICATED="1", SEEN=str(seen))
    assert result.returncode == 0, result.stderr
    assert result.stderr == OPTED_OUT
    # what the gate in the server reads: no key file, and the opt-out
    assert seen.read_text() == f"unset|1|{absent}"


def test_the_gate_is_told_the_key_file_the_entrypoint_looked_at(matrix, tmp_path):
    """Without IMGFAB_API_KEY_FILE in the environment, the entrypoint looks at the mount path
    every shape uses, and tells the gate the same file."""
    _render(_data(H100), matrix, tmp_path / "ctx")
    stubs = _stubs(tmp_path / "bin")
    seen = tmp_path / "seen"
    (stubs / "vllm").write_text('#!/bin/sh\nprintf "%s" "${IMGFAB_API_KEY_FILE-unset}" > "$SEEN"\n')
    (stubs / "vllm").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "IMGFAB_API_KEY_FILE"}
    env |= {"PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(tmp_path / "log"),
            "IMGFAB_SKIP_PROBE": "1", "IMGFAB_ALLOW_UNAUTHENTICATED": "1", "SEEN": str(seen)}
    result = subprocess.run(["bash", str(tmp_path / "ctx" / "entrypoint.sh")], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert seen.read_text() == "/run/secrets/imgfab-api-key"


def test_a_mounted_key_reaches_the_gate_and_no_opt_out_is_said(matrix, tmp_path):
    _render(_data(H100, unauthenticated=True), matrix, tmp_path / "ctx")
    stubs = _stubs(tmp_path / "bin")
    seen = tmp_path / "seen"
    (stubs / "vllm").write_text('#!/bin/sh\nprintf "%s|%s" "$VLLM_API_KEY" "$IMGFAB_API_KEY_FILE" > "$SEEN"\n')
    (stubs / "vllm").chmod(0o755)
    result = _entrypoint(tmp_path / "ctx", stubs, tmp_path / "log", SEEN=str(seen))
    assert result.returncode == 0 and result.stderr == ""
    assert seen.read_text() == f"k-123|{tmp_path / 'mounted-api-key'}"


def test_the_recipe_opt_out_is_the_image_default_and_its_label(matrix, tmp_path):
    import json

    _, files = _render(_data(H100, unauthenticated=True), matrix, tmp_path / "ctx")
    labels = json.loads(files["image.json"])
    assert labels["org.imgfab.serve.unauthenticated"] == "true"
    result, calls = _start(tmp_path, IMGFAB_API_KEY_FILE=str(tmp_path / "absent"))
    assert result.returncode == 0 and result.stderr == OPTED_OUT
    assert [c[0] for c in calls] == ["imgfab-probe", "vllm"]
    revoked, _ = _start(tmp_path, IMGFAB_API_KEY_FILE=str(tmp_path / "absent"),
                        IMGFAB_ALLOW_UNAUTHENTICATED="0")
    assert revoked.returncode == 2, "the run can take the recipe's opt-out back"


def test_without_the_recipe_opt_out_the_label_says_false(matrix, tmp_path):
    import json

    _, files = _render(_data(H100), matrix, tmp_path / "ctx")
    labels = json.loads(files["image.json"])
    assert labels["org.imgfab.serve.unauthenticated"] == "false"
    assert labels["org.imgfab.serve.metrics_unauthenticated"] == "false"
    assert 'org.imgfab.serve.unauthenticated="false"' in files["Dockerfile"]


def test_trtllm_serve_starts_only_where_opted_out(matrix, tmp_path):
    """trtllm-serve checks no API key: fail closed there too, the same way (issue 34)."""
    _render(_data(TRTLLM), matrix, tmp_path / "ctx")
    result, calls = _start(tmp_path)
    assert result.returncode == 2 and result.stderr == TRTLLM_REFUSAL
    assert [c[0] for c in calls] == ["imgfab-probe"]
    started, calls = _start(tmp_path, IMGFAB_ALLOW_UNAUTHENTICATED="1")
    assert started.returncode == 0 and started.stderr == OPTED_OUT
    assert [c[0] for c in calls] == ["imgfab-probe", "trtllm-serve"]


def test_the_example_trtllm_recipes_opt_out_in_the_recipe(matrix, tmp_path):
    from imgfab.recipe import load_recipe

    for path in sorted((REPO / "recipes").glob("*.yaml")):
        recipe = load_recipe(path)
        assert recipe.serve.unauthenticated == (recipe.backend.name == "tensorrt-llm"), path.name
    _render(yaml.safe_load(TRTLLM.read_text()), matrix, tmp_path / "ctx")
    result, calls = _start(tmp_path)
    assert result.returncode == 0 and result.stderr == OPTED_OUT
    assert [c[0] for c in calls] == ["imgfab-probe", "trtllm-serve"]


# --- the gate the vLLM server loads -------------------------------------------------------------

def test_the_vllm_server_command_loads_the_gate_that_the_image_carries(matrix, tmp_path):
    from imgfab.render.context import serve_commands

    recipe, files = _render(_data(H100), matrix, tmp_path / "ctx")
    gate = "imgfab.in_image.gate.ApiKeyGate"
    for argv in serve_commands(recipe, _stack(recipe, matrix)).values():
        assert argv[argv.index("--middleware") + 1] == gate
    assert f"--middleware {gate} " in files["entrypoint.sh"]
    assert files["imgfab/in_image/gate.py"] == (REPO / "src/imgfab/in_image/gate.py").read_text()
    # What vLLM does with the name: import the module, take the attribute, add it if a class.
    module, name = gate.rsplit(".", 1)
    assert isinstance(getattr(importlib.import_module(module), name), type)


def test_metrics_opt_in_loads_the_gate_that_opens_get_metrics(matrix, tmp_path):
    import json

    from imgfab.render.context import serve_commands

    recipe, files = _render(_data(H100, metrics_unauthenticated=True), matrix, tmp_path / "ctx")
    for argv in serve_commands(recipe, _stack(recipe, matrix)).values():
        assert argv[argv.index("--middleware") + 1] == "imgfab.in_image.gate.ApiKeyGateOpenMetrics"
    assert json.loads(files["image.json"])["org.imgfab.serve.metrics_unauthenticated"] == "true"
    assert "every route without it but GET /health and GET /metrics" in files["entrypoint.sh"]


def test_trtllm_serve_gets_no_middleware(matrix, tmp_path):
    recipe, files = _render(_data(TRTLLM), matrix, tmp_path / "ctx")
    assert "--middleware" not in files["entrypoint.sh"]


def _stack(recipe, matrix):
    from imgfab.stack.resolve import resolve

    return resolve(recipe, matrix).stack


# --- where run.sh and compose.yaml publish the port ------------------------------------------

def _run_sh_publish(tmp_path: Path, **env: str) -> list[str]:
    stubs = _stubs(tmp_path / "bin", "docker")
    log = tmp_path / "docker.log"
    log.unlink(missing_ok=True)
    key = tmp_path / "api-key"
    key.write_text("k-123")
    base = {k: v for k, v in os.environ.items() if k not in ("HOST_ADDR", "HOST_PORT")}
    result = subprocess.run(["bash", str(tmp_path / "ctx" / "run.sh")],
                            env=base | {"PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log),
                                        "WEIGHTS_DIR": "/srv/w", "API_KEY_FILE": str(key), **env},
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    (call,) = _records(log)
    return call[call.index("--publish") + 1]


def _compose_port(tmp_path: Path, **env: str) -> object:
    base = {k: v for k, v in os.environ.items() if k not in ("HOST_ADDR", "HOST_PORT", "DOCKER_HOST")}
    result = subprocess.run([_compose(), "-f", str(tmp_path / "ctx" / "compose.yaml"), "config"],
                            env=base | {"WEIGHTS_DIR": "/srv/w", "API_KEY_FILE": "/srv/k", **env},
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    ((_, service),) = yaml.safe_load(result.stdout)["services"].items()
    (port,) = service["ports"]
    return port


def _host_ip(port: object) -> str:
    """The host address of a `docker-compose config` port (long or short form)."""
    return port["host_ip"] if isinstance(port, dict) else str(port).rsplit(":", 2)[0]


@pytest.mark.parametrize("path", [H100, TRTLLM], ids=["vllm", "trtllm"])
def test_the_port_is_published_on_the_loopback_address_by_default(path, matrix, tmp_path):
    _render(yaml.safe_load(path.read_text()), matrix, tmp_path / "ctx")
    assert _run_sh_publish(tmp_path) == "127.0.0.1:8000:8000"
    assert _run_sh_publish(tmp_path, HOST_ADDR="10.1.2.3") == "10.1.2.3:8000:8000"
    assert _host_ip(_compose_port(tmp_path)) == "127.0.0.1"
    assert _host_ip(_compose_port(tmp_path, HOST_ADDR="10.1.2.3")) == "10.1.2.3"


def test_the_recipe_names_the_address_to_publish_on(matrix, tmp_path):
    _render(_data(H100, publish_address="0.0.0.0"), matrix, tmp_path / "ctx")
    assert _run_sh_publish(tmp_path) == "0.0.0.0:8000:8000"
    assert _run_sh_publish(tmp_path, HOST_ADDR="127.0.0.1") == "127.0.0.1:8000:8000"
    assert _host_ip(_compose_port(tmp_path)) == "0.0.0.0"


@pytest.mark.parametrize("value", ["::1", "localhost", "127.0.0.1:8000", "256.0.0.1", "$(id)"])
def test_a_publish_address_that_is_not_ipv4_is_refused_in_one_line(value, tmp_path):
    data = _data(H100, publish_address=value)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(data))
    result = subprocess.run([str(BIN / "python"), "-m", "imgfab.cli", "render", str(recipe), "-o",
                             str(tmp_path / "out")], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr == (
        "imgfab: serve.publish_address: must be an IPv4 address: 127.0.0.1 (this host only), "
        "0.0.0.0 (every interface) or one interface's address\n")
    assert not (tmp_path / "out").exists()


# --- no service-account token in any pod ------------------------------------------------------

def _validated(path: Path) -> list[dict]:
    validate = shutil.which("kubernetes-validate") or str(BIN / "kubernetes-validate")
    result = subprocess.run([validate, "--strict", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("path", [H100, TRTLLM], ids=["vllm", "trtllm"])
def test_the_deployment_pod_mounts_no_service_account_token(path, matrix, tmp_path):
    _render(yaml.safe_load(path.read_text()), matrix, tmp_path / "ctx")
    (deployment,) = [d for d in _validated(tmp_path / "ctx" / "k8s.yaml") if d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_every_leaderworkerset_pod_mounts_no_service_account_token(tmp_path):
    from test_multinode import _render as render_405b

    render_405b(tmp_path)
    docs = yaml.safe_load_all((tmp_path / "ctx" / "k8s.yaml").read_text())
    (lws,) = [d for d in docs if d and d["kind"] == "LeaderWorkerSet"]
    template = lws["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        assert template[role]["spec"]["automountServiceAccountToken"] is False, role
