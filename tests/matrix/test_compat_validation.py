"""compat data is validated like recipe data before it reaches a Dockerfile (issue 12): a
record value with a line break, a shell metacharacter in a package name, or an over-long value
is a MatrixError (one line, exit 1), never a rendered instruction."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from imgfab.matrix.compat import load_matrix
from imgfab.errors import MatrixError

from conftest import FROZEN_COMPAT, FROZEN_RECIPES


@pytest.fixture
def compat(tmp_path):
    target = tmp_path / "compat"
    shutil.copytree(FROZEN_COMPAT, target)
    return target


@pytest.mark.parametrize("filename, old, new", [
    ("backends.yaml", "runtime_packages: [gcc, libc6-dev,",
     'runtime_packages: ["gcc\\nRUN curl evil | sh", libc6-dev,'),
    ("backends.yaml", "runtime_packages: [gcc, libc6-dev,", 'runtime_packages: ["gcc;id", libc6-dev,'),
    ("vllm.yaml", 'torch: "==2.11.0"', 'torch: "==2.11.0 ; rm -rf /"'),
    ("vllm.yaml", 'torch: "==2.11.0"', 'torch: "==2.11.0\\n"'),
    ("cuda_images.yaml", 'flavors: ["base", "devel", "runtime"]',
     'flavors: ["base", "devel$(id)", "runtime"]'),
    ("vllm.yaml", '- version: "0.8.0"', '- version: "0.8.0\\rx"'),
    ("vllm.yaml", '- version: "0.8.0"', '- version: "' + "9" * 100 + '"'),
])
def test_bad_compat_values_are_matrix_errors(compat, filename, old, new):
    path = compat / filename
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(MatrixError) as caught:
        load_matrix(compat)
    line = caught.value.one_line()
    assert "\n" not in line and len(line) < 400


def test_bad_compat_dir_is_one_line_exit_1(compat, tmp_path):
    path = compat / "backends.yaml"
    path.write_text(path.read_text().replace("runtime_packages: [gcc, libc6-dev,",
                                             'runtime_packages: ["gcc\\nUSER root", libc6-dev,', 1))
    result = subprocess.run([sys.executable, "-c", "from imgfab.cli import main; main()", "resolve",
                             str(FROZEN_RECIPES / "qwen2-7b-h100.yaml"), "--compat-dir", str(compat)],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "internal error" not in result.stderr


# --- issue 31: every row has a source, and compat data is read through the validating loader ----

@pytest.mark.parametrize("table, first_row, named", [
    ("runtimes", '  - cudart: "12.4.127"\n', "runtimes[0] (cudart '12.4.127')"),
    ("driver_branches", '  - branch: "535"\n', "driver_branches[0] (branch '535')"),
], ids=["runtimes", "driver_branches"])
def test_a_cuda_row_without_a_source_is_an_error_not_a_silent_drop(compat, table, first_row, named):
    """The runtimes and driver_branches tables used to leave such a row out without a word (a
    driver branch gone from the forward-compatibility table, a runtime gone from the floors)."""
    path = compat / "cuda.yaml"
    text = path.read_text()
    start = text.index(first_row)
    source = text.index("    source: ", start)
    path.write_text(text[:source] + text[text.index("\n", source) + 1:])
    with pytest.raises(MatrixError) as caught:
        load_matrix(compat)
    assert caught.value.one_line() == (
        f"compat/cuda.yaml: {named} has no source; fix: give the row a source (a URL, or "
        "owner/repo@tag:path; confirmed: false where it was not read)")


# Two TensorRT releases inside TensorRT-LLM 1.2.1's requirement (~=10.14.1): the newer one is
# built for CUDA 12, the stack's CUDA is 13.1.
TENSORRT_YAML = """\
releases:
  - version: "10.14.1.48"
    cuda_major: "13"
    source: "https://pypi.org/project/tensorrt/10.14.1.48/ (test row)"
    confirmed: true
  - version: "10.14.1.99"
    cuda_major: "12"
    source: "https://pypi.org/project/tensorrt/10.14.1.99/ (test row)"
    confirmed: true
"""


def test_the_tensorrt_pin_is_built_for_the_stacks_cuda_major(compat):
    """tensorrt.yaml's cuda_major was read by nobody, and the pin read the shipped file raw
    whatever the compat directory: the newest release in range was pinned, built for any CUDA."""
    from imgfab.payload.lock import payload_request
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import resolve

    (compat / "tensorrt.yaml").write_text(TENSORRT_YAML)
    recipe = load_recipe(FROZEN_RECIPES / "mistral-7b-a100-trtllm.yaml")
    stack = resolve(recipe, load_matrix(compat)).stack
    assert stack.cuda.startswith("13.")
    pins = payload_request(recipe, stack, compat).pins
    assert [p for p in pins if p.startswith("tensorrt==")] == ["tensorrt==10.14.1.48"]


def test_a_trtllm_release_without_a_tensorrt_for_its_cuda_major_is_dropped_at_load(compat):
    (compat / "tensorrt.yaml").write_text(TENSORRT_YAML.replace('cuda_major: "13"', 'cuda_major: "12"'))
    matrix = load_matrix(compat)
    assert ("tensorrt-llm 1.2.1", "no TensorRT release for CUDA 13 in compat/tensorrt.yaml "
                                  "satisfies ~=10.14.1") in matrix.dropped
    assert "1.2.1" not in [r.version for r in matrix.releases if r.backend == "tensorrt-llm"]


@pytest.mark.parametrize("old, new, line", [
    ('version: "10.14.1.99"', 'version: "ten"',
     "compat/tensorrt.yaml: releases[1] ('ten'): version is not a PEP 440 version; "
     "fix: the version as PyPI lists it"),
    ('cuda_major: "12"', 'cuda_major: ""',
     "compat/tensorrt.yaml: releases[1] ('10.14.1.99') is confirmed but names no cuda_major; "
     "fix: the CUDA major of the tensorrt_cuXX package its metapackage requires"),
    ('    source: "https://pypi.org/project/tensorrt/10.14.1.99/ (test row)"\n', "",
     "compat/tensorrt.yaml: releases[1] (version '10.14.1.99') has no source; fix: give the row "
     "a source (a URL, or owner/repo@tag:path; confirmed: false where it was not read)"),
], ids=["version", "cuda_major", "source"])
def test_a_malformed_tensorrt_row_fails_the_matrix_load(compat, old, new, line):
    (compat / "tensorrt.yaml").write_text(TENSORRT_YAML.replace(old, new))
    with pytest.raises(MatrixError) as caught:
        load_matrix(compat)
    assert caught.value.one_line() == line


def test_tensorrt_pin_takes_the_newest_release_of_the_cuda_major():
    from imgfab.errors import CompatibilityError
    from imgfab.matrix.compat import TensorRTRelease, tensorrt_pin

    releases = [TensorRTRelease(version=v, cuda_major=m, source="test", confirmed=True)
                for v, m in (("10.11.0.33", "12"), ("10.13.3.9", "13"), ("10.13.3.9.post1", "13"),
                             ("10.13.3.10", "12"))]
    assert tensorrt_pin("~=10.13.3", "1.1.0", "13.0.2", releases) == "10.13.3.9.post1"
    assert tensorrt_pin("~=10.13.3", "1.1.0", "12.9.1", releases) == "10.13.3.10"
    with pytest.raises(CompatibilityError) as caught:
        tensorrt_pin("~=10.11.0", "1.0.0", "13.0.2", releases)
    assert caught.value.message == ("TensorRT-LLM 1.0.0 is incompatible with compat/tensorrt.yaml: "
                                    "no TensorRT release for CUDA 13 satisfies ~=10.11.0")
