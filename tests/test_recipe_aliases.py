"""Aliases that name one quantization are answered with it; those that name several are refused
with the choices (issue 36, item 7): W8A8 is FP8 as much as INT8 SmoothQuant, W4A16 and int4 are
GPTQ as much as AWQ, int8 is a W8A16 GPTQ checkpoint as much as SmoothQuant, fp4 is MXFP4 as
much as NVFP4. Expected lines are written out by hand."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml

from conftest import FROZEN_COMPAT, REPO
from imgfab.errors import RecipeError
from imgfab.recipe import ALIASES, Quantization, parse_recipe
from imgfab.stack.resolve import fits_host

LOCKED = REPO / "recipes/qwen2-7b-h100.yaml"


def imgfab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def base() -> dict:
    return yaml.safe_load(LOCKED.read_text())


def _refusal(base: dict, typed: str) -> RecipeError:
    data = copy.deepcopy(base)
    data["engine"]["quantization"] = typed
    with pytest.raises(RecipeError) as caught:
        parse_recipe(data)
    return caught.value


@pytest.mark.parametrize("typed, line", [
    ("w8a8", "engine.quantization: w8a8 is ambiguous: fp8 or int8_sq; fix: write the one the "
             "checkpoint is: quantization: fp8 (FP8 weights and activations); quantization: "
             "int8_sq (INT8 weights and activations, SmoothQuant)"),
    ("W4A16", "engine.quantization: W4A16 is ambiguous: gptq or int4_awq; fix: write the one the "
              "checkpoint is: quantization: gptq (a GPTQ checkpoint, 4- or 8-bit weights); "
              "quantization: int4_awq (AWQ 4-bit weights)"),
])
def test_an_ambiguous_alias_is_one_line_with_every_choice(base, typed, line):
    error = _refusal(base, typed)
    assert error.field == "engine.quantization" and error.exit_code == 2
    assert error.one_line() == line


@pytest.mark.parametrize("typed, message", [
    ("w8a8", "w8a8 is ambiguous: fp8 or int8_sq"),
    ("w4a16", "w4a16 is ambiguous: gptq or int4_awq"),
    ("int4", "int4 is ambiguous: gptq or int4_awq"),
    ("int8", "int8 is ambiguous: gptq or int8_sq"),
    ("fp4", "fp4 is ambiguous: mxfp4 or nvfp4"),
    (" FP4 ", "FP4 is ambiguous: mxfp4 or nvfp4"),
])
def test_each_ambiguous_alias_names_its_choices(base, typed, message):
    error = _refusal(base, typed)
    assert error.field == "engine.quantization"
    assert error.message == message
    assert "write quantization: " not in (error.fix or "")  # no one choice is offered as the fix


@pytest.mark.parametrize("typed, fix", [
    ("awq", "write quantization: int4_awq (AWQ 4-bit weights)"),
    ("int4-awq", "write quantization: int4_awq (AWQ 4-bit weights)"),
    ("GPTQ", "write quantization: gptq (a GPTQ checkpoint: vLLM reads its bits from the checkpoint)"),
    ("gptq-int4", "write quantization: gptq (a GPTQ checkpoint: vLLM reads its bits from the checkpoint)"),
    ("smoothquant", "write quantization: int8_sq (SmoothQuant W8A8)"),
    ("fp8_e4m3", "write quantization: fp8 (FP8 E4M3)"),
    ("bf16", "write quantization: none (no quantization: dtype bfloat16)"),
])
def test_an_unambiguous_alias_is_still_answered_with_its_value(base, typed, fix):
    error = _refusal(base, typed)
    assert error.field == "engine.quantization" and error.fix == fix
    assert "ambiguous" not in error.message


def test_the_tables_name_real_values_and_no_alias_twice():
    from imgfab.recipe import AMBIGUOUS_ALIASES

    values = {q.value for q in Quantization}
    one = ALIASES["engine.quantization"]
    several = AMBIGUOUS_ALIASES["engine.quantization"]
    assert sorted(several) == ["fp4", "int4", "int8", "w4a16", "w8a8"]
    assert not set(one) & set(several)
    assert {exact for exact, _ in one.values()} <= values
    for typed, choices in several.items():
        names = [exact for exact, _ in choices]
        assert len(names) >= 2 and names == sorted(names), typed
        # mxfp4 is the one choice imgfab does not serve yet, and its meaning says so
        assert set(names) - values <= {"mxfp4"}, typed
    assert "not an engine.quantization imgfab serves yet" in dict(several["fp4"])["mxfp4"]


def test_resolve_refuses_an_ambiguous_alias_in_one_line(tmp_path, base):
    data = copy.deepcopy(base)
    data["engine"]["quantization"] = "w8a8"
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    result = imgfab("resolve", str(path))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("imgfab: engine.quantization: w8a8 is ambiguous: fp8 or int8_sq; fix: "), line
    checked = imgfab("validate", str(path), "--json")
    assert checked.returncode == 2
    (error,) = json.loads(checked.stdout)["recipes"][0]["errors"]
    assert error["field"] == "engine.quantization"
    assert error["message"] == "w8a8 is ambiguous: fp8 or int8_sq"
    assert path.read_text() == yaml.safe_dump(data)  # validation never rewrites the file


def test_an_ambiguous_alias_beside_a_bad_top_level_field(base):
    data = copy.deepcopy(base)
    data["name"] = "Bad_Name"
    data["engine"]["quantization"] = "w8a8"
    with pytest.raises(RecipeError) as caught:
        parse_recipe(data)
    fields = {field: (message, fix) for field, message, fix in caught.value.problems}
    assert sorted(fields) == ["engine.quantization", "name"]
    assert fields["engine.quantization"][0] == "w8a8 is ambiguous: fp8 or int8_sq"
    assert fields["name"][1] is None


def test_explain_says_which_aliases_are_refused():
    result = imgfab("explain", "engine.quantization")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert ("  'w8a8' is ambiguous, refused: fp8 (FP8 weights and activations) or int8_sq "
            "(INT8 weights and activations, SmoothQuant)") in lines
    assert ("  'w4a16' is ambiguous, refused: gptq (a GPTQ checkpoint, 4- or 8-bit weights) or "
            "int4_awq (AWQ 4-bit weights)") in lines
    assert not any("'w8a8' is written" in x or "'fp4' is written" in x for x in lines)
    assert "  'awq' is written int4_awq (AWQ 4-bit weights)" in lines
    # the description calls fp8 W8A8 and GPTQ W4A16 too, as the refusals do
    assert "fp8 (W8A8 FP8" in lines[0] and "gptq (a GPTQ checkpoint, W4A16 or W8A16)" in lines[0]


@pytest.mark.parametrize("precision, message, fix", [
    ("w8a8", "w8a8 is ambiguous: fp8 or int8_sq",
     "name the one the checkpoint is: --precision fp8 or --precision int8_sq"),
    ("fp4", "fp4 is ambiguous: mxfp4 or nvfp4",
     "name the one the checkpoint is: mxfp4 (not a precision imgfab checks yet) or --precision nvfp4"),
    ("awq", "unknown precision 'awq'", "write --precision int4_awq"),
    ("fp9", "unknown precision 'fp9'",
     "one of auto, bf16, fp16, fp8, gptq, int4_awq, int8_sq, kv_fp8, none, nvfp4"),
])
def test_matrix_precision_refuses_what_it_cannot_check(frozen_matrix, precision, message, fix):
    with pytest.raises(RecipeError) as caught:
        fits_host(frozen_matrix, "H100", "580.95.05", "strict", precision)
    assert caught.value.field == "--precision"
    assert caught.value.message == message and caught.value.fix == fix


def test_matrix_precision_still_checks_a_known_one(frozen_matrix):
    rows = fits_host(frozen_matrix, "T4", "580.95.05", "strict", "fp8")
    assert rows and not any(fields for release, fields, _ in rows
                            if release.backend == "tensorrt-llm")  # fp8 needs 8.9 there


def test_matrix_cli_refuses_an_ambiguous_precision_in_one_line():
    result = imgfab("matrix", "--gpu", "H100", "--driver", "580.95.05", "--precision", "w8a8",
                    "--compat-dir", str(FROZEN_COMPAT))
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line == ("imgfab: --precision: w8a8 is ambiguous: fp8 or int8_sq; fix: name the one "
                    "the checkpoint is: --precision fp8 or --precision int8_sq")
