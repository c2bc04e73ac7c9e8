"""Multi-node serving (issue 22, target.nodes): vLLM on Ray, tp within a node and pp across
nodes; a LeaderWorkerSet validated against the LWS CRD's own schema; the entrypoint's leader and
worker roles run with stubs; the leader's bounded wait; TensorRT-LLM across nodes refused.

Sources, in kubernetes-sigs/lws@v0.10.0: ``tests/fixtures/schemas/leaderworkerset.crd.yaml``
(config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml, copied unchanged);
api/leaderworkerset/v1/leaderworkerset_types.go: the pods' ``LWS_LEADER_ADDRESS`` variable and
the ``leaderworkerset.sigs.k8s.io/worker-index`` label (the leader's is ``"0"``).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import REPO
from imgfab.errors import RecipeError
from imgfab.in_image import cluster
from test_artifacts import BIN, _node_matches

CRD = yaml.safe_load((REPO / "tests/fixtures/schemas/leaderworkerset.crd.yaml").read_text())
RECIPE_405B = {
    "name": "llama31-405b-h100",
    "model": {"id": "meta-llama/Llama-3.1-405B-Instruct",
              "revision": "be673f326cab4cd22ccfef76109faf68e41aa5f1",
              "mount_path": "/models/llama3.1-405b", "license": "LicenseRef-llama3.1",
              "facts": {"parameters": 405853388800, "layers": 126, "attention_heads": 128,
                        "kv_heads": 8, "head_size": 128, "max_positions": 131072}},
    "target": {"gpu": "H100-SXM", "count": 8, "pipeline_parallel": 2, "nodes": 2,
               "driver": ">=535.104.05", "driver_policy": "minor-compat"},
    "backend": {"name": "vllm"},
    "engine": {"dtype": "bfloat16"},
    "serve": {"max_model_len": 16384, "served_model_name": "llama3.1-405b"},
    "image": {"repository": "llm/llama3.1-405b", "shm_size": "64g"},
}

# OpenAPI keywords of a structural schema the converter understands (the rest are errors).
_KNOWN = {"type", "required", "description", "properties", "items", "additionalProperties",
          "anyOf", "enum", "pattern", "maxLength", "minLength", "maximum", "minimum", "format",
          "default", "x-kubernetes-int-or-string", "x-kubernetes-list-map-keys",
          "x-kubernetes-list-type", "x-kubernetes-map-type", "x-kubernetes-preserve-unknown-fields",
          "maxItems", "minItems", "nullable", "x-kubernetes-validations"}


def _json_schema(node: dict) -> dict:
    """One OpenAPI v3 structural-schema node as JSON Schema, as the API server applies it with
    strict field validation: an object without ``x-kubernetes-preserve-unknown-fields`` or
    ``additionalProperties`` refuses unknown fields; int-or-string is an integer or a string;
    ``format`` is an annotation; CEL rules (``x-kubernetes-validations``) are not evaluated."""
    unknown = set(node) - _KNOWN
    assert not unknown, f"the converter does not handle {sorted(unknown)}"
    out: dict = {k: node[k] for k in ("required", "enum", "pattern", "maxLength", "minLength",
                                      "maximum", "minimum", "maxItems", "minItems") if k in node}
    if node.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    elif "type" in node:
        out["type"] = [node["type"], "null"] if node.get("nullable") else node["type"]
    if "anyOf" in node:
        out["anyOf"] = [_json_schema(n) for n in node["anyOf"]]
    if "properties" in node:
        out["properties"] = {k: _json_schema(v) for k, v in node["properties"].items()}
    if "items" in node:
        out["items"] = _json_schema(node["items"])
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _json_schema(node["additionalProperties"])
    elif node.get("type") == "object" and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _validator() -> jsonschema.Draft202012Validator:
    (version,) = [v for v in CRD["spec"]["versions"] if v["served"]]
    schema = _json_schema(version["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": f"{CRD['spec']['group']}/{version['name']}"}
    schema["properties"]["kind"] = {"const": CRD["spec"]["names"]["kind"]}
    schema["properties"]["metadata"] = {
        "type": "object", "required": ["name"], "additionalProperties": False,
        "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                                "maxLength": 63},
                       "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return jsonschema.Draft202012Validator(schema)


def _render(tmp_path: Path, data: dict | None = None):
    from imgfab.matrix.compat import load_matrix
    from imgfab.recipe import parse_recipe
    from imgfab.render.context import render_context, write_context
    from imgfab.stack.resolve import resolve

    matrix = load_matrix()
    recipe = parse_recipe(copy.deepcopy(data or RECIPE_405B))
    stack = resolve(recipe, matrix).stack
    files = render_context(recipe, stack, matrix)
    write_context(files, tmp_path / "ctx", force=True)
    return recipe, stack, files


def test_405b_renders_a_leaderworkerset_that_validates(tmp_path):
    _, stack, files = _render(tmp_path)
    assert (stack.tensor_parallel, stack.pipeline_parallel, stack.nodes) == (8, 2, 2)
    docs = [d for d in yaml.safe_load_all(files["k8s.yaml"]) if d]
    kinds = [d["kind"] for d in docs]
    assert "Deployment" not in kinds and kinds.count("LeaderWorkerSet") == 1
    (lws,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    errors = sorted(_validator().iter_errors(lws), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    for role in ("leaderTemplate", "workerTemplate"):
        container = template[role]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"  # one 8-GPU pod per node
        terms = template[role]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        node = {"nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0",
                "nvidia.com/cuda.driver.major": "580", "nvidia.com/cuda.driver.minor": "95",
                "nvidia.com/cuda.driver.rev": "05", "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert _node_matches(terms, node)
        assert not _node_matches(terms, dict(node, **{"nvidia.com/gpu.count": "4"}))
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["IMGFAB_ROLE"] == ("leader" if role == "leaderTemplate" else "worker")
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    worker = template["workerTemplate"]["spec"]["containers"][0]
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(leader)
    assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(worker)
    (service,) = [d for d in docs if d["kind"] == "Service"]
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"


def test_leaderworkerset_pods_are_as_restricted_as_the_deployment(tmp_path):
    """The same pod security, volumes and placement as a one-node render of the same model."""
    single = copy.deepcopy(RECIPE_405B)
    single["model"].pop("facts")  # 405B on one node does not fit: compare shape, not the fit
    single["target"] |= {"pipeline_parallel": 1, "nodes": 1}
    _, _, one = _render(tmp_path / "one", single)
    _, _, two = _render(tmp_path / "two")
    deployment = next(d for d in yaml.safe_load_all(one["k8s.yaml"]) if d and d["kind"] == "Deployment")
    lws = next(d for d in yaml.safe_load_all(two["k8s.yaml"]) if d and d["kind"] == "LeaderWorkerSet")
    pod = deployment["spec"]["template"]["spec"]
    for role in ("leaderTemplate", "workerTemplate"):
        other = lws["spec"]["leaderWorkerTemplate"][role]["spec"]
        assert other["securityContext"] == pod["securityContext"]
        assert other["containers"][0]["securityContext"] == pod["containers"][0]["securityContext"]
        assert other["volumes"] == pod["volumes"] and other["tolerations"] == pod["tolerations"]


def test_the_rest_of_a_multinode_k8s_yaml_passes_kubernetes_validate(tmp_path):
    _, _, files = _render(tmp_path)
    rest = [d for d in yaml.safe_load_all(files["k8s.yaml"]) if d and d["kind"] != "LeaderWorkerSet"]
    path = tmp_path / "rest.yaml"
    path.write_text(yaml.safe_dump_all(rest))
    validate = shutil.which("kubernetes-validate") or str(BIN / "kubernetes-validate")
    result = subprocess.run([validate, "--strict", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_lws_validator_is_a_real_consumer():
    bad = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": "x"}, "spec": {"leaderWorkerTemplate": {"sise": 2}}}
    assert list(_validator().iter_errors(bad))
    wrong = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
             "metadata": {"name": "x"}, "spec": {"leaderWorkerTemplate": {
                 "size": 2, "workerTemplate": {"spec": {"containers": [{"name": "c", "ports": [
                     {"containerPort": "http"}]}]}}}}}
    assert list(_validator().iter_errors(wrong))


# A recording stub: one record per call (fields split by \x1f, records ended by \x1e).
RECORDER = """#!/bin/sh
printf '%s\\037' "$(basename "$0")" "$@" >> "$STUB_LOG"
printf '\\036' >> "$STUB_LOG"
exit 0
"""


def _entry(tmp_path: Path, role: str | None, wait_exit: int = 0, **extra: str):
    """Run the rendered entrypoint with recording stubs for the probe, ray, python3 (the
    cluster wait, exiting ``wait_exit``) and vllm, the API key file mounted unless ``extra``
    says otherwise; (result, the calls as argv lists)."""
    import os

    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for name in ("imgfab-probe", "ray", "python3", "vllm"):
        (stubs / name).write_text(RECORDER.replace("exit 0", f"exit {wait_exit}")
                                  if name == "python3" else RECORDER)
        (stubs / name).chmod(0o755)
    log = tmp_path / "calls"
    log.unlink(missing_ok=True)
    key = tmp_path / "mounted-api-key"
    key.write_text("k-123\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("IMGFAB_ROLE", "IMGFAB_LEADER_ADDRESS", "LWS_LEADER_ADDRESS", "IMGFAB_PRESET",
                        "IMGFAB_ALLOW_UNAUTHENTICATED")}
    env |= {"PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log),
            "IMGFAB_API_KEY_FILE": str(key), **extra}
    if role:
        env["IMGFAB_ROLE"] = role
    result = subprocess.run(["bash", str(tmp_path / "ctx" / "entrypoint.sh")], env=env,
                            capture_output=True, text=True, timeout=60)
    records = log.read_text().split("\x1e")[:-1] if log.exists() else []
    return result, [r.split("\x1f")[:-1] for r in records]


def test_entrypoint_leader_waits_for_the_cluster_then_serves_on_ray(tmp_path):
    _render(tmp_path)
    result, records = _entry(tmp_path, None)
    assert result.returncode == 0, result.stderr
    names = [r[0] for r in records]
    assert names == ["imgfab-probe", "ray", "python3", "vllm"]
    assert records[1][1:] == ["start", "--head", "--port=6379", "--num-gpus=8", "--disable-usage-stats"]
    assert records[2][1:] == ["-m", "imgfab.in_image.cluster", "--nodes", "2", "--gpus", "16",
                              "--timeout", "600"]
    vllm = records[3]
    assert vllm[vllm.index("--tensor-parallel-size") + 1] == "8"
    assert vllm[vllm.index("--pipeline-parallel-size") + 1] == "2"
    assert vllm[vllm.index("--distributed-executor-backend") + 1] == "ray"


def test_entrypoint_leader_without_a_key_refuses_before_ray_starts(tmp_path):
    _render(tmp_path)
    result, records = _entry(tmp_path, "leader", IMGFAB_API_KEY_FILE=str(tmp_path / "absent"))
    assert result.returncode == 2 and "no API key file at" in result.stderr
    assert [r[0] for r in records] == ["imgfab-probe"]


def test_entrypoint_leader_stops_when_the_cluster_does_not_form(tmp_path):
    _render(tmp_path)
    result, records = _entry(tmp_path, "leader", wait_exit=1)
    assert result.returncode == 1
    assert [r[0] for r in records] == ["imgfab-probe", "ray", "python3"]


def test_entrypoint_worker_joins_the_leader_and_blocks(tmp_path):
    _render(tmp_path)
    # a worker serves nothing: it needs no API key (the fail-closed check is the leader's)
    result, records = _entry(tmp_path, "worker", LWS_LEADER_ADDRESS="lws-0.lws",
                             IMGFAB_API_KEY_FILE=str(tmp_path / "absent"))
    assert result.returncode == 0, result.stderr
    assert records[-1] == ["ray", "start", "--address=lws-0.lws:6379", "--num-gpus=8", "--block",
                           "--disable-usage-stats"]
    alone, _ = _entry(tmp_path, "worker")
    assert alone.returncode == 2 and "IMGFAB_LEADER_ADDRESS" in alone.stderr
    odd, _ = _entry(tmp_path, "head")
    assert odd.returncode == 2 and "not one of: leader worker" in odd.stderr


def test_cluster_wait_sees_every_node_join():
    answers = iter([RuntimeError("GCS not up"), (1, 8.0), (2, 16.0)])

    def census():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    clock = iter(range(100)).__next__
    ok, line = cluster.wait_for_cluster(census, nodes=2, gpus=16, timeout_s=60, clock=clock,
                                        sleep=lambda s: None)
    assert ok and line == "2 node(s) with 16 GPU(s) joined the Ray cluster"


def test_cluster_wait_fails_within_its_bound_with_one_line():
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds

    ok, line = cluster.wait_for_cluster(lambda: (1, 8.0), nodes=2, gpus=16, timeout_s=30,
                                        poll_s=2, clock=lambda: now[0], sleep=sleep)
    assert not ok and now[0] == 30
    assert line.startswith("imgfab: 1 of 2 node(s) (8 of 16 GPUs) joined the Ray cluster within 30 s;")
    assert "\n" not in line


def test_a_worker_without_gpus_does_not_count():
    ok, line = cluster.wait_for_cluster(lambda: (2, 8.0), nodes=2, gpus=16, timeout_s=0,
                                        sleep=lambda s: None)
    assert not ok and "(8 of 16 GPUs)" in line


def test_tensorrt_llm_across_nodes_is_refused_in_one_line():
    from imgfab.recipe import load_recipe, parse_recipe

    data = yaml.safe_load((REPO / "recipes" / "mistral-7b-a100-trtllm.yaml").read_text())
    data["target"] |= {"pipeline_parallel": 2, "nodes": 2}
    with pytest.raises(RecipeError) as caught:
        parse_recipe(data)
    line = caught.value.one_line()
    assert line.startswith("target.nodes: TensorRT-LLM across nodes is launched with MPI")
    assert "\n" not in line
    assert load_recipe(REPO / "recipes" / "mistral-7b-a100-trtllm.yaml").target.nodes == 1


def test_pipeline_stages_must_split_evenly_over_the_nodes():
    from imgfab.recipe import parse_recipe

    data = copy.deepcopy(RECIPE_405B)
    data["target"] |= {"pipeline_parallel": 3, "nodes": 2}
    with pytest.raises(RecipeError) as caught:
        parse_recipe(data)
    assert caught.value.field == "target.pipeline_parallel"


def test_the_probe_counts_the_gpus_of_one_node(tmp_path):
    import json
    import sys

    sys.path.insert(0, str(REPO / "tests" / "fixtures"))
    from fake_nvml import H100, FakeCuda, FakeNvml
    from imgfab.in_image import probe

    _, _, files = _render(tmp_path)
    labels = json.loads(files["image.json"])
    labels["org.imgfab.model.mount"] = ""
    path = tmp_path / "image.json"
    path.write_text(json.dumps(labels))
    eight = probe.run_probe(str(path), nvml=FakeNvml(gpus=[H100] * 8), cuda=FakeCuda(count=8),
                            skip=frozenset({"driver", "mode", "shm", "cuda", "arch", "precision"}))
    (line,) = [f.line() for f in eight.findings if f.verdict.check == "fit"]
    assert line.startswith("PASS fit: 811.7 GB of weights") and "16× NVIDIA H100" in line
    four = probe.run_probe(str(path), nvml=FakeNvml(gpus=[H100] * 4), cuda=FakeCuda(count=4),
                           skip=frozenset({"driver", "mode", "shm", "cuda", "arch", "precision"}))
    assert four.exit_code == probe.EXIT_HOST_WRONG


def test_multinode_entrypoint_passes_shellcheck(tmp_path):
    _render(tmp_path)
    shellcheck = shutil.which("shellcheck") or str(BIN / "shellcheck")
    result = subprocess.run([shellcheck, "--shell", "bash", "--severity", "style",
                             str(tmp_path / "ctx" / "entrypoint.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# --- run.sh and compose.yaml for plain hosts: a leader role and a worker role ---------------

def _run_sh(tmp_path: Path, *args: str, **extra: str):
    """Run the rendered run.sh with a recording ``docker``; (result, its docker argv or None)."""
    import os

    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    (stubs / "docker").write_text(RECORDER)
    (stubs / "docker").chmod(0o755)
    log = tmp_path / "docker-calls"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGFAB_")
           and k not in ("API_KEY_FILE", "WEIGHTS_DIR", "HOST_PORT", "HOST_ADDR")}
    env |= {"PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log), **extra}
    result = subprocess.run(["bash", str(tmp_path / "ctx" / "run.sh"), *args], env=env,
                            capture_output=True, text=True, timeout=60)
    records = log.read_text().split("\x1e")[:-1] if log.exists() else []
    calls = [r.split("\x1f")[:-1] for r in records]
    assert len(calls) <= 1
    return result, calls[0] if calls else None


def _common_argv(recipe) -> list[str]:
    return ["--shm-size", recipe.image.shm_size, "--ulimit", "memlock=-1",
            "--ulimit", "stack=67108864", "--network", "host",
            "--env", f"IMGFAB_PRESET={recipe.serve.preset}",
            "--mount", f"type=bind,source=/srv/weights,target={recipe.model.mount_path},readonly",
            "--mount", f"type=volume,source=imgfab-{recipe.name}-cache,target=/home/imgfab/.cache"]


def test_run_sh_leader_role(tmp_path):
    from imgfab.render.context import context_image

    recipe, _, files = _render(tmp_path)
    key = tmp_path / "api-key"
    key.write_text("k-123")
    result, argv = _run_sh(tmp_path, "leader", WEIGHTS_DIR="/srv/weights", API_KEY_FILE=str(key))
    assert result.returncode == 0, result.stderr
    image = f"{recipe.image.repository}:{context_image(files)['tag']}"
    assert argv == ["docker", "run", "--rm", "--name", f"{recipe.name}-leader",
                    "--gpus", "count=8", *_common_argv(recipe),  # one node's 8 GPUs, not 16
                    "--env", "IMGFAB_ROLE=leader",
                    "--mount", f"type=bind,source={key},target=/run/secrets/imgfab-api-key,readonly",
                    "--env", "IMGFAB_RAY_WAIT_S", "--env", "IMGFAB_RAY_ARGS", image]
    # the same through the environment; and a leader is never started without its key
    same, again = _run_sh(tmp_path, WEIGHTS_DIR="/srv/weights", API_KEY_FILE=str(key),
                          IMGFAB_ROLE="leader")
    assert same.returncode == 0 and again == argv
    keyless, none = _run_sh(tmp_path, "leader", WEIGHTS_DIR="/srv/weights")
    assert keyless.returncode != 0 and "API_KEY_FILE" in keyless.stderr and none is None


def test_run_sh_worker_role_passes_the_leader_address(tmp_path):
    recipe, _, _ = _render(tmp_path)
    result, argv = _run_sh(tmp_path, "worker", "10.0.0.7", WEIGHTS_DIR="/srv/weights")
    assert result.returncode == 0, result.stderr  # a worker needs no API key
    assert argv[:6] == ["docker", "run", "--rm", "--name", f"{recipe.name}-worker", "--gpus"]
    tail = argv[argv.index("IMGFAB_PRESET=chat") + 5:]
    assert tail[:4] == ["--env", "IMGFAB_ROLE=worker", "--env", "IMGFAB_LEADER_ADDRESS=10.0.0.7"]
    assert not any("imgfab-api-key" in a for a in argv)
    env_form, again = _run_sh(tmp_path, WEIGHTS_DIR="/srv/weights", IMGFAB_ROLE="worker",
                              IMGFAB_LEADER_ADDRESS="10.0.0.7")
    assert env_form.returncode == 0 and again == argv


@pytest.mark.parametrize(("args", "env", "needle"), [
    ((), {}, "spans 2 nodes: run './run.sh leader'"),
    (("head",), {}, "spans 2 nodes"),
    (("worker",), {}, "needs the leader's address"),
    (("worker", "a b"), {}, "must be a host name or IPv4 address"),
    (("worker", "x;reboot"), {}, "must be a host name or IPv4 address"),
    (("worker", "--privileged"), {}, "must be a host name or IPv4 address"),
    (("worker", "10.0.0.7", "--extra"), {}, "too many arguments for the worker role"),
    (("leader", "--extra"), {}, "too many arguments for the leader role"),
])
def test_run_sh_refuses_a_wrong_role_in_one_line(tmp_path, args, env, needle):
    _render(tmp_path)
    result, argv = _run_sh(tmp_path, *args, WEIGHTS_DIR="/srv/weights", **env)
    assert result.returncode == 2 and argv is None
    assert needle in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_multinode_run_sh_passes_shellcheck(tmp_path):
    _render(tmp_path)
    shellcheck = shutil.which("shellcheck") or str(BIN / "shellcheck")
    result = subprocess.run([shellcheck, "--shell", "bash", "--severity", "style",
                             str(tmp_path / "ctx" / "run.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def _compose_config(tmp_path: Path, *args: str, **extra: str) -> dict:
    import os

    compose = shutil.which("docker-compose")
    assert compose, "docker-compose missing: scripts/local-stack.sh up installs Debian's docker-compose"
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST" and not k.startswith("IMGFAB_")
           and k != "API_KEY_FILE"} | {"WEIGHTS_DIR": "/srv/weights", **extra}
    result = subprocess.run([compose, "-f", str(tmp_path / "ctx" / "compose.yaml"), *args, "config"],
                            env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_renders_a_leader_and_a_worker_profile(tmp_path):
    recipe, _, _ = _render(tmp_path)
    config = _compose_config(tmp_path, "--profile", "worker", API_KEY_FILE="/srv/api-key",
                             IMGFAB_LEADER_ADDRESS="10.0.0.7")
    leader = config["services"][recipe.name]
    worker = config["services"][f"{recipe.name}-worker"]
    assert "profiles" not in leader and worker["profiles"] == ["worker"]
    assert leader["environment"]["IMGFAB_ROLE"] == "leader"
    assert worker["environment"]["IMGFAB_ROLE"] == "worker"
    assert worker["environment"]["IMGFAB_LEADER_ADDRESS"] == "10.0.0.7"
    assert "IMGFAB_LEADER_ADDRESS" not in leader["environment"]
    for service in (leader, worker):
        assert service["network_mode"] == "host" and "ports" not in service
        assert service["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 8
        assert service["read_only"] is True and service["shm_size"] == "64g"
        assert service["environment"]["IMGFAB_RAY_WAIT_S"] == "600"
    assert leader["secrets"] == [{"source": "api_key", "target": "imgfab-api-key"}]
    assert "secrets" not in worker
    assert config["secrets"] == {"api_key": {"file": "/srv/api-key"}}
    # a worker host sets neither the key nor anything but the leader's address
    bare = _compose_config(tmp_path, "--profile", "worker", IMGFAB_LEADER_ADDRESS="10.0.0.7")
    assert bare["services"][f"{recipe.name}-worker"]["environment"]["IMGFAB_LEADER_ADDRESS"] == "10.0.0.7"


def test_entrypoint_passes_imgfab_ray_args_to_ray_start(tmp_path):
    _render(tmp_path)
    extra = {"IMGFAB_RAY_ARGS": "--num-cpus=1  --object-store-memory=104857600"}
    _, worker = _entry(tmp_path, "worker", LWS_LEADER_ADDRESS="lws-0.lws", **extra)
    assert worker[-1][-2:] == ["--num-cpus=1", "--object-store-memory=104857600"]
    _, leader = _entry(tmp_path, "leader", **extra)
    assert leader[1][1:] == ["start", "--head", "--port=6379", "--num-gpus=8",
                             "--disable-usage-stats", "--num-cpus=1", "--object-store-memory=104857600"]


def test_a_multinode_payload_adds_ray_and_a_single_node_one_does_not(matrix):
    # vLLM's wheels do not require ray (the Requires-Dist of tests/fixtures/wheel_metadata), but
    # the leader's `ray start --head` and the Ray executor need it in the image.
    from imgfab.payload.lock import requirement_pins
    from imgfab.recipe import parse_recipe
    from imgfab.stack.resolve import resolve

    metadata = (REPO / "tests/fixtures/wheel_metadata/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl.METADATA")
    assert not [l for l in metadata.read_text().splitlines()
                if l.startswith("Requires-Dist: ray")]
    multinode = resolve(parse_recipe(copy.deepcopy(RECIPE_405B)), matrix).stack
    assert "ray[cgraph]" in requirement_pins(multinode)
    single = yaml.safe_load((REPO / "recipes/qwen2-7b-h100.yaml").read_text())
    assert not [p for p in requirement_pins(resolve(parse_recipe(single), matrix).stack) if p.startswith("ray")]
