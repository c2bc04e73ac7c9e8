"""The newest stack locks (issue 32): a family split across releases is bounded to the stack's
CUDA major, so `imgfab lock` finds the payload that installs cleanly.

The fake index reproduces what uv met for vLLM 0.33.0 on PyPI (2026-12-04): flashinfer-python
asks only for ``cuda-python>=12.0``; torch needs ``cuda-bindings``. ``cuda-python`` 12.6.2.post1
is the old monolithic package that installs ``cuda/bindings/`` itself; 13.4.4 is the metapackage
over ``cuda-bindings~=13.4.4``. Unbounded, uv takes the newest cuda-bindings (13.5.0) and the
monolith beside it: two distributions writing one tree, which the lock refuses. With
compat/payload.yaml's constraints for CUDA 13 it takes cuda-python 13.4.4 with cuda-bindings
13.4.4, and the lock header names the bound.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))

if not os.environ.get("IMGFAB_TEST_INDEX_ROOT"):
    if os.environ.get("CI") == "true":
        pytest.fail("IMGFAB_TEST_INDEX_ROOT is unset under CI=true: the local stack's index is missing "
                    "(scripts/local-stack.sh up)", pytrace=False)
    pytest.skip("IMGFAB_TEST_INDEX_ROOT unset: source .stack/env to run the integration tests",
                allow_module_level=True)

# name -> [(version, Requires-Dist, extra files)]
FAMILY = {
    "vllm": [("0.33.0", ("flashinfer-python",), {})],
    "flashinfer-python": [("0.7.2.post1", ("cuda-python>=12.0",), {})],
    "torch": [("2.14.0", ("cuda-bindings>=13.0", "cuda-toolkit[cudart]==13.0.3"), {})],
    "cuda-bindings": [("13.4.4", (), {"cuda/bindings/__init__.py": "__version__ = '13.4.4'\n"}),
                      ("13.5.0", (), {"cuda/bindings/__init__.py": "__version__ = '13.5.0'\n"})],
    "cuda-python": [("12.6.2.post1", (), {"cuda/bindings/__init__.py": "# the monolith's own\n",
                                          "cuda/cuda.py": "# monolithic cuda-python 12.6\n"}),
                    ("13.4.4", ("cuda-bindings~=13.4.4",), {})],
}


def _family_index(folder: Path) -> None:
    from fake_payload import FAKE_UPLOAD_TIME, installer_wheel, make_wheel, project_json, write_index

    # the toolchain wheels the stack pins (cuda-toolkit[cccl,crt,nvcc,nvvm]==13.0.3 and its members)
    write_index(folder, {"cuda-toolkit": "13.0.3", "nvidia-cuda-cccl": "13.0.3", "nvidia-cuda-crt": "13.0.3",
                         "nvidia-cuda-nvcc": "13.0.3", "nvidia-nvvm": "13.0.3",
                         "nvidia-cuda-runtime": "13.0.96", "nvidia-curand": "10.4.0.35"},
                (installer_wheel(),))
    simple = folder / "simple"
    for name, releases in FAMILY.items():
        project = simple / name
        project.mkdir()
        wheels = [make_wheel(project, name, version, requires=requires, files=files)
                  for version, requires, files in releases]
        project_json(project, name, wheels, [v for v, _, _ in releases])
        (project / "index.html").write_text("".join(f'<a href="{w.name}">{w.name}</a>' for w in wheels))
    assert FAKE_UPLOAD_TIME < "2026"


def _recipe(directory: Path) -> Path:
    """recipes/qwen2-7b-h200.yaml with backend.version left unpinned, as `init` writes it."""
    data = yaml.safe_load((REPO / "recipes" / "qwen2-7b-h200.yaml").read_text())
    data["name"] = "h200-new"
    del data["backend"]["version"]
    path = directory / "h200-new.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _lock(recipe: Path, url: str, out: Path, compat: Path | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "imgfab.cli", "lock", str(recipe), "--index-url", url,
            "--output", str(out), "-q"]
    return subprocess.run(argv + (["--compat-dir", str(compat)] if compat else []),
                          capture_output=True, text=True, timeout=600)


def test_the_split_family_is_bounded_to_the_stacks_cuda_major(tmp_path):
    from fake_payload import published_index

    with published_index() as (folder, base):
        _family_index(folder)
        recipe = _recipe(tmp_path)
        done = _lock(recipe, f"{base}/simple", tmp_path / "h200-new.lock")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "h200-new.lock").read_text()
    assert "\ncuda-python==13.4.4 \\\n" in text
    assert "\ncuda-bindings==13.4.4 \\\n" in text
    assert "# constraints: cuda-bindings>=13.0.0,<14 cuda-python>=13.0.0,<14 (compat/payload.yaml constraints for CUDA 13" in text


def test_without_the_bound_the_refusal_names_the_family_and_the_bound_that_answers_it(tmp_path):
    """The same index with compat/payload.yaml's constraints rows for CUDA 12 only: uv takes the
    monolith, the lock refuses, and the fix names the family and what answers it (not the indexes)."""
    from fake_payload import published_index

    compat = tmp_path / "compat"
    subprocess.run(["cp", "-r", str(REPO / "compat"), str(compat)], check=True)
    payload = yaml.safe_load((compat / "payload.yaml").read_text())
    payload["constraints"] = [row for row in payload.get("constraints", []) if str(row["cuda_major"]) == "12"]
    (compat / "payload.yaml").write_text(yaml.safe_dump(payload, sort_keys=False))
    with published_index() as (folder, base):
        _family_index(folder)
        done = _lock(_recipe(tmp_path), f"{base}/simple", tmp_path / "h200-new.lock", compat)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "distributions install the same file with different bytes: cuda/bindings/__init__.py " \
           "(cuda-bindings cuda-python)" in line
    assert "fix: cuda-bindings 13.5.0 and cuda-python 12.6.2.post1 are one family split across releases: " \
           "add a compat/payload.yaml constraints row for CUDA 13 (rows exist for CUDA 12)" in line
    assert "indexes" not in line.split("fix:", 1)[1]
