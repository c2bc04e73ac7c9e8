"""Multi-node serving (issue 22, target.nodes): vLLM on Ray, tp within a node and pp across
nodes; a LeaderWorkerSet validated against the LWS CRD's own schema; the entrypoint's leader and
worker roles run with stubs; the leader's bounded wait; TensorRT-LLM across nodes refused.

Issue 34 (Ray and secrets): every node runs Ray with token authentication (ray 2.55.1 and 2.60.0,
read in their PyPI wheels: ``RAY_AUTH_MODE=token`` and the token file ``RAY_AUTH_TOKEN_PATH``, which
``_raylet.so`` reads after ``RAY_AUTH_TOKEN``; ``ray start`` calls
``ensure_token_if_auth_enabled(..., create_token_if_missing=False)``, so a node without the token
does not start), the token from a file only, the head's dashboard off; the API key never in a
``VLLM_*`` variable (vLLM's Ray executor copies those to every worker) and never mounted on a
worker; NetworkPolicies admit Ray's ports only from the group and the serving port from clients.

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
    # R535 under forward-compat (issue 34: minor-compat reaches only vLLM 0.19.1, inside the
    # critical CVE-2026-48746; forward compatibility runs 0.33.0)
    "target": {"gpu": "H100-SXM", "count": 8, "pipeline_parallel": 2, "nodes": 2,
               "driver": ">=535.104.05", "driver_policy": "forward-compat"},
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
                "nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "kubernetes.io/arch": "amd64"}
        assert _node_matches(terms, node)
        assert not _node_matches(terms, dict(node, **{"nvidia.com/gpu.count": "4"}))
        # a GH200 node: a Hopper GPU that passes every GPU rule, on an arm64 Grace CPU
        assert not _node_matches(terms, dict(node, **{"kubernetes.io/arch": "arm64"}))
        assert all({"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                   in term["matchExpressions"] for term in terms)
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
        assert other["tolerations"] == pod["tolerations"]
        # the same volumes, and Ray's token; a worker has no API key (issue 34)
        volumes = [v for v in other["volumes"] if v["name"] != "ray-token"]
        expected = [v for v in pod["volumes"] if role == "leaderTemplate" or v["name"] != "api-key"]
        assert volumes == expected


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


# The Ray cluster token the tests' nodes share, in a file (never on a command line).
RAY_TOKEN = "ray-token-5f1c0d9e"


def _entry(tmp_path: Path, role: str | None, wait_exit: int = 0, *, token: str | None = RAY_TOKEN,
           **extra: str):
    """Run the rendered entrypoint with recording stubs for the probe, ray, python3 (the
    cluster wait, exiting ``wait_exit``) and vllm, the API key file mounted unless ``extra``
    says otherwise; (result, the calls as argv lists). Each stub also writes its environment to
    ``tmp_path/env-<name>`` (see :func:`_env_of`). ``token``: the content of the Ray token file
    IMGFAB_RAY_TOKEN_FILE names (None: no such file)."""
    import os

    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for name in ("imgfab-probe", "ray", "python3", "vllm"):
        recorder = RECORDER.replace("exit 0", f'env > "$STUB_ENV-{name}"\nexit 0')
        (stubs / name).write_text(recorder.replace("exit 0", f"exit {wait_exit}")
                                  if name == "python3" else recorder)
        (stubs / name).chmod(0o755)
    log = tmp_path / "calls"
    log.unlink(missing_ok=True)
    for old in tmp_path.glob("env-*"):
        old.unlink()
    token_file = tmp_path / "ray-token"
    token_file.unlink(missing_ok=True)
    if token is not None:
        token_file.write_text(token + "\n")
    key = tmp_path / "mounted-api-key"
    key.write_text("k-123\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("IMGFAB_ROLE", "IMGFAB_LEADER_ADDRESS", "LWS_LEADER_ADDRESS", "IMGFAB_PRESET",
                        "IMGFAB_ALLOW_UNAUTHENTICATED")
           and not k.startswith(("RAY_", "VLLM_"))}
    env |= {"PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log),
            "STUB_ENV": str(tmp_path / "env"), "IMGFAB_RAY_TOKEN_FILE": str(token_file),
            "IMGFAB_API_KEY_FILE": str(key), **extra}
    if role:
        env["IMGFAB_ROLE"] = role
    result = subprocess.run(["bash", str(tmp_path / "ctx" / "entrypoint.sh")], env=env,
                            capture_output=True, text=True, timeout=60)
    records = log.read_text().split("\x1e")[:-1] if log.exists() else []
    return result, [r.split("\x1f")[:-1] for r in records]


def _env_of(tmp_path: Path, name: str) -> dict[str, str]:
    """The environment the stub ``name`` was last started with (by :func:`_entry`)."""
    lines = (tmp_path / f"env-{name}").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_entrypoint_leader_waits_for_the_cluster_then_serves_on_ray(tmp_path):
    _render(tmp_path)
    result, records = _entry(tmp_path, None)
    assert result.returncode == 0, result.stderr
    names = [r[0] for r in records]
    assert names == ["imgfab-probe", "ray", "python3", "vllm"]
    assert records[1][1:] == ["start", "--head", "--port=6379", "--num-gpus=8", "--disable-usage-stats",
                              "--include-dashboard=false"]  # the dashboard (job submission): off
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

def _run_sh(tmp_path: Path, *args: str, token: bool = True, **extra: str):
    """Run the rendered run.sh with a recording ``docker``; (result, its docker argv or None).
    ``token``: RAY_TOKEN_FILE names ``tmp_path/ray-token``, holding :data:`RAY_TOKEN`."""
    import os

    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    (stubs / "docker").write_text(RECORDER)
    (stubs / "docker").chmod(0o755)
    log = tmp_path / "docker-calls"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGFAB_")
           and k not in ("API_KEY_FILE", "WEIGHTS_DIR", "HOST_PORT", "HOST_ADDR", "RAY_TOKEN_FILE", "IMAGE")}
    if token:
        (tmp_path / "ray-token").write_text(RAY_TOKEN + "\n")
        env["RAY_TOKEN_FILE"] = str(tmp_path / "ray-token")
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
                    "--pull", "never",  # no registry: the image built here, never Docker Hub's
                    "--gpus", "count=8", *_common_argv(recipe),  # one node's 8 GPUs, not 16
                    "--env", "IMGFAB_ROLE=leader",
                    "--mount", f"type=bind,source={key},target=/run/secrets/imgfab-api-key,readonly",
                    # Ray's cluster token: a read-only file, on every node
                    "--mount", f"type=bind,source={tmp_path / 'ray-token'},target=/run/secrets/imgfab-ray-token,readonly",
                    "--env", "IMGFAB_RAY_WAIT_S", "--env", "IMGFAB_RAY_ARGS", "--env", "IMGFAB_NODE_ADDRESS", image]
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
    assert argv[:8] == ["docker", "run", "--rm", "--name", f"{recipe.name}-worker", "--pull", "never", "--gpus"]
    tail = argv[argv.index("IMGFAB_PRESET=chat") + 5:]
    assert tail[:4] == ["--env", "IMGFAB_ROLE=worker", "--env", "IMGFAB_LEADER_ADDRESS=10.0.0.7"]
    assert not any("imgfab-api-key" in a for a in argv)
    assert tail[4:6] == ["--mount", f"type=bind,source={tmp_path / 'ray-token'},"
                                    "target=/run/secrets/imgfab-ray-token,readonly"]
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
           and k not in ("API_KEY_FILE", "RAY_TOKEN_FILE")} | {"WEIGHTS_DIR": "/srv/weights", **extra}
    result = subprocess.run([compose, "-f", str(tmp_path / "ctx" / "compose.yaml"), *args, "config"],
                            env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_renders_a_leader_and_a_worker_profile(tmp_path):
    recipe, _, _ = _render(tmp_path)
    config = _compose_config(tmp_path, "--profile", "worker", API_KEY_FILE="/srv/api-key",
                             IMGFAB_LEADER_ADDRESS="10.0.0.7", RAY_TOKEN_FILE="/srv/ray-token")
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
    ray_token = {"source": "ray_token", "target": "imgfab-ray-token"}
    assert leader["secrets"] == [{"source": "api_key", "target": "imgfab-api-key"}, ray_token]
    assert worker["secrets"] == [ray_token]  # every node has Ray's token; a worker no API key
    assert config["secrets"] == {"api_key": {"file": "/srv/api-key"}, "ray_token": {"file": "/srv/ray-token"}}
    # a worker host sets no key, only the leader's address and Ray's token
    bare = _compose_config(tmp_path, "--profile", "worker", IMGFAB_LEADER_ADDRESS="10.0.0.7",
                           RAY_TOKEN_FILE="/srv/ray-token")
    assert bare["services"][f"{recipe.name}-worker"]["environment"]["IMGFAB_LEADER_ADDRESS"] == "10.0.0.7"


def test_entrypoint_passes_imgfab_ray_args_to_ray_start(tmp_path):
    _render(tmp_path)
    extra = {"IMGFAB_RAY_ARGS": "--num-cpus=1  --object-store-memory=104857600"}
    _, worker = _entry(tmp_path, "worker", LWS_LEADER_ADDRESS="lws-0.lws", **extra)
    assert worker[-1][-2:] == ["--num-cpus=1", "--object-store-memory=104857600"]
    _, leader = _entry(tmp_path, "leader", **extra)
    assert leader[1][1:] == ["start", "--head", "--port=6379", "--num-gpus=8", "--disable-usage-stats",
                             "--include-dashboard=false", "--num-cpus=1", "--object-store-memory=104857600"]


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
    # at least the first ray with token authentication (2.52.0), which every node turns on
    assert "ray[cgraph]>=2.52.0" in requirement_pins(multinode)
    single = yaml.safe_load((REPO / "recipes/qwen2-7b-h100.yaml").read_text())
    assert not [p for p in requirement_pins(resolve(parse_recipe(single), matrix).stack) if p.startswith("ray")]


# --- issue 34: Ray's token on every node, the API key on the API server only, the network ----

@pytest.mark.parametrize("role", ["leader", "worker"])
def test_every_node_runs_ray_with_token_authentication_from_a_file(tmp_path, role):
    _render(tmp_path)
    extra = {"LWS_LEADER_ADDRESS": "lws-0.lws"} if role == "worker" else {}
    # a token in the environment would win over the file in Ray (RAY_AUTH_TOKEN first): dropped
    result, records = _entry(tmp_path, role, RAY_AUTH_TOKEN="env-token-0000", **extra)
    assert result.returncode == 0, result.stderr
    ran = [r[0] for r in records]
    assert "ray" in ran
    for name in {"ray", "python3", "vllm"} & set(ran):  # the node, the leader's wait, the server
        env = _env_of(tmp_path, name)
        assert env["RAY_AUTH_MODE"] == "token", name
        assert env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "ray-token"), name
        assert "RAY_AUTH_TOKEN" not in env and RAY_TOKEN not in env.values(), name
    assert not [r for r in records if any(RAY_TOKEN in arg for arg in r)]  # never on a command line


@pytest.mark.parametrize("token", [None, ""])
@pytest.mark.parametrize("role", ["leader", "worker"])
def test_a_node_without_the_ray_token_refuses_to_start_in_one_line(tmp_path, role, token):
    _render(tmp_path)
    result, records = _entry(tmp_path, role, token=token, LWS_LEADER_ADDRESS="lws-0.lws")
    assert result.returncode == 2
    assert [r[0] for r in records] == ["imgfab-probe"]  # no ray, no server
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"imgfab: no Ray cluster token at {tmp_path / 'ray-token'}: mount the same token file")


def test_the_node_address_is_what_ray_advertises_on_both_roles(tmp_path):
    _render(tmp_path)
    _, leader = _entry(tmp_path, "leader", IMGFAB_NODE_ADDRESS="10.1.2.3")
    assert "--node-ip-address=10.1.2.3" in leader[1]
    _, worker = _entry(tmp_path, "worker", LWS_LEADER_ADDRESS="lws-0.lws", IMGFAB_NODE_ADDRESS="10.1.2.4")
    assert "--node-ip-address=10.1.2.4" in worker[-1]


def test_the_api_key_reaches_no_vllm_variable_and_no_ray_process(tmp_path):
    # vLLM's Ray executor copies every VLLM_* variable of the server to each worker: across
    # nodes the key stays in its file, which the API server reads (IMGFAB_API_KEY_FILE).
    _render(tmp_path)
    key = tmp_path / "api-key"
    key.write_text("sk-issue34-leader-only\n")
    result, records = _entry(tmp_path, "leader", IMGFAB_API_KEY_FILE=str(key),
                             VLLM_API_KEY="sk-issue34-from-the-environment")
    assert result.returncode == 0, result.stderr
    assert "VLLM_API_KEY is ignored across nodes" in result.stderr
    for name in ("ray", "python3", "vllm"):
        env = _env_of(tmp_path, name)
        assert not [k for k, v in env.items() if "sk-issue34" in v], name
        assert not [k for k in env if k.startswith("VLLM_") and "KEY" in k], name
    assert _env_of(tmp_path, "vllm")["IMGFAB_API_KEY_FILE"] == str(key)
    assert not [r for r in records if any("sk-issue34" in arg for arg in r)]
    key.write_text("")  # an empty key file is refused, as on one node
    empty, _ = _entry(tmp_path, "leader", IMGFAB_API_KEY_FILE=str(key))
    assert empty.returncode == 2 and "is empty" in empty.stderr


def test_run_sh_needs_the_ray_token_file_on_both_roles(tmp_path):
    _render(tmp_path)
    key = tmp_path / "api-key"
    key.write_text("k-123")
    for args in (("leader",), ("worker", "10.0.0.7")):
        result, argv = _run_sh(tmp_path, *args, token=False, WEIGHTS_DIR="/srv/weights", API_KEY_FILE=str(key))
        assert result.returncode != 0 and argv is None, args
        assert "RAY_TOKEN_FILE" in result.stderr, args
        empty = tmp_path / "empty-token"
        empty.write_text("")
        result, argv = _run_sh(tmp_path, *args, token=False, WEIGHTS_DIR="/srv/weights",
                               API_KEY_FILE=str(key), RAY_TOKEN_FILE=str(empty))
        assert result.returncode == 2 and argv is None and "not a file with a token" in result.stderr, args


def _pods(lws: dict) -> dict[str, tuple[dict, dict]]:
    """role → (the pod's labels as LWS gives them to group 0, its spec)."""
    name = lws["metadata"]["name"]
    template = lws["spec"]["leaderWorkerTemplate"]
    base = {"leaderworkerset.sigs.k8s.io/name": name, "leaderworkerset.sigs.k8s.io/group-index": "0"}
    return {"leader": (template["leaderTemplate"]["metadata"]["labels"] | base
                       | {"leaderworkerset.sigs.k8s.io/worker-index": "0"}, template["leaderTemplate"]["spec"]),
            "worker": (template["workerTemplate"]["metadata"]["labels"] | base
                       | {"leaderworkerset.sigs.k8s.io/worker-index": "1"}, template["workerTemplate"]["spec"])}


def test_no_worker_pod_mounts_the_api_key_and_every_pod_mounts_the_ray_token(tmp_path):
    _, _, files = _render(tmp_path)
    docs = [d for d in yaml.safe_load_all(files["k8s.yaml"]) if d]
    (lws,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    pods = _pods(lws)
    secrets = {role: {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
               for role, (_, spec) in pods.items()}
    assert secrets == {"leader": {"llama31-405b-h100-api-key", "llama31-405b-h100-ray-token"},
                       "worker": {"llama31-405b-h100-ray-token"}}
    for role, (_, spec) in pods.items():
        mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert "/run/secrets/imgfab-ray-token" in mounts, role
        assert ("/run/secrets/imgfab-api-key" in mounts) == (role == "leader"), role
        assert not [e for e in spec["containers"][0]["env"] if "KEY" in e["name"] or "TOKEN" in e["name"]]


def _admitted(policies: list[dict], to: dict[str, str], source: dict[str, str], port: int) -> bool:
    """Whether a TCP connection from a pod labelled ``source`` to ``port`` of a pod labelled
    ``to`` is admitted, as the NetworkPolicy API defines it (a pod no policy selects takes all
    traffic; a selected pod takes what any selecting policy's ingress rules admit): the subset
    these policies use, podSelector matchLabels and ports."""
    def matches(selector: dict, labels: dict) -> bool:
        return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())

    selecting = [p for p in policies if matches(p["spec"]["podSelector"], to)
                 and "Ingress" in p["spec"]["policyTypes"]]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            ports = rule.get("ports")
            if (peers is None or any(matches(peer["podSelector"], source) for peer in peers)) and \
                    (ports is None or any(p["port"] == port for p in ports)):
                return True
    return False


def test_network_policies_admit_ray_only_from_the_group_and_serving_from_clients(tmp_path):
    _, _, files = _render(tmp_path)
    docs = [d for d in yaml.safe_load_all(files["k8s.yaml"]) if d]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    (lws,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    pods = _pods(lws)
    leader, worker = pods["leader"][0], pods["worker"][0]
    stranger = {"app": "anything-else"}
    other_group = worker | {"leaderworkerset.sigs.k8s.io/group-index": "1"}
    assert _admitted(policies, leader, worker, 6379) and _admitted(policies, worker, leader, 12345)
    assert not _admitted(policies, leader, stranger, 6379)       # the GCS: only the group
    assert not _admitted(policies, worker, stranger, 10001)       # a worker's Ray: only the group
    assert not _admitted(policies, leader, other_group, 6379)     # another replica's pods: no
    assert not _admitted(policies, other_group, worker, 6379)     # a scaled-up group stays closed
    assert _admitted(policies, leader, stranger, 8000)            # clients: the serving port
    assert not _admitted(policies, worker, stranger, 8000)        # which workers do not serve
    assert _admitted([], leader, stranger, 6379)  # the evaluator: no policy admits everything


def test_without_a_registry_k8s_names_an_image_no_registry_serves(tmp_path):
    _, _, files = _render(tmp_path)
    text = files["k8s.yaml"]
    images = {c["image"] for d in yaml.safe_load_all(text) if d and d["kind"] == "LeaderWorkerSet"
              for t in ("leaderTemplate", "workerTemplate")
              for c in d["spec"]["leaderWorkerTemplate"][t]["spec"]["containers"]}
    (image,) = images
    assert image.startswith("REGISTRY.invalid/llm/llama3.1-405b:vllm")
    assert "# NOT DEPLOYABLE AS RENDERED: no registry was given" in text
