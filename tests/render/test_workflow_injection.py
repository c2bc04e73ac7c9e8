"""`imgfab ci github` (issue 21, item 2): no value from the command line can inject shell code,
an expression or an environment line into the generated workflow.

Hostile values are refused at the CLI (exit 2, one line naming the option, the value never
echoed); valid ones reach ``run:`` only through ``env:``; the only expressions in the file are
the ones imgfab writes itself; actionlint runs on hostile-but-valid inputs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import yaml

from conftest import REPO, walk_strings
from test_bake_ci import _actionlint, ci_github, imgfab

SOURCE_RECIPE = REPO / "recipes" / "qwen2-7b-h100.yaml"
# Every expression imgfab itself writes: anything else in a rendered file came from a value.
OWN_EXPRESSIONS = re.compile(
    r"matrix\.(name|recipe)|github\.(ref|actor|repository|repository_owner|server_url)"
    r"|secrets\.(GITHUB_TOKEN|IMGFAB_REGISTRY_USER|IMGFAB_REGISTRY_PASSWORD)")
HOSTILE_REGISTRIES = [
    'x";touch /tmp/pwn;"${{ github.event.head_commit.message }}',  # the issue's own case
    "r.example\nIMGFAB_REGISTRY_PASSWORD=x",  # a second GITHUB_ENV line
    "r.example/${{ github.token }}",
    "r.example/$(id)", "r.example/`id`", "r.example'", "r.example;id", "r.example\r",
    "r.example ", "", "r.éxample", "ｒ.example", "r.example:99999", "r.example:0",
    "R.example/Team", "r.example/a//b", "r.example/", "-r.example", "r..example",
    "r.example:5000:1", "a" * 300,
]


def _one_line_refusal(result: subprocess.CompletedProcess, option: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout[:300], result.stderr)
    assert result.stdout == ""  # nothing half-written to the workflow file
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "fix:" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize("registry", HOSTILE_REGISTRIES, ids=range(len(HOSTILE_REGISTRIES)))
def test_hostile_registry_is_refused_at_the_cli(registry):
    line = _one_line_refusal(ci_github("--registry", registry, cwd=REPO), "--registry")
    assert "${{" not in line and "touch" not in line  # the value itself is never echoed


def test_a_password_in_the_registry_is_never_printed():
    line = _one_line_refusal(ci_github("--registry", "alice:S3CRET@pypi.corp.example/simple",
                                    cwd=REPO), "--registry")
    assert "S3CRET" not in line and "'@'" in line


def _repo_with(tmp_path: Path, *names: str) -> Path:
    """A checkout holding a valid recipe under each of ``names`` (relative paths)."""
    for name in names:
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SOURCE_RECIPE, target)
        shutil.copy(SOURCE_RECIPE.with_suffix(".lock"), target.parent / "qwen2-7b-h100.lock")
    return tmp_path


HOSTILE_RECIPES = [
    "recipes/a${{ github.token }}b.yaml",  # the issue's own case: a live expression in job names
    'recipes/x";id;".yaml', "recipes/x$(id).yaml", "recipes/a b.yaml", "recipes/a\nb.yaml",
    "recipes/-rf.yaml",  # `imgfab build "-rf.yaml"` would read it as an option
    "recipes/.hidden.yaml", "recipes/ünï.yaml", "recipes/x'.yaml", "recipes/x.json",
    "recipes/sub/../x.yaml", "recipes/" + "a" * 90 + ".yaml",
]


@pytest.mark.parametrize("name", HOSTILE_RECIPES, ids=range(len(HOSTILE_RECIPES)))
def test_hostile_recipe_file_is_refused_at_the_cli(tmp_path, name):
    checkout = _repo_with(tmp_path, name, "recipes/x.yaml")
    line = _one_line_refusal(ci_github(name, cwd=checkout), "RECIPES (argument 1)")
    assert "${{" not in line
    if "$" in name:  # named, the first character that is wrong, not the value
        assert "character '$' at position" in line, line


def test_a_hostile_recipe_in_the_default_glob_is_refused(tmp_path):
    checkout = _repo_with(tmp_path, "recipes/ok.yaml", "recipes/a${{ github.token }}b.yaml")
    _one_line_refusal(ci_github(cwd=checkout), "RECIPES")


def test_an_absolute_recipe_path_is_refused(tmp_path):
    checkout = _repo_with(tmp_path, "recipes/x.yaml")
    line = _one_line_refusal(ci_github(str(checkout / "recipes/x.yaml"), cwd=checkout),
                             "RECIPES (argument 1)")
    assert "absolute path" in line


def test_two_recipes_with_one_stem_are_refused(tmp_path):
    checkout = _repo_with(tmp_path, "recipes/a/x.yaml", "recipes/b/x.yaml")
    line = _one_line_refusal(ci_github("recipes/a/x.yaml", "recipes/b/x.yaml",
                                    cwd=checkout), "RECIPES")
    assert "'x'" in line


@pytest.mark.parametrize("label", ["gpu-ß", "٣", "${{ github.token }}", "-x", "a\n", ""])
def test_hostile_runner_label_is_refused(label):
    _one_line_refusal(ci_github("--gpu-runner", label, cwd=REPO), "--gpu-runner")


@pytest.mark.parametrize("python", ["3.11\nx", "3.11'", "${{ github.token }}", "3", "３.11", "latest"])
def test_hostile_python_version_is_refused(python):
    from imgfab.errors import RecipeError
    from imgfab.render.ci import Install, github_workflow_dict

    with pytest.raises(RecipeError) as raised:
        github_workflow_dict([str(SOURCE_RECIPE.relative_to(REPO))], python=python,
                             install=Install(path="."))
    assert raised.value.field == "python" and raised.value.exit_code == 2


# Valid, but with every character the patterns allow: dots, underscores, dashes, digits first,
# a sub-directory, .yml, a port and a multi-component registry path.
ODD_RECIPES = ["recipes/Odd_name.v2-x.yaml", "recipes/sub_dir/9lives.yml", "recipes/a__b--c.yaml"]
ODD_REGISTRY = "registry-1.example.com:5000/team-a/sub_b.c__d"




@pytest.mark.parametrize("args", [
    (), ("--registry", ODD_REGISTRY), ("--registry", ODD_REGISTRY, "--gpu-runner", "gpu_h100.x-1"),
    ("--registry", "127.0.0.1:5000"), ("--registry", "localhost")])
def test_values_reach_scripts_only_through_env(tmp_path, args):
    checkout = _repo_with(tmp_path, *ODD_RECIPES)
    result = ci_github(*args, *ODD_RECIPES, cwd=checkout)
    assert result.returncode == 0, result.stderr
    workflow = yaml.safe_load(result.stdout)
    strings = list(walk_strings(workflow))
    runs = [(p, s) for p, s in strings if p[-1] == "run"]
    assert len(runs) >= 10
    for path, script in runs:  # GitHub's "intermediate environment variable" rule
        assert "${{" not in script, (path, script)
    # The only expressions anywhere are imgfab's own.
    for expression in re.findall(r"\$\{\{(.*?)\}\}", result.stdout, re.DOTALL):
        assert OWN_EXPRESSIONS.fullmatch(expression.strip()), expression
    registry = dict(zip(args[::2], args[1::2])).get("--registry")
    if registry:  # as data in env:, never spliced into a script or a name
        where = [p for p, s in strings if registry in s]
        assert where and all(p[-2:] == ("env", "IMGFAB_REGISTRY") for p in where), where
    for path, script in runs:  # only the GHCR owner and the runner's DOCKER_CONFIG steps
        if "GITHUB_ENV" in script or "GITHUB_OUTPUT" in script:  # write GITHUB_ENV / GITHUB_OUTPUT
            from imgfab.render.ci import DOCKER_CONFIG, GHCR_OWNER

            assert script in (GHCR_OWNER, DOCKER_CONFIG), (path, script)


@pytest.mark.parametrize("owner, written", [
    ("OctoCat-1", "IMGFAB_REGISTRY=ghcr.io/octocat-1\n"), ("Evil\nIMGFAB_X=1", None),
    ("a;id", None), ("", None), ("a b", None)])
def test_the_ghcr_owner_step_refuses_an_owner_github_would_not_issue(tmp_path, owner, written):
    from imgfab.render.ci import GHCR_OWNER

    github_env = tmp_path / "github_env"
    github_env.write_text("")
    ran = subprocess.run(["bash", "-e", "-c", GHCR_OWNER], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "OWNER": owner,
                              "GITHUB_ENV": str(github_env)})
    assert github_env.read_text() == (written or "")
    assert (ran.returncode == 0) == (written is not None), ran.stderr


def test_run_step_refuses_an_expression_inside_its_script():
    from imgfab.render.ci import run_step

    assert run_step("ok", 'echo "$X"', {"X": "${{ matrix.name }}"})["env"] == {"X": "${{ matrix.name }}"}
    with pytest.raises(ValueError, match="env:"):
        run_step("bad", "echo ${{ matrix.name }}")


def test_the_login_host_comes_from_the_registry_variable(tmp_path):
    """`docker login` gets the host part of $IMGFAB_REGISTRY, as the shell computes it."""
    from imgfab.render.ci import LOGIN

    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "docker").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS"\ncat > "$ARGS.stdin"\n')
    (shims / "docker").chmod(0o755)
    args = tmp_path / "args"
    env = {"PATH": f"{shims}:{os.environ['PATH']}", "ARGS": str(args),
           "IMGFAB_REGISTRY": ODD_REGISTRY, "IMGFAB_REGISTRY_USER": "u",
           "IMGFAB_REGISTRY_PASSWORD": "p w"}
    assert subprocess.run(["bash", "-e", "-c", LOGIN], env=env).returncode == 0
    assert args.read_text().split("\n")[:2] == ["login", "registry-1.example.com:5000"]
    assert Path(f"{args}.stdin").read_text() == "p w"


@pytest.mark.parametrize("args, valid", [
    (("--registry", ODD_REGISTRY, "--gpu-runner", "gpu_h100.x-1", *ODD_RECIPES), True),
    (ODD_RECIPES, True),
    (("--registry", 'x";touch /tmp/pwn;"${{ github.event.head_commit.message }}', ODD_RECIPES[0]), False),
    (("--registry", "r.example/${{ github.event.pull_request.title }}", ODD_RECIPES[0]), False),
    (("recipes/a${{ github.event.issue.title }}b.yaml",), False),
])
def test_hostile_inputs_are_refused_or_render_a_workflow_actionlint_accepts(tmp_path, args, valid):
    """Valid inputs render a workflow actionlint finds nothing in; hostile ones are refused
    (before this guard, they rendered one where actionlint finds the injected expression)."""
    checkout = _repo_with(tmp_path / "checkout", *ODD_RECIPES,
                          "recipes/a${{ github.event.issue.title }}b.yaml")
    result = ci_github(*args, cwd=checkout)
    if result.returncode == 2 and not valid:
        return
    assert result.returncode == 0, result.stderr
    for expression in re.findall(r"\$\{\{(.*?)\}\}", result.stdout, re.DOTALL):
        assert OWN_EXPRESSIONS.fullmatch(expression.strip()), expression  # none injected
    problems = [p for p in _actionlint(tmp_path, result.stdout)
                if not (p["kind"] == "runner-label" and '"gpu_h100.x-1"' in p["message"])]
    assert problems == []
