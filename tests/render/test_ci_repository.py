"""`imgfab ci github` for a team's own recipes repository (issue 37, items 1 and 5): a pinned
imgfab install, triggers on the recipes and what they build with, locks refused as bake
refuses them, the containerd image store for zstd, literal-block scripts, a GPU smoke of each
vLLM candidate before release, and a workflow actionlint and zizmor find nothing in."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from test_bake_ci import _actionlint, imgfab

VLLM = REPO / "recipes" / "qwen2-7b-h100.yaml"
VERSION = "0.9.1"
SHA256 = "0123456789abcdef" * 4
RELEASE = ("--imgfab-version", VERSION, "--imgfab-sha256", SHA256)


def _scratch(tmp_path: Path, *, compression: str | None = None, lock: bool = True) -> Path:
    """A repository holding only recipes/<a vLLM example> and (``lock``) its lock."""
    root = tmp_path / "models"
    (root / "recipes").mkdir(parents=True)
    text = VLLM.read_text(encoding="utf-8")
    if compression:
        text = text.replace("\n  shm_size: 16g\n", f"\n  shm_size: 16g\n  compression: {compression}\n")
        assert f"compression: {compression}" in text
    (root / "recipes" / VLLM.name).write_text(text, encoding="utf-8")
    if lock:
        shutil.copy(VLLM.with_suffix(".lock"), root / "recipes" / VLLM.with_suffix(".lock").name)
    return root


def _workflow(root: Path, *args: str) -> tuple[str, dict]:
    result = imgfab("ci", "github", *args, cwd=root)
    assert result.returncode == 0, result.stderr
    return result.stdout, yaml.safe_load(result.stdout)


def _steps(job: dict) -> dict[str, dict]:
    return {step.get("name", step.get("uses")): step for step in job["steps"]}


def _one_line(result: subprocess.CompletedProcess, field: str) -> str:
    assert result.returncode == 2, (result.stdout[:200], result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"imgfab: {field}: ") and "; fix: " in line, line
    return line


def test_the_install_step_names_the_pinned_release(tmp_path):
    _, workflow = _workflow(_scratch(tmp_path), *RELEASE)
    for name, job in workflow["jobs"].items():
        (install,) = [s for s in job["steps"] if s.get("name", "").startswith("Install")]
        assert install["env"] == {"IMGFAB_VERSION": "0.9.1", "IMGFAB_SHA256": SHA256}, name
        script = install["run"]
        assert ('python -m pip download --no-deps --only-binary :all: "imgfab==$IMGFAB_VERSION"'
                in script)
        assert 'echo "$IMGFAB_SHA256  $1" | sha256sum -c -' in script
        # the checked file is the one installed, after the check
        assert script.index("sha256sum -c") < script.index('python -m pip install "$1"')
        assert "pip install ." not in script


def test_the_release_install_refuses_a_wheel_with_another_hash(tmp_path):
    """The script as a shell runs it: a wrong hash stops it before pip installs anything."""
    from imgfab.render.ci import INSTALL_RELEASE

    shims = tmp_path / "bin"
    shims.mkdir()
    log = tmp_path / "pip.log"
    # `python -m pip download ... -d DIR` writes a wheel; `install` is logged
    (shims / "python").write_text(
        '#!/bin/sh\necho "$@" >> "$LOG"\n'
        'if [ "$3" = download ]; then eval "d=\\${$#}"; mkdir -p "$d"; '
        'printf wheel > "$d/imgfab-0.9.1-py3-none-any.whl"; fi\n')
    (shims / "python").chmod(0o755)
    good = subprocess.run(["sha256sum"], input=b"wheel", capture_output=True).stdout.split()[0].decode()
    for sha, installed in ((good, True), (SHA256, False)):
        log.write_text("")
        ran = subprocess.run(["bash", "-e", "-c", INSTALL_RELEASE], capture_output=True, text=True,
                             env={"PATH": f"{shims}:/usr/bin:/bin", "LOG": str(log),
                                  "RUNNER_TEMP": str(tmp_path / f"t{installed}"),
                                  "IMGFAB_VERSION": VERSION, "IMGFAB_SHA256": sha})
        assert (ran.returncode == 0) == installed, ran.stderr
        assert ("-m pip install" in log.read_text()) == installed, log.read_text()


def test_the_path_install_and_the_triggers(tmp_path):
    root = _scratch(tmp_path)
    (root / "vendor" / "imgfab").mkdir(parents=True)
    shutil.copytree(REPO / "compat", root / "compat")  # the lock is checked against it
    _, workflow = _workflow(root, "--imgfab-path", "vendor/imgfab", "--compat-dir", "compat")
    assert workflow["on"]["pull_request"]["paths"] == [
        ".github/workflows/images.yml", "compat/**", "recipes/**", "vendor/imgfab/**"]
    build = workflow["jobs"]["build"]
    steps = _steps(build)
    assert steps["Install imgfab from its path"]["env"] == {"IMGFAB_PATH": "vendor/imgfab"}
    assert steps["Install imgfab from its path"]["run"] == 'python -m pip install "./$IMGFAB_PATH"'
    assert build["env"] == {"IMGFAB_COMPAT_DIR": "compat"}
    assert steps["Check the lock's hashes against the index"]["run"] == \
        'imgfab lock --check --online "$RECIPE" --compat-dir "$IMGFAB_COMPAT_DIR"'
    assert steps["Build and verify (no push)"]["run"].startswith(
        'imgfab build "$RECIPE" --compat-dir "$IMGFAB_COMPAT_DIR"')
    _, released = _workflow(root, *RELEASE)
    assert released["on"]["pull_request"]["paths"] == [".github/workflows/images.yml", "recipes/**"]


@pytest.mark.parametrize("args, field", [
    ((), "--imgfab-version"),
    ((*RELEASE, "--imgfab-path", "."), "--imgfab-version"),
    (("--imgfab-version", VERSION), "--imgfab-sha256"),
    (("--imgfab-version", "0.9.1;id", "--imgfab-sha256", SHA256), "--imgfab-version"),
    (("--imgfab-version", "${{ github.token }}", "--imgfab-sha256", SHA256), "--imgfab-version"),
    (("--imgfab-version", VERSION, "--imgfab-sha256", SHA256.upper()), "--imgfab-sha256"),
    (("--imgfab-version", VERSION, "--imgfab-sha256", SHA256 + "\n"), "--imgfab-sha256"),
    (("--imgfab-path", "../imgfab"), "--imgfab-path"),
    (("--imgfab-path", "/abs"), "--imgfab-path"),
    (("--imgfab-path", "recipes/$(id)"), "--imgfab-path"),
])
def test_the_install_is_named_exactly_once_and_checked(tmp_path, args, field):
    root = _scratch(tmp_path)
    line = _one_line(imgfab("ci", "github", *args, cwd=root), field)
    assert "${{" not in line and "$(id)" not in line


def test_a_recipe_without_a_lock_is_refused_as_bake_refuses_it(tmp_path):
    root = _scratch(tmp_path, lock=False)
    for args in ((), ("recipes/qwen2-7b-h100.yaml",)):  # the default glob, and named
        line = _one_line(imgfab("ci", "github", *RELEASE, *args, cwd=root), "lock")
        assert line == ("imgfab: lock: recipes/qwen2-7b-h100.lock is missing; fix: run "
                        "`imgfab lock recipes/qwen2-7b-h100.yaml` and commit the lock")
    bake = imgfab("bake", "recipes/qwen2-7b-h100.yaml", "-o", str(tmp_path / "bake.json"), cwd=root)
    assert bake.returncode == 2 and "lock" in bake.stderr  # the two commands agree


def test_a_stale_lock_is_refused(tmp_path):
    root = _scratch(tmp_path)
    lock = root / "recipes" / VLLM.with_suffix(".lock").name
    text = lock.read_text()
    at = text.index("--hash=sha256:") + len("--hash=sha256:")
    lock.write_text(text[:at] + ("0" if text[at] != "0" else "1") + text[at + 1:])  # one pin edited
    line = _one_line(imgfab("ci", "github", *RELEASE, cwd=root), "lock")
    assert "recipes/qwen2-7b-h100.lock is stale or edited" in line


@pytest.mark.parametrize("compression, store", [(None, True), ("zstd", True), ("gzip", False)])
def test_zstd_jobs_switch_to_the_containerd_image_store(tmp_path, compression, store):
    _, workflow = _workflow(_scratch(tmp_path, compression=compression), *RELEASE,
                            "--gpu-runner", "gpu-h100")
    for name, job in workflow["jobs"].items():
        steps = _steps(job)
        step = steps.get("Use the containerd image store (zstd layers)")
        wanted = store and name != "release"  # release only copies by digest: no engine
        assert (step is not None) == wanted, name
        if step is None:
            continue
        names = list(steps)
        building = [n for n in names if n.startswith(("Build", "Smoke"))]
        assert building and names.index(step["name"]) < names.index(building[0]), name
        script = step["run"]
        assert """jq '. * {"features": {"containerd-snapshotter": true}}'""" in script
        assert "sudo systemctl restart docker" in script
        assert "docker info --format '{{ .DriverStatus }}'" in script
        assert script.rstrip().endswith("exit 1; fi")  # fails when the store did not change


def test_multi_line_scripts_are_literal_blocks(tmp_path):
    text, workflow = _workflow(_scratch(tmp_path), *RELEASE)
    assert "\\n" not in text  # no quoted one-line script
    assert ("      run: |-\n"
            "        sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc /opt/hostedtoolcache/CodeQL\n"
            "        docker image prune --all --force\n") in text
    assert ("        path: |-\n"
            "          imgfab-report.json\n"
            "          build/${{ matrix.name }}/deploy/\n") in text


def test_the_dumper_loads_back_what_it_dumped():
    from imgfab.render.ci import dump_workflow

    data = {"a": "one\ntwo\n", "b": "no newline", "c": ["x\ny", "trailing space \nz"],
            "d": "tab\there\nand\x07bell", "e": "  indented\nfirst\n\n"}
    text = dump_workflow(data)
    assert yaml.safe_load(text) == data
    assert "a: |\n  one\n  two\n" in text and "b: no newline\n" in text
    assert dump_workflow(data) == text


def test_the_gpu_smoke_gates_the_release_of_vllm_recipes(tmp_path):
    text, workflow = _workflow(_scratch(tmp_path), *RELEASE, "--gpu-runner", "gpu-h100")
    smoke = workflow["jobs"]["smoke"]
    assert smoke["runs-on"] == ["self-hosted", "gpu-h100"] and smoke["needs"] == "candidate"
    assert "refs/tags/v" in smoke["if"]
    assert smoke["permissions"] == {"contents": "read", "packages": "read"}
    assert [row["name"] for row in smoke["strategy"]["matrix"]["include"]] == ["qwen2-7b-h100"]
    steps = _steps(smoke)
    download = next(s for s in smoke["steps"] if s.get("uses", "").startswith("actions/download-artifact@"))
    assert download["with"] == {"name": "imgfab-report-${{ matrix.name }}"}
    script = steps["Smoke the staged digest on the GPU (synthetic model, every run shape)"]["run"]
    assert "staged=$(jq -r '.images[0].pushed' imgfab-report.json)" in script
    assert 'imgfab smoke "$staged" --synthetic-model --shape all --json > imgfab-smoke.json' in script
    assert "Keep this run's registry login to this run" in steps  # a self-hosted runner's ~/.docker
    assert workflow["jobs"]["release"]["needs"] == ["candidate", "smoke"]
    assert "# GPU smoke: each vLLM candidate" in text
    _, without = _workflow(_scratch(tmp_path / "b"), *RELEASE)
    assert "smoke" not in without["jobs"] and without["jobs"]["release"]["needs"] == "candidate"


def test_smoke_takes_the_options_the_workflow_passes():
    help_text = imgfab("smoke", "--help").stdout
    for option in ("--synthetic-model", "--shape", "--json"):
        assert option in help_text
    assert "[runsh|compose|k8s|all]" in help_text


ZIZMOR = shutil.which("zizmor") or str(Path(__import__("sys").executable).parent / "zizmor")


@pytest.mark.parametrize("runner", [None, "gpu-h100"])
def test_the_scratch_repository_workflow_passes_actionlint_and_zizmor(tmp_path, runner):
    root = _scratch(tmp_path)
    text, _ = _workflow(root, *RELEASE, *(("--gpu-runner", runner) if runner else ()))
    problems = [p for p in _actionlint(tmp_path, text)
                if not (runner and p["kind"] == "runner-label" and f'"{runner}"' in p["message"])]
    assert problems == []
    path = root / ".github" / "workflows" / "images.yml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    ran = subprocess.run([ZIZMOR, "--offline", "--format", "json", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr  # zizmor exits non-zero on findings
    assert json.loads(ran.stdout) == []
