"""Issue 36 item 5: a host driver as people paste it.

Expected answers, each from a primary source:
- NVIDIA CUDA release notes, Table 3 (Linux x86_64 toolkit driver), as the frozen matrix records it
  (tests/fixtures/compat_frozen/cuda.yaml): CUDA 13.0 GA needs 580.65.06, 13.0 Update 2 580.95.05
  (the newest R580 release recorded), 12.8 GA 570.26, 12.8 Update 1 570.124.06 (the newest R570).
- nvidia-smi's header prints "Driver Version: 580.95.05  CUDA Version: 13.0": 13.0 is the CUDA
  version the driver supports, not a driver; every Linux driver is R3xx or newer.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from imgfab.cli import cli
from imgfab.errors import RecipeError
from imgfab.matrix.compat import load_matrix
from imgfab.matrix.drivers import read_host_driver
from imgfab.recipe import DriverText, parse_recipe, read_driver_text

from conftest import FROZEN_COMPAT, FROZEN_RECIPES

RECIPE = str(FROZEN_RECIPES / "qwen2-7b-h100.yaml")


@pytest.fixture(scope="module")
def matrix():
    return load_matrix(FROZEN_COMPAT)


def _imgfab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True,
                          text=True, timeout=300)


# --- the shape alone --------------------------------------------------------------------------

@pytest.mark.parametrize("text, kind, value", [
    ("580.95.05", "version", "580.95.05"),
    ("v580.95.05", "version", "580.95.05"),
    ("V580.95.05", "version", "580.95.05"),
    ("570.86", "version", "570.86"),
    ("R580", "branch", "580"),
    ("r570", "branch", "570"),
    ("13.0", "cuda", "13.0"),
    ("12.8", "cuda", "12.8"),
    ("12.8.1", "cuda", "12.8.1"),
    ("v13.0", "cuda", "13.0"),
    ("580", "lone-branch", "580"),
])
def test_what_a_pasted_driver_is(text, kind, value):
    assert read_driver_text(text) == DriverText(kind, value)


@pytest.mark.parametrize("text", ["99.1", "4.0.1", "13", "R13", "latest", "", "580.65.06 ", "R 580",
                                  "vv580.1", "580.", None, 580])
def test_what_is_not_a_driver_is_invalid_never_an_exception(text):
    assert read_driver_text(text).kind == "invalid"


# --- against the matrix -----------------------------------------------------------------------

def test_a_v_prefix_is_read_as_the_version(matrix):
    assert read_host_driver("v580.95.05", matrix) == ("580.95.05", "")
    assert read_host_driver("V535.104.05", matrix) == ("535.104.05", "")


@pytest.mark.parametrize("text, newest", [("R580", "580.95.05"), ("r580", "580.95.05"),
                                          ("R570", "570.124.06")])
def test_a_branch_is_its_newest_release_the_matrix_knows_with_a_note(matrix, text, newest):
    driver, note = read_host_driver(text, matrix)
    assert driver == newest
    assert note.startswith(f"--driver {text} read as {newest}, the newest R{text[1:]} release")


def test_a_branch_the_matrix_knows_no_release_of_is_refused(matrix):
    with pytest.raises(RecipeError) as info:
        read_host_driver("R999", matrix)
    assert info.value.field == "--driver" and "no R999 release is known to the matrix" in str(info.value)


@pytest.mark.parametrize("text, needs", [("13.0", "CUDA 13.0 needs driver ≥ 580.65.06"),
                                         ("12.8", "CUDA 12.8 needs driver ≥ 570.26"),
                                         ("12.8.1", "CUDA 12.8.1 needs driver ≥ 570.124.06")])
def test_a_cuda_version_is_refused_saying_which_driver_it_needs(matrix, text, needs):
    with pytest.raises(RecipeError) as info:
        read_host_driver(text, matrix)
    assert info.value.field == "--driver"
    assert f"'{text}' is a CUDA version" in info.value.message and needs in info.value.message
    assert "Driver Version" in info.value.fix


def test_a_lone_branch_is_refused_naming_why_and_the_fix(matrix):
    with pytest.raises(RecipeError) as info:
        read_host_driver("580", matrix)
    assert info.value.field == "--driver" and "branch number alone" in info.value.message
    assert "write R580" in info.value.fix and "580.95.05" in info.value.fix


def test_a_driver_major_below_300_is_refused(matrix):
    with pytest.raises(RecipeError) as info:
        read_host_driver("99.1", matrix)
    assert "driver majors are 300 or newer" in info.value.message


# --- the CLI: one line, exit 2; the note on stderr, the JSON on stdout ------------------------

@pytest.mark.parametrize("text, words", [
    ("13.0", ["'13.0' is a CUDA version", "CUDA 13.0 needs driver ≥ 580.65.06"]),
    ("580", ["'580' is a driver branch number alone", "write R580"]),
])
def test_the_cli_refuses_what_is_not_a_driver_in_one_line(text, words):
    result = _imgfab("resolve", RECIPE, "--driver", text, "--compat-dir", str(FROZEN_COMPAT))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("imgfab: --driver: ") and "Traceback" not in result.stderr
    assert all(w in line for w in words), line
    assert result.stdout == ""


def test_the_cli_reads_r580_with_a_note_on_stderr_and_valid_json_on_stdout():
    result = _imgfab("resolve", RECIPE, "--driver", "R580", "--json", "--compat-dir", str(FROZEN_COMPAT))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["stack"]["fleet_driver"] == "580.95.05"
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("imgfab: note: --driver R580 read as 580.95.05")


def test_matrix_takes_a_v_prefixed_driver_and_reports_it_read():
    result = CliRunner().invoke(cli, ["matrix", "--gpu", "H100", "--driver", "v580.95.05", "--json",
                                      "--compat-dir", str(FROZEN_COMPAT)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["host"]["driver"] == "580.95.05"


# --- the recipe's floor ------------------------------------------------------------------------

def _recipe(driver: str) -> dict:
    data = yaml.safe_load((FROZEN_RECIPES / "qwen2-7b-h100.yaml").read_text())
    data["target"]["driver"] = driver
    return data


@pytest.mark.parametrize("floor, words", [(">=13.0", "names CUDA 13.0"), (">=12.8", "names CUDA 12.8"),
                                          (">=580", "is a driver branch alone"),
                                          (">= 570", "is a driver branch alone")])
def test_the_recipe_floor_refuses_a_cuda_version_and_a_lone_branch(floor, words):
    with pytest.raises(RecipeError) as info:
        parse_recipe(_recipe(floor))
    assert info.value.field == "target.driver" and words in str(info.value)


def test_the_recipe_floor_still_takes_a_release():
    assert parse_recipe(_recipe(">=580.65.06")).target.driver_floor == "580.65.06"
    assert parse_recipe(_recipe(">=570.86")).target.driver_floor == "570.86"
