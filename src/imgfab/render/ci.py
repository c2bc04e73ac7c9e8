"""CI pipeline definitions that build the recipe matrix with imgfab itself.

:func:`github_workflow` returns a GitHub Actions workflow (YAML text):

- ``build``: pull requests that change a recipe's directory (recipes and their locks), the
  ``compat_dir`` given, the imgfab ``path`` installed or the workflow itself build and verify
  every recipe, read-only (``contents: read``), pushing nothing;
- ``candidate``: ``v*`` tags build, verify and push each image to the staging repository
  (``$IMGFAB_REGISTRY/staging/…``); its report (with the pushed digest) and its deploy bundle
  (SBOM, provenance) are uploaded as artifacts;
- ``smoke`` (with ``gpu_runner``, needs ``candidate``): each vLLM recipe's staged digest is
  pulled on the GPU runner and served with ``imgfab smoke --synthetic-model`` in every run shape
  (run.sh, compose, k8s: all three start on the runner's own Docker, no cluster needed);
- ``release`` (needs ``candidate``, and ``smoke`` for vLLM recipes when there is one): promotes the digest that passed, by digest (``imgfab
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
- imgfab itself is installed as the caller names it (:class:`Install`): a released wheel
  downloaded by version and checked against its sha256, or a path inside the repository
  (a wheel or a source directory), never ``pip install .`` of whatever the checkout holds;
- zstd layers (the default compression) need the containerd image store: a job that builds or
  pulls a zstd recipe first switches the runner's Docker to it (daemon.json) and checks it did;
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

Every recipe needs its current lock, as ``imgfab bake`` does: a missing or stale one is
RecipeError (exit 2) here, not a job that fails at ``imgfab lock --check --online``.
Multi-line scripts are written as YAML literal blocks (``|``), readable as the shell sees them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import yaml

from imgfab.render.ci_values import (check_install, check_python, check_recipe_path,
                                     check_recipe_stems, check_registry, check_relative_path,
                                     check_runner_label)

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
# Where the workflow lives (its path is part of the keyless signer's identity) and the OIDC
# issuer of GitHub Actions' tokens, which Fulcio writes into the certificate.
WORKFLOW_PATH = ".github/workflows/images.yml"
ISSUER = "https://token.actions.githubusercontent.com"
SMOKE_REPORT = "imgfab-smoke.json"
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


@dataclass(frozen=True)
class Install:
    """The imgfab a workflow installs: a release (``version`` and its wheel's ``sha256``) or a
    ``path`` inside the repository (a wheel file or a source directory, e.g. a submodule).
    :func:`~imgfab.render.ci_values.check_install` checks that exactly one is named."""

    version: str | None = None
    sha256: str | None = None
    path: str | None = None


# The release's wheel alone (no dependencies, no sdist), checked against the hash the caller
# named before pip installs that very file.
INSTALL_RELEASE = """\
wheels="$RUNNER_TEMP/imgfab-wheel"
python -m pip download --no-deps --only-binary :all: "imgfab==$IMGFAB_VERSION" -d "$wheels"
set -- "$wheels"/imgfab-*.whl
if [ "$#" -ne 1 ] || [ ! -f "$1" ]; then echo "expected one imgfab wheel in $wheels" >&2; exit 1; fi
echo "$IMGFAB_SHA256  $1" | sha256sum -c -
python -m pip install "$1"
"""
INSTALL_PATH = 'python -m pip install "./$IMGFAB_PATH"'
# The containerd image store, which keeps zstd layers as built (the classic store refuses
# them: imgfab's engine check, exit 1). Merged into daemon.json, whatever else it holds;
# nothing changes where the engine already uses it. Go templates below, not expressions.
CONTAINERD_STORE = """\
snapshotter() { docker info --format '{{ .DriverStatus }}' | grep -q io.containerd.snapshotter.v1; }
if snapshotter; then echo "Docker already uses the containerd image store"; exit 0; fi
daemon=/etc/docker/daemon.json
if sudo test -s "$daemon"; then sudo cat "$daemon"; else echo '{}'; fi \\
  | jq '. * {"features": {"containerd-snapshotter": true}}' > "$RUNNER_TEMP/daemon.json"
sudo install -m 0644 "$RUNNER_TEMP/daemon.json" "$daemon"
sudo systemctl restart docker
if ! snapshotter; then echo "Docker does not use the containerd image store after the restart" >&2; exit 1; fi
"""
# A self-hosted runner outlives the job: `docker login` writes to a per-run config there.
DOCKER_CONFIG = 'echo "DOCKER_CONFIG=$RUNNER_TEMP/docker-config" >> "$GITHUB_ENV"'



def run_step(name: str, script: str, env: dict[str, str] | None = None, **keys: Any) -> dict[str, Any]:
    """A ``run:`` step. ``script`` reads every value from its environment (``env``: where an
    expression may stand); an expression inside the script itself is a bug, refused here."""
    if "${{" in script:
        raise ValueError(f"step {name!r}: an expression inside run:; pass it through env:")
    return {"name": name, **keys, **({"env": env} if env else {}), "run": script}


@dataclass(frozen=True)
class PlannedRecipe:
    """One recipe as the workflow needs it: its matrix row (``name``, ``recipe``, ``engine``)
    and what decides its jobs and triggers."""

    row: dict[str, str]
    vllm: bool  # served by vLLM: the GPU smoke job serves it with a synthetic model
    zstd: bool  # image.compression zstd: its jobs need the containerd image store
    repository: str  # image.repository, under the registry: what the policy covers
    lock: str  # the lock's path, beside the recipe


def recipe_plan(recipes: list[str] | None) -> list[PlannedRecipe]:
    """A :class:`PlannedRecipe` per path of ``recipes`` (default: ``recipes/*.yaml``), sorted.
    Each path is checked (:func:`~imgfab.render.ci_values.check_recipe_path`) before it is read."""
    from imgfab.recipe import load_recipe  # noqa: PLC0415

    paths = recipes if recipes else [p.as_posix() for p in Path("recipes").glob("*.yaml")]
    checked = sorted(check_recipe_path(path, index) for index, path in enumerate(paths, 1))
    check_recipe_stems([stem for _, stem in checked])
    planned = []
    for path, stem in checked:
        recipe = load_recipe(path)
        planned.append(PlannedRecipe(
            row={"name": stem, "recipe": path,
                 "engine": "true" if recipe.backend.trtllm_path == "engine" else "false"},
            vllm=recipe.backend.name == "vllm", zstd=recipe.image.compression == "zstd",
            repository=recipe.image.repository,
            lock=(PurePosixPath(path).parent / f"{recipe.name}.lock").as_posix()))
    return planned


def recipe_matrix(recipes: list[str] | None) -> list[dict[str, str]]:
    """``[{"name": stem, "recipe": path, "engine": "true"|"false"}]`` for ``recipes``
    (:func:`recipe_plan`). ``engine`` says the recipe compiles a TensorRT engine."""
    return [planned.row for planned in recipe_plan(recipes)]


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


def _install_step(install: Install) -> dict[str, Any]:
    if install.path is not None:
        return run_step("Install imgfab from " + ("the repository" if install.path == "." else "its path"),
                        INSTALL_PATH, {"IMGFAB_PATH": install.path})
    return run_step("Install the imgfab release, its wheel checked against its sha256",
                    INSTALL_RELEASE, {"IMGFAB_VERSION": str(install.version),
                                      "IMGFAB_SHA256": str(install.sha256)})


def _setup(runs_on: Any, python: str, install: Install, *, zstd: bool = False) -> list[dict[str, Any]]:
    """Check out (no credentials kept), install imgfab, make room and, for ``zstd``, switch the
    engine to the containerd image store; a self-hosted runner keeps its Docker login per run."""
    steps: list[dict[str, Any]] = [
        {"uses": uses("checkout"), "with": {"persist-credentials": False}},
        {"uses": uses("setup-python"), "with": {"python-version": python}},
        _install_step(install),
    ]
    if runs_on == "ubuntu-latest":
        steps.append(run_step("Free the runner's disk for a multi-GB image", FREE_DISK))
    elif runs_on != "release":
        steps.append(run_step("Keep this run's registry login to this run", DOCKER_CONFIG))
    if zstd:
        steps.append(run_step("Use the containerd image store (zstd layers)", CONTAINERD_STORE))
    return steps


def _matrix(planned: list[PlannedRecipe]) -> dict[str, Any]:
    # Copies: a list shared between jobs would be dumped as a YAML alias, which Actions refuses.
    return {"fail-fast": False, "matrix": {"include": [dict(p.row) for p in planned]}}


def _job(planned: list[PlannedRecipe], *, push: bool, runs_on: Any, engine_at_start: bool,
         settings: "_Settings") -> dict[str, Any]:
    """The build job (``push=False``: pull requests) or the candidate job (tags: push to the
    staging repository, upload the report and the deploy bundle)."""
    build = 'imgfab build "$RECIPE"' + (" --engine-at-start" if engine_at_start else "")
    compat = ' --compat-dir "$IMGFAB_COMPAT_DIR"' if settings.compat_dir else ""
    build += compat
    steps = _setup(runs_on, settings.python, settings.install, zstd=any(p.zstd for p in planned))
    env = {"RECIPE": "${{ matrix.recipe }}"}
    job_env: dict[str, str] = {}
    if settings.compat_dir:
        job_env["IMGFAB_COMPAT_DIR"] = settings.compat_dir
    # Offline --check (inside build) proves the lock unedited, not unforged: every pinned hash
    # is compared with the index's own before anything is built from it.
    steps.append(run_step("Check the lock's hashes against the index",
                          'imgfab lock --check --online "$RECIPE"' + compat, dict(env)))
    if push:
        registry_steps, registry_env, secret_env = _registry_steps(settings.registry)
        job_env |= registry_env
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
        "strategy": _matrix(planned),
        "steps": steps,
    }


# The GPU smoke: the digest the candidate job pushed to staging, pulled on the GPU runner and
# served in every run shape with a random-weight model of the recipe's architecture.
SMOKE = f"""\
staged=$(jq -r '.images[0].pushed' {REPORT})
case "$staged" in *@sha256:*) ;; *) echo "the build report names no pushed digest" >&2; exit 1;; esac
imgfab smoke "$staged" --synthetic-model --shape all --json > {SMOKE_REPORT}
"""


def _smoke_job(planned: list[PlannedRecipe], *, gpu_runner: str, settings: "_Settings") -> dict[str, Any]:
    """Pull each vLLM candidate by digest on the GPU runner and smoke it (no weights needed)."""
    registry_steps, job_env, secret_env = _registry_steps(settings.registry)
    steps = _setup(["self-hosted", gpu_runner], settings.python, settings.install,
                   zstd=any(p.zstd for p in planned))
    steps += [
        {"uses": uses("download-artifact"), "with": {"name": "imgfab-report-${{ matrix.name }}"}},
        *registry_steps,
        run_step("Smoke the staged digest on the GPU (synthetic model, every run shape)", SMOKE,
                 dict(secret_env)),
        {"name": "Upload the smoke report", "if": "always()", "uses": uses("upload-artifact"),
         "with": {"name": "imgfab-smoke-${{ matrix.name }}", "path": SMOKE_REPORT,
                  "if-no-files-found": "warn"}},
    ]
    return {
        "name": "smoke ${{ matrix.name }}",
        "needs": "candidate",
        "if": TAG_PUSH,
        "runs-on": ["self-hosted", gpu_runner],
        "timeout-minutes": 120,
        # packages: read: the staged image may be private
        "permissions": {"contents": "read", "packages": "read"},
        **({"env": job_env} if job_env else {}),
        "strategy": _matrix(planned),
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


def _release_job(planned: list[PlannedRecipe], needs: str | list[str], *,
                 settings: "_Settings") -> dict[str, Any]:
    """Promote each candidate's digest and sign it keylessly: no build, no GPU needed."""
    registry_steps, job_env, secret_env = _registry_steps(settings.registry)
    steps = _setup("release", settings.python, settings.install)
    steps += [
        {"uses": uses("setup-oras"), "with": {"version": ORAS_VERSION}},
        {"uses": uses("cosign-installer"), "with": {"cosign-release": COSIGN_RELEASE}},
        {"uses": uses("download-artifact"), "with": {"name": "imgfab-report-${{ matrix.name }}"}},
        *registry_steps,
        run_step("Promote the candidate's digest, sign and attest it", PROMOTE,
                 {"NAME": "${{ matrix.name }}",
                  # the identity Fulcio puts in a workflow run's certificate: the workflow
                  # file at the ref it ran from (WORKFLOW_PATH, as rendered); the policy's
                  # subjectRegExp (signer_identity_regexp) matches it for every v* tag
                  "IDENTITY": "${{ github.server_url }}/${{ github.repository }}/"
                              f"{WORKFLOW_PATH}@${{{{ github.ref }}}}",
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
        "strategy": _matrix(planned),
        "steps": steps,
    }


def signer_identity_regexp(repository: str, server: str = "https://github.com") -> str:
    r"""The certificate subject of the release job, as an anchored RE2 regular expression: the
    workflow file of ``repository`` (``OWNER/NAME``, escaped) at any ``v*`` tag, the refs the
    release job runs on (its ``if:``), and nothing else: no branch, no other repository.
    ``acme/models`` gives
    ``^https://github\.com/acme/models/\.github/workflows/images\.yml@refs/tags/v.+$``."""
    return f"^{re.escape(server)}/{re.escape(repository)}/{re.escape(WORKFLOW_PATH)}@refs/tags/v.+$"


def lock_refusals(planned: list[PlannedRecipe], compat_dir: str | None = None) -> dict[str, str]:
    """``{recipe path: refusal}`` for each recipe whose committed lock is current and records a
    refusal (:func:`~imgfab.payload.lock.lock_recipe`): that recipe cannot build anywhere its
    lock was made, so a job for it could only fail. A missing, stale or unhashed lock is
    RecipeError (exit 2), as ``imgfab bake`` refuses it
    (:func:`~imgfab.payload.lock.load_for_build`)."""
    from imgfab.errors import RecipeError  # noqa: PLC0415
    from imgfab.payload.lock import check_lock  # noqa: PLC0415

    refused = {}
    for recipe in planned:
        path = recipe.row["recipe"]
        result = check_lock(path, Path(compat_dir) if compat_dir else None)
        if result.problem or result.lock is None:
            raise RecipeError(f"{recipe.lock} is {result.problem or 'unreadable'}", field="lock",
                              fix=f"run `imgfab lock {path}` and commit the lock")
        if result.refused:
            refused[path] = result.refused
        elif result.lock.unhashed:
            raise RecipeError(f"the lock pins {' '.join(result.lock.unhashed)} without hashes",
                              field="lock", fix="lock where their index answers")
    return refused


@dataclass(frozen=True)
class _Settings:
    """The checked values every job is rendered with."""

    registry: str
    python: str
    install: Install
    compat_dir: str | None


def workflow_plan(recipes: list[str] | None = None, *, registry: str = "ghcr.io",
                  python: str = "3.11", gpu_runner: str | None = None,
                  install: Install = Install(), compat_dir: str | None = None
                  ) -> tuple[dict[str, Any], dict[str, str]]:
    """The workflow as a dict and ``{recipe path: refusal}`` of the recipes left out of it.

    Only recipes that can build get jobs: named ``recipes`` whose locks record a refusal are
    :class:`~imgfab.errors.CompatibilityError` (exit 2); from the default ``recipes/*.yaml``
    they are left out (the caller says so), and none left is CompatibilityError too. A recipe
    without its current lock is RecipeError (exit 2), named or not. RecipeError for a value
    that :mod:`imgfab.render.ci_values` refuses (``install`` names exactly one imgfab), before
    any recipe is read."""
    plan = plan_workflow(recipes, registry=registry, python=python, gpu_runner=gpu_runner,
                         install=install, compat_dir=compat_dir)
    return plan.workflow, plan.left_out


class WorkflowPlan(NamedTuple):
    """The workflow (a dict), ``{recipe path: refusal}`` of the recipes left out of it, and the
    recipes it builds and releases."""

    workflow: dict[str, Any]
    left_out: dict[str, str]
    released: list[PlannedRecipe]


def plan_workflow(recipes: list[str] | None = None, *, registry: str = "ghcr.io",
                  python: str = "3.11", gpu_runner: str | None = None,
                  install: Install = Install(), compat_dir: str | None = None) -> WorkflowPlan:
    """:func:`workflow_plan`, with the recipes released (their image repositories: what the
    signer's admission policy covers)."""
    from imgfab.errors import CompatibilityError, RecipeError  # noqa: PLC0415

    check_registry(registry)
    check_python(python)
    if gpu_runner is not None:
        check_runner_label(gpu_runner)
    check_install(install.version, install.sha256, install.path)
    if compat_dir is not None:
        check_relative_path(compat_dir, field="--compat-dir")
    for path, flag in ((install.path, "--imgfab-path"), (compat_dir, "--compat-dir")):
        if path is not None and not Path(path).exists():  # checked above: safe to name
            raise RecipeError(f"{path} is not in this checkout", field=flag,
                              fix="run ci github at the repository root, with paths relative to it")
    planned = recipe_plan(recipes)
    refused = lock_refusals(planned, compat_dir)
    if refused and (recipes or len(refused) == len(planned)):
        names = ", ".join(sorted(refused))
        raise CompatibilityError(f"{names} cannot build: the lock records a refusal ("
                                 f"{next(iter(refused.values()))})", field="ci github",
                                 fix="leave them out, or lock them where their indexes answer "
                                     "(`imgfab lock RECIPE`)")
    planned = [p for p in planned if p.row["recipe"] not in refused]
    settings = _Settings(registry, python, install, compat_dir)
    return WorkflowPlan(_workflow_dict(planned, settings=settings, gpu_runner=gpu_runner), refused,
                        planned)


def github_workflow_dict(recipes: list[str] | None = None, *, registry: str = "ghcr.io",
                         python: str = "3.11", gpu_runner: str | None = None,
                         install: Install = Install(), compat_dir: str | None = None) -> dict[str, Any]:
    """The workflow as a dict (see :func:`workflow_plan`, :func:`github_workflow`)."""
    return workflow_plan(recipes, registry=registry, python=python, gpu_runner=gpu_runner,
                         install=install, compat_dir=compat_dir)[0]


def watched_paths(planned: list[PlannedRecipe], install: Install, compat_dir: str | None) -> list[str]:
    """The ``pull_request`` paths: each recipe's directory (the recipe, its lock, its
    calibration data), ``compat_dir``, the imgfab ``install.path`` and the workflow itself."""
    watched = {WORKFLOW_PATH}
    for recipe in planned:
        directory = PurePosixPath(recipe.row["recipe"]).parent.as_posix()
        # a recipe at the root: itself and its lock, not every file of the repository
        watched |= {f"{directory}/**"} if directory != "." else {recipe.row["recipe"], recipe.lock}
    if compat_dir is not None:
        watched.add("**" if compat_dir == "." else f"{compat_dir}/**")
    if install.path is not None:
        # a wheel is one file; a source directory (".": this repository is imgfab) every file in it
        watched.add(install.path if install.path.endswith(".whl") else
                    "**" if install.path == "." else f"{install.path}/**")
    return sorted(watched)


def _workflow_dict(planned: list[PlannedRecipe], *, settings: _Settings,
                   gpu_runner: str | None) -> dict[str, Any]:
    plain = [p for p in planned if p.row["engine"] == "false"]
    engines = [p for p in planned if p.row["engine"] == "true"]
    jobs: dict[str, Any] = {}
    for push, prefix in ((False, "build"), (True, "candidate")):
        if plain:
            jobs[prefix] = _job(plain, push=push, runs_on="ubuntu-latest", engine_at_start=False,
                                settings=settings)
        if engines:
            jobs[f"{prefix}-engines"] = _job(
                engines, push=push, runs_on=["self-hosted", gpu_runner] if gpu_runner else "ubuntu-latest",
                engine_at_start=gpu_runner is None, settings=settings)
    vllm = [p for p in plain if p.vllm]
    if gpu_runner and vllm:
        jobs["smoke"] = _smoke_job(vllm, gpu_runner=gpu_runner, settings=settings)
    if plain:
        jobs["release"] = _release_job(plain, ["candidate", "smoke"] if "smoke" in jobs else "candidate",
                                       settings=settings)
    if engines:
        jobs["release-engines"] = _release_job(engines, "candidate-engines", settings=settings)
    return {
        "name": "imgfab images",
        "on": {"push": {"tags": ["v*"]},
               "pull_request": {"paths": watched_paths(planned, settings.install, settings.compat_dir)}},
        "permissions": {"contents": "read"},
        "concurrency": {"group": "imgfab-${{ github.ref }}", "cancel-in-progress": True},
        "env": {"DOCKER_BUILDKIT": "1"},
        "jobs": jobs,
    }


def github_workflow(recipes: list[str] | None = None, *, registry: str = "ghcr.io",
                    python: str = "3.11", gpu_runner: str | None = None,
                    install: Install = Install(), compat_dir: str | None = None) -> str:
    """The workflow as YAML text, for ``.github/workflows/images.yml``. Deterministic."""
    return workflow_text(*workflow_plan(recipes, registry=registry, python=python,
                                        gpu_runner=gpu_runner, install=install,
                                        compat_dir=compat_dir))


class _WorkflowDumper(yaml.SafeDumper):
    """SafeDumper writing every multi-line string as a literal block (``|``): a script reads
    as the shell runs it. PyYAML itself falls back to a quoted scalar for text a block cannot
    hold (trailing spaces, control characters), so the text always loads back the same."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_str(value)


_WorkflowDumper.add_representer(str, _represent_str)


def dump_workflow(workflow: dict[str, Any]) -> str:
    """``workflow`` as YAML, multi-line strings as literal blocks; loads back to ``workflow``."""
    return yaml.dump(workflow, Dumper=_WorkflowDumper, sort_keys=False, width=100,
                     default_flow_style=False, allow_unicode=False)


def workflow_text(workflow: dict[str, Any], left_out: dict[str, str]) -> str:
    """``workflow`` as YAML text, its header naming each recipe ``left_out`` (no job), what
    the workflow installs and whether promotion waits for a GPU smoke."""
    text = dump_workflow(workflow)
    lines = [f"{line}  # {_PIN_COMMENT[line.split('uses: ', 1)[1]]}"
             if "uses: " in line and line.split("uses: ", 1)[1] in _PIN_COMMENT else line
             for line in text.splitlines()]
    # Recipe paths are checked by ci_values (no newline can reach a comment).
    header = ["# Generated by `imgfab ci github`; regenerate instead of editing."]
    header += [f"# Left out: {path} (its lock records a refusal: it cannot build)"
               for path in sorted(left_out)]
    jobs = workflow["jobs"]
    if "smoke" in jobs:
        header.append("# GPU smoke: each vLLM candidate is served on the GPU runner with a synthetic "
                      "model in every run shape (run.sh, compose, k8s: started on the runner's Docker) "
                      "before release promotes it.")
    elif "release" in jobs:
        header.append("# No GPU smoke: release promotes candidates without serving them on a GPU "
                      "(give --gpu-runner LABEL to smoke each vLLM recipe first).")
    return "\n".join(header + lines) + "\n"
