"""CI pipeline definitions that build the recipe matrix with imgfab itself.

:func:`github_workflow` returns a GitHub Actions workflow (YAML text):

- ``build``: pull requests (and changes to recipes, compat data, templates or imgfab) build
  and verify every recipe, read-only (``contents: read``), pushing nothing;
- ``release``: ``v*`` tags build and push (``imgfab build --push --json``); only this job gets
  ``packages: write``;
- TensorRT engine recipes compile on a GPU: with ``gpu_runner`` they run on the self-hosted
  runner with that label (two-phase compile), without one they build with
  ``--engine-at-start`` on GitHub's runners (the engine compiles on the serving host);
- GHCR wants ``ghcr.io/<owner>/<repository>``: with ``registry="ghcr.io"`` the jobs push under
  the repository owner (lower-cased) and log in with the job's ``GITHUB_TOKEN``; any other
  registry uses the ``IMGFAB_REGISTRY_USER`` / ``IMGFAB_REGISTRY_PASSWORD`` secrets;
- a vLLM image is about 11 GB and the build holds it about twice (builder venv, runtime copy):
  more than a standard runner's free disk, so the jobs first delete the runner's preinstalled
  toolchains they never use.

Every job uploads its JSON report as an artifact. The workflow is checked by actionlint in
the tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from imgfab.errors import RecipeError

TAG_PUSH = "github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v')"
REPORT = "imgfab-report.json"
# What the standard ubuntu-latest image preinstalls and an image build never uses (about
# 30 GB: .NET, Android SDK, GHC, CodeQL bundles, the cached Docker images).
FREE_DISK = ("sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc "
             "/opt/hostedtoolcache/CodeQL\n"
             "docker image prune --all --force\n"
             "df -h / /var/lib/docker")
# Paths whose change can change an image: the workflow also runs when it changes itself.
WATCHED = ["recipes/**", "compat/**", "templates/**", "src/**", "pyproject.toml",
           ".github/workflows/**"]


def recipe_matrix(recipes: list[str] | None) -> list[dict[str, str]]:
    """``[{"name": stem, "recipe": path, "engine": "true"|"false"}]`` for ``recipes``
    (default: ``recipes/*.yaml``). ``engine`` says the recipe compiles a TensorRT engine."""
    from imgfab.recipe import load_recipe  # noqa: PLC0415

    paths = sorted(recipes) if recipes else sorted(p.as_posix() for p in Path("recipes").glob("*.yaml"))
    rows = []
    for path in paths:
        recipe = load_recipe(path)
        rows.append({"name": Path(path).stem, "recipe": Path(path).as_posix(),
                     "engine": "true" if recipe.backend.trtllm_path == "engine" else "false"})
    return rows


def _registry_steps(registry: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Steps that set IMGFAB_REGISTRY (and log in), and the env the push step needs."""
    if registry == "ghcr.io":
        env = {"IMGFAB_REGISTRY_USER": "${{ github.actor }}",
               "IMGFAB_REGISTRY_PASSWORD": "${{ secrets.GITHUB_TOKEN }}"}
        set_registry = {"name": "Registry: ghcr.io/<owner>",
                        "env": {"OWNER": "${{ github.repository_owner }}"},
                        "run": 'echo "IMGFAB_REGISTRY=ghcr.io/${OWNER,,}" >> "$GITHUB_ENV"'}
        host = "ghcr.io"
    else:
        env = {"IMGFAB_REGISTRY_USER": "${{ secrets.IMGFAB_REGISTRY_USER }}",
               "IMGFAB_REGISTRY_PASSWORD": "${{ secrets.IMGFAB_REGISTRY_PASSWORD }}"}
        set_registry = {"name": f"Registry: {registry}",
                        "run": f'echo "IMGFAB_REGISTRY={registry}" >> "$GITHUB_ENV"'}
        host = registry.split("/", 1)[0]
    login = {"name": "Log in to the registry", "env": env,
             "run": f'printf \'%s\' "$IMGFAB_REGISTRY_PASSWORD" | docker login {host} '
                    '--username "$IMGFAB_REGISTRY_USER" --password-stdin'}
    return [set_registry, login], env


def _job(matrix: list[dict[str, str]], *, push: bool, runs_on: Any, engine_at_start: bool,
         registry: str, python: str) -> dict[str, Any]:
    build = 'imgfab build "$RECIPE"' + (" --engine-at-start" if engine_at_start else "")
    steps: list[dict[str, Any]] = [
        {"uses": "actions/checkout@v4"},
        {"uses": "actions/setup-python@v5", "with": {"python-version": python}},
        {"name": "Install imgfab", "run": "python -m pip install ."},
    ]
    if runs_on == "ubuntu-latest":
        steps.append({"name": "Free the runner's disk for a multi-GB image", "run": FREE_DISK})
    env = {"RECIPE": "${{ matrix.recipe }}"}
    if push:
        registry_steps, secret_env = _registry_steps(registry)
        steps += registry_steps
        env |= secret_env
        run = build + ' --push --registry-user "$IMGFAB_REGISTRY_USER" --json > ' + REPORT
        steps.append({"name": "Build, verify and push", "env": env, "run": run})
    else:
        steps.append({"name": "Build and verify (no push)", "env": env,
                      "run": build + " --json > " + REPORT})
    steps.append({"name": "Upload the build report", "if": "always()",
                  "uses": "actions/upload-artifact@v4",
                  "with": {"name": "imgfab-report-${{ matrix.name }}", "path": REPORT,
                           "if-no-files-found": "warn"}})
    return {
        "name": "${{ matrix.name }}",
        "if": TAG_PUSH if push else f"!({TAG_PUSH})",
        "runs-on": runs_on,
        "timeout-minutes": 180 if runs_on != "ubuntu-latest" else 120,
        "permissions": {"contents": "read", "packages": "write"} if push else {"contents": "read"},
        # Copies: a list shared between jobs would be dumped as a YAML alias, which Actions refuses.
        "strategy": {"fail-fast": False, "matrix": {"include": [dict(row) for row in matrix]}},
        "steps": steps,
    }


def github_workflow_dict(recipes: list[str] | None = None, *, registry: str = "ghcr.io",
                         python: str = "3.11", gpu_runner: str | None = None) -> dict[str, Any]:
    """The workflow as a dict (see :func:`github_workflow`)."""
    if gpu_runner is not None and (not gpu_runner or not all(c.isalnum() or c in "-_." for c in gpu_runner)):
        raise RecipeError(f"runner label {gpu_runner!r} is not a plain label", field="--gpu-runner",
                          fix="a self-hosted runner label of [A-Za-z0-9._-], e.g. gpu-h100")
    rows = recipe_matrix(recipes)
    plain = [r for r in rows if r["engine"] == "false"]
    engines = [r for r in rows if r["engine"] == "true"]
    jobs: dict[str, Any] = {}
    for push, prefix in ((False, "build"), (True, "release")):
        if plain:
            jobs[prefix] = _job(plain, push=push, runs_on="ubuntu-latest", engine_at_start=False,
                                registry=registry, python=python)
        if engines:
            jobs[f"{prefix}-engines"] = _job(
                engines, push=push, runs_on=["self-hosted", gpu_runner] if gpu_runner else "ubuntu-latest",
                engine_at_start=gpu_runner is None, registry=registry, python=python)
    return {
        "name": "imgfab images",
        "on": {"push": {"tags": ["v*"]}, "pull_request": {"paths": WATCHED}},
        "permissions": {"contents": "read"},
        "concurrency": {"group": "imgfab-${{ github.ref }}", "cancel-in-progress": True},
        "env": {"DOCKER_BUILDKIT": "1"},
        "jobs": jobs,
    }


def github_workflow(recipes: list[str] | None = None, *, registry: str = "ghcr.io",
                    python: str = "3.11", gpu_runner: str | None = None) -> str:
    """The workflow as YAML text, for ``.github/workflows/images.yml``. Deterministic."""
    text = yaml.safe_dump(github_workflow_dict(recipes, registry=registry, python=python,
                                               gpu_runner=gpu_runner),
                          sort_keys=False, width=100, default_flow_style=False)
    return "# Generated by `imgfab ci github`; regenerate instead of editing.\n" + text
