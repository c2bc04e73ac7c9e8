"""One --json contract (issue 23): every command's output is one object with schema_version and
command, the failure inside it too, the exit code unchanged; each validates against the
published schema (`imgfab schema --of output`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import jsonschema
import pytest

from conftest import RECIPES, REPO

LOCKED = REPO / "recipes/qwen2-7b-h100.yaml"
REFUSED = sorted(r for r in RECIPES if "# refused:" in r.with_suffix(".lock").read_text())


def imgfab(*args: str, cwd=None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300, input=stdin)


@pytest.fixture(scope="module")
def validator():
    from imgfab.output import output_schema

    schema = output_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def answer(validator, command: str, *args: str, code: int, cwd=None, stdin=None) -> dict:
    """Run ``imgfab *args --json``: exit ``code``, stdout exactly one object of ``command``
    that the schema accepts, and on failure the same one line on stderr as in the object."""
    result = imgfab(*args, "--json", cwd=cwd, stdin=stdin)
    assert result.returncode == code, (result.returncode, result.stderr[-2000:])
    doc = json.loads(result.stdout)  # one object: json.loads refuses trailing text
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]
    assert doc["schema_version"] == 1 and doc["command"] == command
    assert doc["ok"] is (code == 0) and doc["exit_code"] == code
    if code:
        assert f"imgfab: {doc['error']['line']}" in result.stderr.splitlines(), result.stderr
    else:
        assert "error" not in doc
    return doc


def test_the_schema_is_strict(validator):
    """The validator is not a pass-through: a missing envelope field, an unknown field, an
    error-less failure and a success with an error are all refused."""
    good = {"schema_version": 1, "command": "bases", "ok": True, "exit_code": 0, "images": []}
    assert validator.is_valid(good)
    for broken in ({k: v for k, v in good.items() if k != "schema_version"},
                   {**good, "surprise": 1}, {**good, "ok": False, "exit_code": 2},
                   {**good, "error": {"message": "m", "field": None, "fix": None, "line": "m", "step": None}},
                   {**good, "images": "x"}, {k: v for k, v in good.items() if k != "images"},
                   {**good, "command": "nonsense"}):
        assert not validator.is_valid(broken), broken


def test_resolve_success_and_failure(validator):
    # backend.version ==0.26.0: the newer releases are rejected candidates
    doc = answer(validator, "resolve", "resolve", str(REPO / "recipes/qwen2-7b-h200.yaml"), code=0)
    assert doc["stack"]["backend"] == "vllm" and doc["rejected"]
    failed = answer(validator, "resolve", "resolve", str(LOCKED), "--driver", "400.1.1", code=2)
    assert failed["stack"] is None and failed["error"]["field"] == "target.driver"
    # every rejection, each with the constraint that eliminated it, as the message counts them
    count = int(failed["error"]["message"].split(" candidates rejected")[0].rsplit(" ", 1)[1])
    assert len(failed["rejected"]) == count > 10
    # driver, but for the releases compat/payloads.yaml records as not installing (a payload
    # rejection holds on any driver: vLLM 0.8.0-0.8.2, 0.22.0-0.25.1)
    assert {r["constraint"] for r in failed["rejected"]} == {"driver", "payload"}


def test_bad_recipe_is_an_object_too(validator, tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(LOCKED.read_text() + "colour: red\n")
    for command in ("resolve", "render", "bases", "validate"):
        doc = answer(validator, command, command, str(recipe), code=2)
        if command != "validate":
            assert doc["error"]["field"] == "colour"


def test_render(validator, tmp_path):
    doc = answer(validator, "render", "render", str(LOCKED), "-o", str(tmp_path / "out"), code=0)
    assert doc["locked"] is True and "Dockerfile" in doc["files"]
    unlocked = tmp_path / LOCKED.name
    shutil.copy(LOCKED, unlocked)
    failed = answer(validator, "render", "render", str(unlocked), "-o", str(tmp_path / "o2"), code=2)
    assert failed["error"]["field"] == "lock"


def test_matrix_is_an_object_with_host_and_policy(validator):
    doc = answer(validator, "matrix", "matrix", "--gpu", "H100", "--driver", "550.54.15", code=0)
    assert doc["host"] == {"gpu": "H100", "driver": "550.54.15", "policy": "strict", "precision": "auto"}
    assert any(s["fits"] for s in doc["stacks"]) and any(not s["fits"] for s in doc["stacks"])
    # forward-compat, as target.driver_policy: R535 is a forward-compatibility branch, R550 not
    fc = answer(validator, "matrix", "matrix", "--gpu", "H100", "--driver", "535.104.05",
                "--policy", "forward-compat", code=0)
    assert fc["host"]["policy"] == "forward-compat" and any(s["fits"] for s in fc["stacks"])
    strict = answer(validator, "matrix", "matrix", "--gpu", "H100", "--driver", "535.104.05", code=0)
    assert sum(s["fits"] for s in fc["stacks"]) > sum(s["fits"] for s in strict["stacks"])


def test_schema_of_both_kinds_and_output_file(validator, tmp_path):
    assert answer(validator, "schema", "schema", code=0)["schema"]["title"] == "imgfab recipe"
    target = tmp_path / "output.schema.json"
    doc = answer(validator, "schema", "schema", "--of", "output", "--output", str(target), code=0)
    assert doc["schema"] is None and doc["output"] == str(target)
    from imgfab.output import output_schema

    assert json.loads(target.read_text()) == output_schema()
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no staging file left
    target.write_text("old")  # a second run replaces the file in one rename
    assert imgfab("schema", "--output", str(target)).returncode == 0
    assert json.loads(target.read_text())["title"] == "imgfab recipe"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
    failed = answer(validator, "schema", "schema", "--output", str(tmp_path / "no/such/dir/x.json"), code=1)
    assert failed["error"]["field"] == "--output"


def test_bases_bake_ci(validator, tmp_path):
    assert answer(validator, "bases", "bases", str(LOCKED), code=0)["images"]
    doc = answer(validator, "bake", "bake", str(LOCKED), "-o", str(tmp_path / "bake.json"), code=0)
    assert json.loads((tmp_path / "bake.json").read_text())["target"]
    assert doc["output"] == str(tmp_path / "bake.json")
    ci = answer(validator, "ci github", "ci", "github", "--imgfab-path", ".", cwd=REPO, code=0)
    assert "jobs:" in ci["workflow"] and {e["path"] for e in ci["left_out"]} == {
        str(p.relative_to(REPO)) for p in REFUSED}


def test_lock_check(validator, tmp_path):
    doc = answer(validator, "lock", "lock", "--check", str(LOCKED), code=0)
    assert doc["check"] is True and doc["locks"][0]["current"] is True
    refused = answer(validator, "lock", "lock", "--check", str(REFUSED[0]), code=2)
    assert refused["locks"][0]["refused"] and "refused" in refused["error"]["message"]
    allowed = answer(validator, "lock", "lock", "--check", "--allow-refused", str(REFUSED[0]), code=0)
    assert allowed["locks"][0]["refused"]
    unlocked = tmp_path / LOCKED.name
    shutil.copy(LOCKED, unlocked)
    missing = answer(validator, "lock", "lock", "--check", str(unlocked), str(LOCKED), code=1)
    assert [e["current"] for e in missing["locks"]] == [False, True]


def test_build_failure_is_an_object_with_its_step(validator, tmp_path):
    """One recipe or several: the same shape; the failing recipe names its step, the rest are
    listed as not built (the rendered workflow uploads this object)."""
    unlocked = tmp_path / LOCKED.name
    shutil.copy(LOCKED, unlocked)
    for recipes in ([unlocked], [unlocked, LOCKED]):
        doc = answer(validator, "build", "build", *map(str, recipes), "-o", str(tmp_path / "ctx"),
                     code=2)
        (failed,) = doc["images"]
        assert failed["ok"] is False and failed["error"]["step"] == "lock"
        assert doc["error"] == failed["error"] and doc["not_built"] == [str(r) for r in recipes[1:]]
    baked = answer(validator, "build", "build", str(LOCKED), "--bake", str(tmp_path / "b.json"), code=0)
    assert baked["bake"] == str(tmp_path / "b.json") and baked["images"] == []


def test_environment_failures_are_objects(validator, tmp_path):
    """A registry that does not answer: exit 1, and the object says why."""
    dead = "127.0.0.1:9"
    doc = answer(validator, "select", "select", "--registry", f"{dead}/x", "--driver", "550.54.15",
                 "--gpu", "H100", code=1)
    assert doc["error"]["line"]
    answer(validator, "push", "push", "x/y:z", "--registry", dead, code=1)


def test_usage_errors_are_objects(validator, tmp_path):
    doc = answer(validator, "smoke", "smoke", "img:tag", code=2)
    assert doc["error"]["field"] == "--weights"
    doc = answer(validator, "matrix", "matrix", "--gpu", "H100", "--driver", "550.54.15",
                 "--policy", "sideways", code=2)
    assert "sideways" in doc["error"]["message"]
    answer(validator, "compat refresh", "compat", "refresh", "--compat-dir", str(tmp_path / "none"), code=2)


def test_doctor_is_an_object(validator):
    result = imgfab("doctor", "--json")
    doc = json.loads(result.stdout)
    assert not list(validator.iter_errors(doc))
    assert doc["command"] == "doctor" and doc["exit_code"] == result.returncode
    assert doc["findings"] and all(f["severity"] in ("ok", "info", "warn", "error") for f in doc["findings"])
    assert doc["ok"] is (result.returncode == 0)


def test_select_candidates_carry_constraint_and_fix():
    from imgfab.in_image.rules import Verdict
    from imgfab.ops.select import Candidate, Published

    image = Published("r/x", "t", "sha256:" + "0" * 64, {})
    failing = Candidate(image, [Verdict(True, "gpu", "ok"),
                                Verdict(False, "driver", "host 535 < 550", "upgrade to ≥ 550")])
    assert failing.rejection() == {"constraint": "driver", "fix": "upgrade to ≥ 550"}
    assert Candidate(image, [Verdict(True, "gpu", "ok")]).rejection() == {"constraint": "", "fix": ""}


def test_first_steps_are_objects(validator, tmp_path):
    revision = "f2826a00ceef68f0f2b946d945ecc0477ce4450c"
    init = ("init", "--model", "Qwen/Qwen2-7B-Instruct", "--revision", revision, "--gpu", "H100",
            "--driver", "580.65.06", "-o", str(tmp_path / "r.yaml"))
    doc = answer(validator, "init", *init, code=0)
    assert doc["recipe"] == str(tmp_path / "r.yaml") and doc["stack"]["backend"] == "vllm"
    assert answer(validator, "init", *init, code=2)["error"]["field"] == "--output"
    checked = answer(validator, "validate", "validate", str(tmp_path / "r.yaml"), code=0)
    assert checked["recipes"] == [{"path": str(tmp_path / "r.yaml"), "ok": True, "errors": [], "advisories": []}]
    listed = answer(validator, "list", "list", str(tmp_path), code=0)
    assert [r["lock"] for r in listed["recipes"]] == ["missing"]
    explained = answer(validator, "explain", "explain", "engine.quantization", code=0)
    assert "int4_awq" in explained["choices"] and explained["default"] == "none"
    answer(validator, "explain", "explain", "no.such", code=2)
