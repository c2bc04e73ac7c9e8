"""The resolver knows what locks (issue 32): a backend release whose payload compat/payloads.yaml
records as not installing is a typed rejection at resolve time (constraint ``payload``), so a
recipe moves to the newest release that installs and the rejection list says why, and a pinned
release is refused naming the release to pin. On the frozen compat fixture, with payloads.yaml
rows written here by hand."""

from __future__ import annotations

import shutil

import pytest

from imgfab.errors import CompatibilityError, MatrixError
from imgfab.matrix.compat import load_matrix
from imgfab.recipe import load_recipe
from imgfab.stack.resolve import resolve

from conftest import FROZEN_COMPAT, FROZEN_RECIPES

# The 32-character fingerprints are the lock inputs' (imgfab compat refresh --payloads writes
# them); the resolver reads only backend, version, python, installs and reason.
REFUSED_0_33_0 = """\
checks:
  - backend: "vllm"
    version: "0.26.0"
    python: "3.12"
    cuda_major: "13"
    installs: true
    packages: 195
    constraints: ["cuda-python>=13.0.0,<14"]
    fingerprint: "00000000000000000000000000000026"
    checked: "2026-12-04"
    source: "written by hand for this test"
    confirmed: true
  - backend: "vllm"
    version: "0.33.0"
    python: "3.12"
    cuda_major: "13"
    installs: false
    reason: "distributions install the same file with different bytes: cuda/bindings/__init__.py (cuda-bindings cuda-python)"
    packages: 199
    constraints: []
    fingerprint: "00000000000000000000000000000033"
    checked: "2026-12-04"
    source: "written by hand for this test"
    confirmed: true
"""


@pytest.fixture
def compat(tmp_path):
    target = tmp_path / "compat"
    shutil.copytree(FROZEN_COMPAT, target)
    return target


def _h200(driver: str = ">=999.0", version: str | None = None):
    """The frozen qwen2-7b-h200 recipe, unpinned (or pinned to ``version``), on ``driver``."""
    recipe = load_recipe(FROZEN_RECIPES / "qwen2-7b-h200.yaml")
    backend = recipe.backend.model_copy(update={"version": version})
    target = recipe.target.model_copy(update={"driver": driver})
    return recipe.model_copy(update={"backend": backend, "target": target})


def test_without_a_row_the_newest_release_is_chosen(compat):
    assert resolve(_h200(), load_matrix(compat)).stack.backend_version == "0.33.0"


def test_a_release_that_does_not_install_is_passed_over_and_the_rejection_says_why(compat):
    (compat / "payloads.yaml").write_text(REFUSED_0_33_0)
    resolution = resolve(_h200(), load_matrix(compat))
    assert resolution.stack.backend_version == "0.26.0"
    [rejected] = [r for r in resolution.rejections if r.constraint == "payload"]
    assert rejected.candidate == "vllm 0.33.0 on ubuntu24.04"
    assert rejected.reason == ("vllm 0.33.0 cannot install cleanly on Python 3.12: distributions install the "
                               "same file with different bytes: cuda/bindings/__init__.py (cuda-bindings "
                               "cuda-python) (imgfab compat refresh --payloads, 2026-12-04)")
    assert rejected.fix == "backend.version: ==0.26.0 (the newest vllm release recorded as installing cleanly)"


def test_a_pinned_release_that_does_not_install_is_refused_naming_the_release_to_pin(compat):
    (compat / "payloads.yaml").write_text(REFUSED_0_33_0)
    with pytest.raises(CompatibilityError) as caught:
        resolve(_h200(version="==0.33.0"), load_matrix(compat))
    error = caught.value
    assert error.field == "backend.version"
    assert "vllm 0.33.0 on ubuntu24.04: vllm 0.33.0 cannot install cleanly on Python 3.12" in error.message
    assert ("vllm 0.33.0 on ubuntu24.04", "payload: vllm 0.33.0 cannot install cleanly on Python 3.12: "
            "distributions install the same file with different bytes: cuda/bindings/__init__.py "
            "(cuda-bindings cuda-python) (imgfab compat refresh --payloads, 2026-12-04)") in error.rejections


def test_a_row_for_another_python_does_not_reject(compat):
    (compat / "payloads.yaml").write_text(REFUSED_0_33_0.replace('python: "3.12"', 'python: "3.10"'))
    assert resolve(_h200(), load_matrix(compat)).stack.backend_version == "0.33.0"


@pytest.mark.parametrize("edit, line", [
    (lambda t: t.replace('    reason: "distributions install the same file with different bytes: '
                         'cuda/bindings/__init__.py (cuda-bindings cuda-python)"\n', ""),
     "payloads.yaml checks[1] (vllm 0.33.0 (Python 3.12, CUDA 13)) does not install and gives no reason"),
    (lambda t: t.replace('    source: "written by hand for this test"\n', "", 1),
     "payloads.yaml checks[0] has no 'source'"),
    (lambda t: t.replace("installs: true", 'installs: "yes"'),
     "payloads.yaml checks[0] (vllm 0.26.0 (Python 3.12, CUDA 13)): installs must be true or false"),
    (lambda t: t.replace('version: "0.26.0"', 'version: "0.33.0"'),
     "payloads.yaml checks[1]: a second row for vllm 0.33.0 (Python 3.12, CUDA 13)"),
])
def test_a_malformed_row_is_one_line_naming_it(compat, edit, line):
    (compat / "payloads.yaml").write_text(edit(REFUSED_0_33_0))
    with pytest.raises(MatrixError) as caught:
        load_matrix(compat)
    assert caught.value.message == line
