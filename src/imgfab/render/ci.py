"""CI pipeline definitions that build the recipe matrix with imgfab itself.

:func:`github_workflow` returns a GitHub Actions workflow (YAML text):

- ``build``: pull requests (and changes to recipes, compat data, templates or imgfab) build
  and verify every recipe, read-only (``contents: read``), pushing nothing;
- ``candidate``: ``v*`` tags build, verify and push each image to the staging repository
  (``$IMGFAB_REGISTRY/staging/…``); its report (with the pushed digest) and its deploy bundle
  (SBOM, provenance) are uploaded as artifacts;
- ``release`` (needs ``candidate``): promotes the digest that passed, by digest (``imgfab
  promote``, ``oras cp``: never a rebuild), then signs the promoted reference keylessly and
  attests its SBOM and provenance with cosign (Fulcio certificate from the job's OIDC token,
  Rekor entry). Only this job gets ``id-token: write``; only the pushing jobs get
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

Every action is pinned by the commit of a release tag (:data:`ACTIONS`: the tag in a comment),
never by a movable tag. cosign is pinned to 2.5.0, the release the local stack verifies with
(cosign-installer's own default is a 3.x release, whose new bundle format 2.5 does not read
by default). The workflow is checked by actionlint in the tests.

Nothing from the command line is spliced into a script: every value a ``run:`` step uses
reaches its shell through ``env:`` (GitHub's "intermediate environment variable" guidance),
:func:`run_step` refuses a script holding ``${{``, and the values themselves (registry, recipe
paths and stems, runner label, Python version) are checked by :mod:`imgfab.render.ci_values`
before anything is rendered, so none of them can form an expression anywhere in the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from imgfab.render.ci_values import (check_python, check_recipe_path, check_recipe_stems,
                                     check_registry, check_runner_label)

TAG_PUSH = "github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v')"
REPORT = "imgfab-report.json"
# Actions by the commit of a release tag (read at the tags from each repository's git history).
ACTIONS = {
    "checkout": ("actions/checkout", "3d3c42e5aac5ba805825da76410c181273ba90b1", "v7.0.1"),
    "setup-python": ("actions/setup-python", "5fda3b95a4ea91299a34e894583c3862153e4b97", "v7.0.0"),
    "upload-artifact": ("actions/upload-artifact", "bbbca2ddaa5d8feaa63e36b76fdaad77386f024f", "v7.0.0"),
    "download-artifact": ("actions/download-artifact", "3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c", "v8.0.1"),
    "cosign-installer": ("sigstore/cosign-installer", "6f9f17788090df1f26f669e9d70d6ae9567deba6", "v4.1.2"),
    "setup-oras": ("oras-project/setup-oras", "38de303aac69abb66f3e6255b7198bff35f323e3", "v2.0.0"),
}
COSIGN_RELEASE = "v2.5.0"
ORAS_VERSION = "1.2.0"
# The staging repository the candidate job pushes to, under the registry.
STAGING = "staging"
# The comment each pinned `uses:` carries (yaml.safe_dump drops comments: added after dumping).
_PIN_COMMENT = {f"{repo}@{sha}": tag for repo, sha, tag in ACTIONS.values()}


def uses(action: str) -> str:
    """``owner/repo@<commit>`` of one of :data:`ACTIONS`."""
    repo, sha, _ = ACTIONS[action]
    return f"{repo}@{sha}"
# What the standard ubuntu-latest image preinstalls and an image build never uses (about
# 30 GB: .NET, Android SDK, GHC, CodeQL bundles, the cached Docker images).
FREE_DISK = ("sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc "
             "/opt/hostedtoolcache/CodeQL\n"
             "docker image prune --all --force\n"
             "df -h / /var/lib/docker")
# Paths whose change can change an image: the workflow also runs when it changes itself.
WATCHED = ["recipes/**", "compat/**", "templates/**", "src/**", "pyproject.toml",
           ".github/workflows/**"]


def run_step(name: str, script: str, env: dict[str, str] | None = None, **keys: Any) -> dict[str, Any]:
    """A ``run:`` step. ``script`` reads every value from its environment (``env``: where an
    expression may stand); an expression inside the script itself is a bug, refused here."""
    if "${{" in script:
        raise ValueError(f"step {name!r}: an expression inside run:; pass it through env:")
    return {"name": name, **keys, **({"env": env} if env else {}), "run": script}


def recipe_matrix(recipes: list[str] | None) -> list[dict[str, str]]:
    """``[{"name": stem, "recipe": path, "engine": "true"|"false"}]`` for ``recipes``
    (default: ``recipes/*.yaml``). ``engine`` says the recipe compiles a TensorRT engine.
    Each path is checked (:func:`~imgfab.render.ci_values.check_recipe_path`) before it is read."""
    from imgfab.recipe import load_recipe  # noqa: PLC0415

    paths = recipes if recipes else [p.as_posix() for p in Path("recipes").glob("*.yaml")]
    checked = sorted(check_recipe_path(path, index) for index, path in enumerate(paths, 1))
    check_recipe_stems([stem for _, stem in checked])
    rows = []
    for path, stem in checked:
        recipe = load_recipe(path)
        rows.append({"name": stem, "recipe": path,
                     "engine": "true" if recipe.backend.trtllm_path == "engine" else "false"})
    return rows


# GHCR's repository is the owner's name lower-cased (no expression function lower-cases): a
# name GitHub allows is [A-Za-z0-9-]; anything else stops the job before GITHUB_ENV is written.
GHCR_OWNER = """\
case "$OWNER" in ""|*[!A-Za-z0-9-]*) echo "unexpected repository owner" >&2; exit 1;; esac
echo "IMGFAB_REGISTRY=ghcr.io/${OWNER,,}" >> "$GITHUB_ENV"
"""
LOGIN = ('printf \'%s\' "$IMGFAB_REGISTRY_PASSWORD" | docker login "${IMGFAB_REGISTRY%%/*}" '
         '--username "$IMGFAB_REGISTRY_USER" --password-stdin')


def _registry_steps(registry: str) -> tuple[list[dict[str, Any]], dict[str, str], dict[str, str]]:
    """The steps that set IMGFAB_REGISTRY (GHCR) and log in, the job's env (another registry:
    IMGFAB_REGISTRY itself, as data, never through a shell) and the env the push step needs."""
    if registry == "ghcr.io":
        env = {"IMGFAB_REGISTRY_USER": "${{ github.actor }}",
               "IMGFAB_REGISTRY_PASSWORD": "${{ secrets.GITHUB_TOKEN }}"}
        steps = [run_step("Registry: ghcr.io/<owner>", GHCR_OWNER,
                          {"OWNER": "${{ github.repository_owner }}"})]
        job_env: dict[str, str] = {}
    else:
        env = {"IMGFAB_REGISTRY_USER": "${{ secrets.IMGFAB_REGISTRY_USER }}",
               "IMGFAB_REGISTRY_PASSWORD": "${{ secrets.IMGFAB_REGISTRY_PASSWORD }}"}
        steps = []
        job_env = {"IMGFAB_REGISTRY": registry}
    return [*steps, run_step("Log in to the registry", LOGIN, env)], job_env, env


def _setup(runs_on: Any, python: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {"uses": uses("checkout"), "with": {"persist-credentials": False}},
        {"uses": uses("setup-python"), "with": {"python-version": python}},
        run_step("Install imgfab", "python -m pip install ."),
    ]
    if runs_on == "ubuntu-latest":
        steps.append(run_step("Free the runner's disk for a multi-GB image", FREE_DISK))
    return steps


def _job(matrix: list[dict[str, str]], *, push: bool, runs_on: Any, engine_at_start: bool,
         registry: str, python: str) -> dict[str, Any]:
    """The build job (``push=False``: pull requests) or the candidate job (tags: push to the
    staging repository, upload the report and the deploy bundle)."""
    build = 'imgfab build "$RECIPE"' + (" --engine-at-start" if engine_at_start else "")
    steps = _setup(runs_on, python)
    env = {"RECIPE": "${{ matrix.recipe }}"}
    job_env: dict[str, str] = {}
    # Offline --check (inside build) proves the lock unedited, not unforged: every pinned hash
    # is compared with the index's own before anything is built from it.
    steps.append(run_step("Check the lock's hashes against the index",
                          'imgfab lock --check --online "$RECIPE"', dict(env)))
    if push:
        registry_steps, job_env, secret_env = _registry_steps(registry)
        steps += registry_steps
        env |= secret_env
        run = (build + ' --push --registry "$IMGFAB_REGISTRY/' + STAGING + '" --output "build/$NAME"'
               ' --registry-user "$IMGFAB_REGISTRY_USER" --json > ' + REPORT)
        env["NAME"] = "${{ matrix.name }}"
        steps.append(run_step("Build, verify and push the candidate", run, env))
    else:
        steps.append(run_step("Build and verify (no push)", build + " --json > " + REPORT, env))
    steps.append({"name": "Upload the build report", "if": "always()",
                  "uses": uses("upload-artifact"),
                  "with": {"name": "imgfab-report-${{ matrix.name }}",
                           "path": REPORT + ("\nbuild/${{ matrix.name }}/deploy/" if push else ""),
                           "if-no-files-found": "warn"}})
    return {
        "name": "${{ matrix.name }}",
        "if": TAG_PUSH if push else f"!({TAG_PUSH})",
        "runs-on": runs_on,
        "timeout-minutes": 180 if runs_on != "ubuntu-latest" else 120,
        "permissions": {"contents": "read", "packages": "write"} if push else {"contents": "read"},
        **({"env": job_env} if job_env else {}),
        # Copies: a list shared between jobs would be dumped as a YAML alias, which Actions refuses.
        "strategy": {"fail-fast": False, "matrix": {"include": [dict(row) for row in matrix]}},
        "steps": steps,
    }


# The release step: the candidate's digest, promoted by digest, then signed and attested in
# its new repository (keyless: the job's OIDC identity).
PROMOTE = """\
staged=$(jq -r '.images[0].pushed' imgfab-report.json)
local_ref=$(jq -r '.images[0].tags[0]' imgfab-report.json)
target="$IMGFAB_REGISTRY/${local_ref}"
imgfab promote "$staged" --to "$target" --json > promoted.json
promoted=$(jq -r .promoted promoted.json)
jq .predicate "build/$NAME/deploy/provenance.intoto.json" > provenance.predicate.json
cosign sign --yes "$promoted"
cosign attest --yes --type cyclonedx --predicate "build/$NAME/deploy/sbom.cdx.json" "$promoted"
cosign attest --yes --type slsaprovenance1 --predicate provenance.predicate.json "$promoted"
cosign verify "$promoted" --certificate-identity "$IDENTITY" \\
  --certificate-oidc-issuer https://token.actions.githubusercontent.com > /dev/null
echo "promoted $staged to $target: $promoted" >> "$GITHUB_STEP_SUMMARY"
"""


def _release_job(matrix: list[dict[str, str]], needs: str, *, registry: str,
                 python: str) -> dict[str, Any]:
    """Promote each candidate's digest and sign it keylessly: no build, no GPU needed."""
    registry_steps, job_env, secret_env = _registry_steps(registry)
    steps = _setup("release", python)
    steps += [
        {"uses": uses("setup-oras"), "with": {"version": ORAS_VERSION}},
        {"uses": uses("cosign-installer"), "with": {"cosign-release": COSIGN_RELEASE}},
        {"uses": uses("download-artifact"), "with": {"name": "imgfab-report-${{ matrix.name }}"}},
        *registry_steps,
        run_step("Promote the candidate's digest, sign and attest it", PROMOTE,
                 {"NAME": "${{ matrix.name }}",
                  # the identity Fulcio puts in a workflow run's certificate: the workflow
                  # file at the ref it ran from (.github/workflows/images.yml, as rendered)
                  "IDENTITY": "${{ github.server_url }}/${{ github.repository }}/"
                              ".github/workflows/images.yml@${{ github.ref }}",
                  **secret_env}),
    ]
    return {
        "name": "release ${{ matrix.name }}",
        "needs": needs,
        "if": TAG_PUSH,
        "runs-on": "ubuntu-latest",
        "timeout-minutes": 60,
        # id-token: write only here: the keyless signature's identity is this job's
        "permissions": {"contents": "read", "packages": "write", "id-token": "write"},
        **({"env": job_env} if job_env else {}),
        "strategy": {"fail-fast": False, "matrix": {"include": [dict(row) for row in matrix]}},
        "steps": steps,
    }


def lock_refusals(rows: list[dict[str, str]]) -> dict[str, str]:
    """``{recipe path: refusal}`` for each row whose committed lock is current and records a
    refusal (:func:`~imgfab.payload.lock.lock_recipe`): that recipe cannot build anywhere its
    lock was made, so a job for it could only fail. A missing or stale lock is not a refusal
    (its job fails at ``imgfab build`` until the lock is committed)."""
    from imgfab.payload.lock import check_lock  # noqa: PLC0415

    refused = {}
    for row in rows:
        result = check_lock(row["recipe"])
        if result.refused:
            refused[row["recipe"]] = result.refused
    return refused


def workflow_plan(recipes: list[str] | None = None, *, registry: str = "ghcr.io",
                  python: str = "3.11", gpu_runner: str | None = None
                  ) -> tuple[dict[str, Any], dict[str, str]]:
    """The workflow as a dict and ``{recipe path: refusal}`` of the recipes left out of it.

    Only recipes that can build get jobs: named ``recipes`` whose locks record a refusal are
    :class:`~imgfab.errors.CompatibilityError` (exit 2); from the default ``recipes/*.yaml``
    they are left out (the caller says so), and none left is CompatibilityError too.
    RecipeError for a value that :mod:`imgfab.render.ci_values` refuses, before any recipe is
    read."""
    from imgfab.errors import CompatibilityError  # noqa: PLC0415

    check_registry(registry)
    check_python(python)
    if gpu_runner is not None:
        check_runner_label(gpu_runner)
    rows = recipe_matrix(recipes)
    refused = lock_refusals(rows)
    if refused and (recipes or len(refused) == len(rows)):
        names = ", ".join(sorted(refused))
        raise CompatibilityError(f"{names} cannot build: the lock records a refusal ("
                                 f"{next(iter(refused.values()))})", field="ci github",
                                 fix="leave them out, or lock them where their indexes answer "
                                     "(`imgfab lock RECIPE`)")
    rows = [r for r in rows if r["recipe"] not in refused]
    return _workflow_dict(rows, registry=registry, python=python, gpu_runner=gpu_runner), refused


def github_workflow_dict(recipes: list[str] | None = None, *, registry: str = "ghcr.io",
                         python: str = "3.11", gpu_runner: str | None = None) -> dict[str, Any]:
    """The workflow as a dict (see :func:`workflow_plan`, :func:`github_workflow`)."""
    return workflow_plan(recipes, registry=registry, python=python, gpu_runner=gpu_runner)[0]


def _workflow_dict(rows: list[dict[str, str]], *, registry: str, python: str,
                   gpu_runner: str | None) -> dict[str, Any]:
    plain = [r for r in rows if r["engine"] == "false"]
    engines = [r for r in rows if r["engine"] == "true"]
    jobs: dict[str, Any] = {}
    for push, prefix in ((False, "build"), (True, "candidate")):
        if plain:
            jobs[prefix] = _job(plain, push=push, runs_on="ubuntu-latest", engine_at_start=False,
                                registry=registry, python=python)
        if engines:
            jobs[f"{prefix}-engines"] = _job(
                engines, push=push, runs_on=["self-hosted", gpu_runner] if gpu_runner else "ubuntu-latest",
                engine_at_start=gpu_runner is None, registry=registry, python=python)
    if plain:
        jobs["release"] = _release_job(plain, "candidate", registry=registry, python=python)
    if engines:
        jobs["release-engines"] = _release_job(engines, "candidate-engines", registry=registry,
                                               python=python)
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
    return workflow_text(*workflow_plan(recipes, registry=registry, python=python,
                                        gpu_runner=gpu_runner))


def workflow_text(workflow: dict[str, Any], left_out: dict[str, str]) -> str:
    """``workflow`` as YAML text, its header naming each recipe ``left_out`` (no job)."""
    text = yaml.safe_dump(workflow, sort_keys=False, width=100, default_flow_style=False)
    lines = [f"{line}  # {_PIN_COMMENT[line.split('uses: ', 1)[1]]}"
             if "uses: " in line and line.split("uses: ", 1)[1] in _PIN_COMMENT else line
             for line in text.splitlines()]
    # Recipe paths are checked by ci_values (no newline can reach a comment).
    header = ["# Generated by `imgfab ci github`; regenerate instead of editing."]
    header += [f"# Left out: {path} (its lock records a refusal: it cannot build)"
               for path in sorted(left_out)]
    return "\n".join(header + lines) + "\n"
