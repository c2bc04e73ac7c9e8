"""The builder compiles the engine (issue 33): a JIT toolchain row with ``aot_specs`` is compiled
by the builder for the recipe's GPU alone, and the runtime compiles none of it.

On a copy of the frozen compat fixture whose FlashInfer sampler rows (toolchain: payload) get
``aot_specs`` here by hand; the answers are written out from those rows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from imgfab.errors import MatrixError
from imgfab.matrix.compat import load_matrix
from imgfab.recipe import load_recipe
from imgfab.render.context import render_context
from imgfab.stack.resolve import resolve

from conftest import FROZEN_COMPAT, FROZEN_RECIPES, REPO

SPEC = "flashinfer.jit.sampling:gen_sampling_module"


@pytest.fixture
def compat(tmp_path):
    target = tmp_path / "compat"
    shutil.copytree(FROZEN_COMPAT, target)
    data = yaml.safe_load((target / "backends.yaml").read_text())
    vllm = next(row for row in data["backends"] if row["backend"] == "vllm")
    for row in vllm["jit_toolchains"]:
        if row["name"] == "flashinfer-sampler" and row.get("toolchain") == "payload":
            row["aot_specs"] = [SPEC]
            row["aot_source"] = "hand-written for this test"
    (target / "backends.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return target


def _h200(compat):
    recipe = load_recipe(FROZEN_RECIPES / "qwen2-7b-h200.yaml")
    matrix = load_matrix(compat)
    return recipe, resolve(recipe, matrix).stack, matrix


def test_the_sampler_is_compiled_ahead_and_the_runtime_carries_no_nvcc(compat):
    _, stack, _ = _h200(compat)
    assert (stack.backend_version, stack.compute_capability) == ("0.26.0", "9.0")
    assert stack.aot_specs == (SPEC,)
    assert stack.aot == ("flashinfer-sampler (FlashInfer's top-k/top-p sampling kernels)",)
    assert stack.jit == () and stack.jit_compiles == () and stack.cuda_home == ""
    assert "g++" not in stack.runtime_packages and "nvcc" not in stack.runtime_toolchain
    assert "g++" not in stack.runtime_toolchain
    # the builder compiles with the payload's nvcc: the wheels stay locked
    assert stack.payload_toolchain == ("cuda-toolkit[cccl,crt,nvcc,nvvm]==13.0.2",)
    assert any(n.startswith("builder compiles flashinfer-sampler (FlashInfer's top-k/top-p sampling kernels) "
                            "ahead of time, for compute capability 9.0 alone") for n in stack.notes)


def test_the_dockerfile_compiles_in_a_kernels_stage_for_the_gpu_and_the_runtime_disables_the_jit(compat):
    recipe, stack, matrix = _h200(compat)
    files = render_context(recipe, stack, matrix)
    dockerfile = files["Dockerfile"]
    kernels = dockerfile.index("FROM builder AS kernels")
    runtime = dockerfile.index("AS runtime")
    assert kernels < runtime
    stage = dockerfile[kernels:dockerfile.index("\nFROM ", kernels + 1)]
    assert "FLASHINFER_CUDA_ARCH_LIST=9.0 \\" in stage and "CUDA_HOME=/opt/imgfab/cuda" in stage
    assert "&& /opt/imgfab/cuda/bin/nvcc --version" in stage
    assert ("/opt/venv/bin/python3 /opt/imgfab/imgfab-kernels.py /opt/imgfab/layers/kernels "
            "flashinfer.jit.sampling:gen_sampling_module") in stage
    body = dockerfile[runtime:]
    code = "\n".join(line for line in body.split("\n") if not line.lstrip().startswith("#"))
    assert "COPY --link --from=kernels /opt/imgfab/layers/kernels/ /" in code
    assert "    FLASHINFER_DISABLE_JIT=1 \\" in code
    assert "/opt/imgfab/cuda" not in code and "CUDA_HOME" not in code and "nvcc" not in code
    assert "apt-get install -y --no-install-recommends gcc libc6-dev python3 python3-dev python3-venv" in code
    assert "apt-get install -y --no-install-recommends g++ python3 python3-dev python3-venv" in dockerfile[:kernels]
    # the builder runs imgfab's own stdlib-only module, byte for byte
    assert files["imgfab-kernels.py"] == (REPO / "src" / "imgfab" / "in_image" / "kernels.py").read_text()
    labels = json.loads(files["image.json"])
    assert labels["org.imgfab.jit"] == "" and labels["org.imgfab.jit.compiles"] == ""
    assert labels["org.imgfab.kernels"] == "flashinfer-sampler (FlashInfer's top-k/top-p sampling kernels)"
    assert labels["org.imgfab.kernels.arch"] == "9.0"


def test_a_recipe_without_aot_rows_renders_as_before(compat):
    """vLLM 0.19.1 on an H100 (sampler off by default there): no kernels stage, no label."""
    recipe = load_recipe(FROZEN_RECIPES / "qwen2-7b-h100.yaml")
    matrix = load_matrix(compat)
    stack = resolve(recipe, matrix).stack
    files = render_context(recipe, stack, matrix)
    assert "AS kernels" not in files["Dockerfile"] and "FLASHINFER_DISABLE_JIT" not in files["Dockerfile"]
    assert "imgfab-kernels.py" not in files
    assert json.loads(files["image.json"])["org.imgfab.kernels"] == ""


@pytest.mark.parametrize("edit, message", [
    (lambda row: row.update(aot_specs=["flashinfer.jit.sampling"]), "aot_specs are 'module:generator' paths"),
    (lambda row: row.pop("aot_source"), "aot_specs need toolchain: payload"),
])
def test_a_malformed_aot_row_is_refused_at_load(compat, edit, message):
    data = yaml.safe_load((compat / "backends.yaml").read_text())
    vllm = next(row for row in data["backends"] if row["backend"] == "vllm")
    edit(next(row for row in vllm["jit_toolchains"] if row.get("aot_specs")))
    (compat / "backends.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(MatrixError, match=message):
        load_matrix(compat)


FAKE_MODULE = '''
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


class Spec:
    jit_library_path = HERE / "built" / "sampling.so"
    aot_path = HERE / "data" / "aot" / "sampling" / "sampling.so"

    @property
    def is_aot(self):
        return self.aot_path.exists()

    def build(self, verbose=False):
        self.jit_library_path.parent.mkdir(parents=True, exist_ok=True)
        self.jit_library_path.write_text("for " + os.environ["FLASHINFER_CUDA_ARCH_LIST"])


def gen_ok():
    return Spec()


def gen_broken():
    raise RuntimeError("nvcc fatal : Unsupported gpu architecture 'compute_990a'")
'''


def _kernels(tmp_path, *argv, arch="9.0"):
    package = tmp_path / "fakefi"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text(FAKE_MODULE)
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_CUDA_ARCH_LIST"}
    env["PYTHONPATH"] = str(tmp_path)
    if arch:
        env["FLASHINFER_CUDA_ARCH_LIST"] = arch
    script = REPO / "src" / "imgfab" / "in_image" / "kernels.py"
    return subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, env=env,
                          timeout=120), package


def test_imgfab_kernels_places_the_library_where_flashinfer_looks_and_stages_it(tmp_path):
    done, package = _kernels(tmp_path, str(tmp_path / "out"), "fakefi:gen_ok")
    assert done.returncode == 0, done.stderr
    aot = package / "data" / "aot" / "sampling" / "sampling.so"
    assert aot.read_text() == "for 9.0"
    staged = tmp_path / "out" / str(aot).lstrip("/")
    assert staged.read_text() == "for 9.0"
    assert oct(staged.stat().st_mode & 0o777) == "0o644" and staged.stat().st_mtime == 0
    assert (tmp_path / "out").stat().st_mtime == 0


def test_imgfab_kernels_fails_naming_the_spec_and_never_without_a_target(tmp_path):
    done, _ = _kernels(tmp_path, str(tmp_path / "out"), "fakefi:gen_ok", "fakefi:gen_broken")
    assert done.returncode == 1
    assert done.stderr.strip() == ("imgfab-kernels: fakefi:gen_broken: RuntimeError: nvcc fatal : "
                                   "Unsupported gpu architecture 'compute_990a'")
    assert not (tmp_path / "out").exists()  # nothing staged from a failed run
    done, _ = _kernels(tmp_path, str(tmp_path / "out"), "fakefi:gen_ok", arch="")
    assert done.returncode == 2 and "FLASHINFER_CUDA_ARCH_LIST is not set" in done.stderr
