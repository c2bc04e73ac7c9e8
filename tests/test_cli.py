"""The CLI: exit codes, one-line errors, nothing written on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import RECIPES, REPO


def imgfab(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True, text=True,
                          cwd=cwd)


def test_resolve_prints_stack_and_rejections():
    result = imgfab("resolve", str(REPO / "recipes/qwen2-7b-h100.yaml"), "--driver", "535.104.05")
    assert result.returncode == 0, result.stderr
    assert "driver floor" in result.stdout and "minor-compat" in result.stdout
    assert "NVIDIA_REQUIRE_CUDA" in result.stdout


def test_resolve_json():
    result = imgfab("resolve", str(REPO / "recipes/qwen2-7b-h100.yaml"), "--json")
    data = json.loads(result.stdout)
    assert data["stack"]["backend"] == "vllm"
    assert isinstance(data["rejected"], list)


def test_matrix_lists_fits_and_misfits():
    result = imgfab("matrix", "--gpu", "H100", "--driver", "550.54.15")
    assert result.returncode == 0, result.stderr
    assert "fits (" in result.stdout and "does not fit (" in result.stdout
    assert "driver" in result.stdout


def test_schema_command():
    schema = json.loads(imgfab("schema").stdout)
    assert schema["title"] == "imgfab recipe"


def test_bases_lists_upstream_refs():
    result = imgfab("bases", *map(str, RECIPES))
    assert result.returncode == 0, result.stderr
    refs = result.stdout.split()
    assert refs and all(r.startswith("nvidia/cuda:") for r in refs)
    assert any("-devel-" in r for r in refs)


@pytest.mark.parametrize("change, field", [
    ({"engine": {"quantization": "fp8", "dtype": "float16"},
      "target": {"gpu": "V100", "driver": ">=580.65.06"}}, "engine.quantization"),
    ({"colour": "red"}, "colour"),
    ({"target": {"gpu": "GTX-9999"}}, "target.gpu"),
    ({"target": {"driver": ">=418.39"}}, "target.driver"),
    ({"model": {"id": "a/b; rm -rf /"}}, "model.id"),
])
def test_bad_recipe_exit_2_one_line_nothing_written(tmp_path, change, field):
    data = yaml.safe_load((REPO / "recipes/qwen2-7b-h100.yaml").read_text())
    for key, value in change.items():
        if isinstance(value, dict):
            data[key].update(value)
        else:
            data[key] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    before = path.read_bytes()
    out = tmp_path / "out"
    result = imgfab("render", str(path), "--output", str(out))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"imgfab: {field}:"), result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]
    assert path.read_bytes() == before, "validation never rewrites the user's file"


def test_bad_driver_flag():
    result = imgfab("resolve", str(REPO / "recipes/qwen2-7b-h100.yaml"), "--driver", "latest")
    assert result.returncode == 2 and result.stderr.startswith("imgfab: --driver:")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_property_garbage_files_exit_2(tmp_path_factory, text):
    directory = tmp_path_factory.mktemp("garbage")
    path = directory / "r.yaml"
    path.write_text(text)
    result = imgfab("render", str(path), "--output", str(directory / "out"))
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (directory / "out").exists()
