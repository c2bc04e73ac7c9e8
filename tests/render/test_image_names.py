"""No rendered artifact names an image a runtime would look up on a registry the user did not
choose (issue 34, class 5).

Rendered without a registry, the run artifacts name the image as built here, ``llm/qwen2-7b:TAG``.
Docker and Kubernetes read such a bare name as ``docker.io/llm/qwen2-7b:TAG``: Docker Hub, where
anyone can publish it. So:

- k8s.yaml (a cluster pulls every image it runs) names it under ``REGISTRY.invalid``: ``.invalid``
  is reserved and never resolves (RFC 6761, section 6.4), so a pod of it fails to pull, and the
  file says so at its top; with a registry (``--registry``, ``image.registry``) or a pushed digest
  it names that;
- run.sh and compose.yaml run the image from the engine that built it: ``docker run --pull
  never`` and ``pull_policy: never`` (the Compose specification's "never": use the local image,
  fail if it is missing); an IMAGE the user names is pulled as docker would.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from conftest import REPO
from test_artifacts import BIN

RECIPE = REPO / "recipes" / "qwen2-7b-h200.yaml"


def _render(tmp_path, **options) -> tuple[dict[str, str], str]:
    from imgfab.matrix.compat import load_matrix
    from imgfab.recipe import load_recipe
    from imgfab.render.context import context_image, render_context, write_context
    from imgfab.stack.resolve import resolve

    matrix = load_matrix()
    recipe = load_recipe(RECIPE)
    files = render_context(recipe, resolve(recipe, matrix).stack, matrix, **options)
    write_context(files, tmp_path / "ctx", force=True)
    return files, f"{recipe.image.repository}:{context_image(files)['tag']}"


def _k8s_images(text: str) -> set[str]:
    return {c["image"] for d in yaml.safe_load_all(text) if d and d["kind"] == "Deployment"
            for c in d["spec"]["template"]["spec"]["containers"]}


def test_k8s_without_a_registry_names_one_that_never_resolves_and_says_so(tmp_path):
    files, local = _render(tmp_path)
    assert _k8s_images(files["k8s.yaml"]) == {f"REGISTRY.invalid/{local}"}
    head = files["k8s.yaml"].split("apiVersion", 1)[0]
    assert "# NOT DEPLOYABLE AS RENDERED: no registry was given, so the image is named\n" in head
    assert "--registry REGISTRY" in head
    # the placeholder is a reference docker and kubelet parse (host REGISTRY.invalid), so only
    # the pull fails, naming it
    from imgfab.docker.registry import ImageRef

    parsed = ImageRef.parse(f"REGISTRY.invalid/{local}")
    assert (parsed.host, parsed.repository) == ("REGISTRY.invalid", "llm/qwen2-7b")
    validate = shutil.which("kubernetes-validate") or str(BIN / "kubernetes-validate")
    checked = subprocess.run([validate, "--strict", str(tmp_path / "ctx" / "k8s.yaml")],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_k8s_names_the_registry_or_the_digest_it_is_given(tmp_path):
    files, local = _render(tmp_path, registry="registry.example:5000")
    assert _k8s_images(files["k8s.yaml"]) == {f"registry.example:5000/{local}"}
    assert "NOT DEPLOYABLE" not in files["k8s.yaml"] and "REGISTRY.invalid" not in files["k8s.yaml"]
    digest = "registry.example:5000/llm/qwen2-7b@sha256:" + "a" * 64
    bundle, _ = _render(tmp_path, image_ref=digest)
    assert _k8s_images(bundle["k8s.yaml"]) == {digest}
    assert "--pull" not in bundle["run.sh"] and "pull_policy" not in bundle["compose.yaml"]


def _docker_argv(tmp_path, **env) -> list[str]:
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    (stubs / "docker").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$STUB_LOG"\n')
    (stubs / "docker").chmod(0o755)
    key = tmp_path / "api-key"
    key.write_text("k-123")
    base = {k: v for k, v in os.environ.items() if k not in ("IMAGE", "HOST_ADDR", "HOST_PORT")}
    result = subprocess.run(["bash", str(tmp_path / "ctx" / "run.sh")], capture_output=True, text=True,
                            env=base | {"PATH": f"{stubs}:{os.environ['PATH']}", "STUB_LOG": str(tmp_path / "argv"),
                                        "WEIGHTS_DIR": "/srv/w", "API_KEY_FILE": str(key), **env})
    assert result.returncode == 0, result.stderr
    return (tmp_path / "argv").read_text().splitlines()


def test_run_sh_runs_the_local_image_from_this_engine_only(tmp_path):
    _, local = _render(tmp_path)
    argv = _docker_argv(tmp_path)
    assert argv[argv.index("--pull") + 1] == "never" and argv[-1] == local
    named = _docker_argv(tmp_path, IMAGE="registry.example/llm/qwen2-7b:v1")
    assert named[named.index("--pull") + 1] == "missing" and named[-1] == "registry.example/llm/qwen2-7b:v1"
    _render(tmp_path, registry="registry.example")
    remote = _docker_argv(tmp_path)
    assert "--pull" not in remote and remote[-1] == f"registry.example/{local}"


@pytest.mark.parametrize("registry, policy", [(None, "never"), ("registry.example", None)])
def test_compose_never_pulls_the_local_image(tmp_path, registry, policy):
    files, _ = _render(tmp_path, registry=registry)
    (service,) = yaml.safe_load(files["compose.yaml"])["services"].values()
    assert service.get("pull_policy") == policy


def test_render_says_when_no_registry_was_given(tmp_path):
    import sys

    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "IMGFAB_REGISTRY"}
    done = subprocess.run([sys.executable, "-m", "imgfab.cli", "render", str(RECIPE), "-o", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (f"imgfab: note: no registry given: {out}/k8s.yaml names the image under REGISTRY.invalid"
            in done.stderr)
    given = subprocess.run([sys.executable, "-m", "imgfab.cli", "render", str(RECIPE), "-o", str(out),
                            "--registry", "registry.example"], capture_output=True, text=True, env=env,
                           timeout=300)
    assert given.returncode == 0 and "no registry given" not in given.stderr
