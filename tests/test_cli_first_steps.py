"""First steps (issue 23): imgfab init, validate, list, explain; a schema that explains every
field; the values users type under another spelling answered with the exact one; every failing
field named."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
import yaml

from conftest import RECIPES, REPO

LOCKED = REPO / "recipes/qwen2-7b-h100.yaml"
REFUSED = sorted(r for r in RECIPES if "# refused:" in r.with_suffix(".lock").read_text())
REVISION = "f2826a00ceef68f0f2b946d945ecc0477ce4450c"
# R580.65: under strict it reaches CUDA 12.8 only (vLLM 0.19.1, inside the critical
# CVE-2026-48746), under minor-compat CUDA 13 (vLLM 0.33.0). (R535, the demo's fleet, fits
# outside every critical advisory only under forward-compat: tests/stack/test_advisories.py.)
INIT = ("init", "--model", "Qwen/Qwen2-7B-Instruct", "--revision", REVISION, "--gpu", "H100",
        "--driver", "580.65.06")


def imgfab(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300, stdin=subprocess.DEVNULL)


# --- init ------------------------------------------------------------------------------------

def test_init_writes_a_commented_recipe_that_validates_and_resolves(tmp_path):
    result = imgfab(*INIT, "--precision", "fp8", "--policy", "minor-compat", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (written,) = (tmp_path / "recipes").iterdir()
    assert written.name == "qwen2-7b-instruct-h100-sxm.yaml"
    text = written.read_text()
    assert text.startswith("# qwen2-7b-instruct-h100-sxm: Qwen/Qwen2-7B-Instruct on H100-SXM")
    assert sum(line.lstrip().startswith("#") for line in text.splitlines()) >= 5
    data = yaml.safe_load(text)
    assert data["model"]["revision"] == REVISION and data["engine"]["quantization"] == "fp8"
    assert data["target"] == {"gpu": "H100-SXM", "count": 1, "driver": ">=580.65.06",
                              "driver_policy": "minor-compat"}
    assert "resolves to vllm" in result.stdout and f"imgfab lock {written.relative_to(tmp_path)}" in result.stdout
    checked = imgfab("validate", str(written))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    resolved = imgfab("resolve", str(written), "--json")
    assert resolved.returncode == 0 and json.loads(resolved.stdout)["stack"]["precision"] == "fp8"


def test_init_takes_minor_compat_only_when_strict_cannot_fit(tmp_path):
    """H100 on R580.65: under strict only a stack inside a critical advisory fits. Without
    --policy the starter says minor-compat and why; with --policy strict it is exit 2 with the
    resolver's fix."""
    result = imgfab(*INIT, "-o", str(tmp_path / "r.yaml"))
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "r.yaml").read_text()
    assert yaml.safe_load(text)["target"]["driver_policy"] == "minor-compat"
    assert "under strict this driver fits only stacks inside a critical advisory" in text
    assert "(minor-compat)" in result.stdout
    v100 = imgfab(*INIT[:5], "--gpu", "V100", "--driver", "535.104.05", "-o", str(tmp_path / "v.yaml"))
    assert v100.returncode == 2 and not (tmp_path / "v.yaml").exists()
    strict = imgfab(*INIT, "--policy", "strict", "-o", str(tmp_path / "s.yaml"))
    assert strict.returncode == 2 and "fix: target.driver_policy: minor-compat" in strict.stderr
    assert not (tmp_path / "s.yaml").exists()
    newer = imgfab(*INIT[:7], "--driver", "580.95.05", "-o", str(tmp_path / "n.yaml"))
    assert newer.returncode == 0, newer.stderr
    assert yaml.safe_load((tmp_path / "n.yaml").read_text())["target"]["driver_policy"] == "strict"


def test_init_never_overwrites_without_force(tmp_path):
    target = tmp_path / "mine.yaml"
    target.write_text("# my own recipe\n")
    result = imgfab(*INIT, "-o", str(target))
    assert result.returncode == 2 and "--output" in result.stderr and "--force" in result.stderr
    assert target.read_text() == "# my own recipe\n"
    forced = imgfab(*INIT, "-o", str(target), "--force")
    assert forced.returncode == 0, forced.stderr
    assert yaml.safe_load(target.read_text())["name"] == "qwen2-7b-instruct-h100-sxm"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]  # no staging file left


def test_init_writes_nothing_for_a_recipe_that_cannot_build(tmp_path):
    target = tmp_path / "r.yaml"
    # fp8 needs compute capability 7.5 (weight-only below 8.9); the V100 is 7.0: no stack fits,
    # nothing is written
    result = imgfab(*INIT[:5], "--gpu", "V100", "--driver", "550.54.15", "--precision", "fp8",
                    "-o", str(target))
    assert result.returncode == 2 and "fp8" in result.stderr, result.stderr
    assert not target.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, flag", [
    (("init", "--model", "Qwen/Qwen2-7B-Instruct", "--gpu", "H100", "--driver", "535.104.05"), "--revision"),
    (("init", "--gpu", "H100"), "--model"),
    ((*INIT[:7], "--driver", "535 .1"), "--driver"),
    ((*INIT[:5], "--gpu", "GTX-9999", "--driver", "535.104.05"), "--gpu"),
    ((*INIT, "--name", "Bad_Name"), "--name"),
])
def test_init_names_the_flag_to_fix(tmp_path, args, flag):
    result = imgfab(*args, "-o", str(tmp_path / "r.yaml"))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"imgfab: {flag}") and "fix:" in line, line
    assert not (tmp_path / "r.yaml").exists()


# --- validate: every failing field -------------------------------------------------------------

def _bad_recipe(tmp_path):
    data = yaml.safe_load(LOCKED.read_text())
    data["name"] = "Bad_Name"
    data["engine"].update(quantization="awq", dtype="bf16")
    data["serve"]["port"] = 80
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_an_error_names_every_failing_field(tmp_path):
    path = _bad_recipe(tmp_path)
    result = imgfab("resolve", str(path))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "more)" not in line
    for field in ("name:", "engine.dtype:", "engine.quantization:", "serve.port:"):
        assert field in line, (field, line)
    assert "write quantization: int4_awq" in line and "write dtype: bfloat16" in line


def test_validate_lists_every_field_of_every_recipe(tmp_path):
    path = _bad_recipe(tmp_path)
    result = imgfab("validate", str(LOCKED), str(path), "--json")
    assert result.returncode == 2
    good, bad = json.loads(result.stdout)["recipes"]
    assert good == {"path": str(LOCKED), "ok": True, "errors": [], "advisories": []}
    assert [e["field"] for e in bad["errors"]] == ["name", "engine.dtype", "engine.quantization", "serve.port"]
    quant = bad["errors"][2]
    assert quant["fix"] == "write quantization: int4_awq (AWQ 4-bit weights)"
    plain = imgfab("validate", str(path))
    assert plain.returncode == 2 and plain.stdout.count("\n  ") == 4


def test_validate_also_resolves(tmp_path):
    data = yaml.safe_load(LOCKED.read_text())
    data["target"]["gpu"] = "V100"  # fp8 on compute capability 7.0: no stack
    data["engine"]["dtype"] = "float16"  # (the V100 has no bfloat16: that would be found first)
    path = tmp_path / "v100.yaml"
    path.write_text(yaml.safe_dump(data))
    result = imgfab("validate", str(path), "--json")
    assert result.returncode == 2
    (error,) = json.loads(result.stdout)["recipes"][0]["errors"]
    assert error["field"] == "engine.quantization"
    assert all(imgfab("validate", str(r)).returncode == 0 for r in RECIPES[:2])


@pytest.mark.parametrize("typed, fix", [
    ("awq", "write quantization: int4_awq"),
    ("AWQ", "write quantization: int4_awq"),
    ("GPTQ", "write quantization: gptq"),
    ("smoothquant", "write quantization: int8_sq"),
])
def test_aliases_are_answered_with_the_exact_value(tmp_path, typed, fix):
    data = yaml.safe_load(LOCKED.read_text())
    data["engine"]["quantization"] = typed
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    result = imgfab("validate", str(path), "--json")
    (error,) = json.loads(result.stdout)["recipes"][0]["errors"]
    assert error["field"] == "engine.quantization" and fix in error["fix"], error
    assert path.read_text() == yaml.safe_dump(data)  # validation never rewrites the file


# --- the schema and explain ----------------------------------------------------------------------

def _properties():
    from imgfab.recipe import recipe_json_schema

    schema = recipe_json_schema()
    nodes = [("recipe", schema)] + list(schema["$defs"].items())
    return schema, [(f"{name}.{prop}", spec) for name, node in nodes
                    for prop, spec in node.get("properties", {}).items()]


def test_every_property_has_a_description_and_examples_that_validate():
    schema, properties = _properties()
    assert len(properties) >= 40
    for name, spec in properties:
        assert spec.get("description", "").strip(), f"{name} has no description"
        assert spec.get("examples"), f"{name} has no example"
        check = {"$defs": schema["$defs"], **{k: v for k, v in spec.items() if k != "examples"}}
        for example in spec["examples"]:
            jsonschema.validate(example, check, cls=jsonschema.Draft202012Validator)
    described = dict(properties)["TargetSpec.pipeline_parallel"]["description"]
    assert "pipeline" in described.lower()


def test_explain_a_field():
    result = imgfab("explain", "target.pipeline_parallel")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("target.pipeline_parallel: Pipeline-parallel stages")
    assert '  default: 1' in result.stdout and "examples:" in result.stdout
    quant = imgfab("explain", "engine.quantization")
    assert "'awq' is written int4_awq" in quant.stdout and '"int4_awq"' in quant.stdout
    wrong = imgfab("explain", "quantization")
    assert wrong.returncode == 2 and "did you mean engine.quantization" in wrong.stderr


def test_explain_lists_every_field():
    from imgfab.recipe import recipe_fields

    result = imgfab("explain")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert len(lines) == len(recipe_fields()) >= 44
    assert all(": " in line and line.split(": ", 1)[1] for line in lines)
    assert any(line.startswith("serve.presets.<key>.max_num_seqs: ") for line in lines)


# --- list ----------------------------------------------------------------------------------------

def test_list_says_each_recipe_and_its_lock(tmp_path):
    result = imgfab("list", "--json", cwd=REPO)
    assert result.returncode == 0, result.stderr
    rows = {r["path"]: r for r in json.loads(result.stdout)["recipes"]}
    assert set(rows) == {str(r.relative_to(REPO)) for r in RECIPES}
    for recipe in RECIPES:
        row = rows[str(recipe.relative_to(REPO))]
        assert row["lock"] == ("refused" if recipe in REFUSED else "current"), row
    assert rows["recipes/qwen2-7b-h100.yaml"]["precision"] == "fp8"
    (tmp_path / "a.yaml").write_text(LOCKED.read_text())
    (tmp_path / "b.yaml").write_text("name: [\n")
    mine = {r["path"]: r for r in json.loads(imgfab("list", str(tmp_path), "--json").stdout)["recipes"]}
    assert mine[str(tmp_path / "a.yaml")]["lock"] == "missing"
    assert mine[str(tmp_path / "b.yaml")]["lock"] == "invalid"
    assert mine[str(tmp_path / "b.yaml")]["error"]["field"] == "recipe"
    plain = imgfab("list", cwd=REPO)
    assert "recipes/qwen2-7b-h100.yaml: Qwen/Qwen2-7B-Instruct on H100-SXM, vllm, fp8; lock current" in plain.stdout
    assert imgfab("list", str(tmp_path / "none")).returncode == 2


def test_init_asks_on_a_terminal(tmp_path):
    """No flags, a terminal: init prompts for each answer (defaults for backend and
    precision) and writes what was answered."""
    import os
    import pty
    import select
    import time

    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "imgfab.cli", "init", "-o", str(tmp_path / "r.yaml")],
                               stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path, close_fds=True)
    os.close(slave)
    answers = iter(["Qwen/Qwen2-7B-Instruct", REVISION, "L40S", "580.65.06", "", "int4_awq"])
    seen, deadline = b"", time.monotonic() + 120
    prompts = 0
    while process.poll() is None and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        seen += chunk
        while seen.count(b": ") > prompts:  # each prompt ends with ': ' (click.prompt)
            prompts += 1
            os.write(master, (next(answers, "") + "\n").encode())
    process.wait(timeout=60)
    os.close(master)
    text = seen.decode(errors="replace")
    assert process.returncode == 0, text
    for prompt in ("Model", "Pinned revision", "Target GPU", "Fleet's oldest driver", "Backend [vllm]",
                   "Precision [none]"):
        assert prompt in text, (prompt, text)
    data = yaml.safe_load((tmp_path / "r.yaml").read_text())
    assert data["target"]["gpu"] == "L40S" and data["engine"]["quantization"] == "int4_awq"
    assert data["backend"]["name"] == "vllm" and data["target"]["driver"] == ">=580.65.06"
