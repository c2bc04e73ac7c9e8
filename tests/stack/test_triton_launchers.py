"""A runtime without a C compiler (issue 33): Triton's driver helper and launcher stubs are
compiled by the builder where compat/triton_launchers.yaml measured them for the stack.

On a copy of the frozen compat fixture whose FlashInfer sampler rows get ``aot_specs`` (as in
test_kernels_aot) and, where a test says so, a triton_launchers.yaml written here by hand with
two launchers; the expected packages, labels and files are written out from that row."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from imgfab.errors import MatrixError, RecipeError
from imgfab.matrix.compat import load_matrix
from imgfab.payload.lock import payload_request
from imgfab.payload.lockfile import Lock
from imgfab.recipe import load_recipe
from imgfab.render.context import render_context, write_context
from imgfab.stack.resolve import resolve

from conftest import FROZEN_COMPAT, FROZEN_RECIPES, REPO

KEY_A = "a" * 64
KEY_B = "0123456789abcdef" * 4
ROW = {
    "backend": "vllm", "backend_version": "0.26.0", "triton": "3.6.0",
    "measured": "a hand-written row", "compute_capabilities": ["9.0"], "precisions": ["bf16"],
    "kv_cache_dtypes": ["auto"], "tensor_parallel": [1], "pipeline_parallel": [1], "nodes": [1],
    "source": "hand-written for this test", "confirmed": True,
    "signatures": [{"key": KEY_A, "signature": ["*bf16", "i32", "constexpr"]},
                   {"key": KEY_B, "signature": ["*fp32", ["*i32", "i64"]],
                    "tensordesc_meta": [{"block_size": [16]}]}],
}


@pytest.fixture
def compat(tmp_path):
    target = tmp_path / "compat"
    shutil.copytree(FROZEN_COMPAT, target)
    data = yaml.safe_load((target / "backends.yaml").read_text())
    vllm = next(row for row in data["backends"] if row["backend"] == "vllm")
    for row in vllm["jit_toolchains"]:
        if row["name"] == "flashinfer-sampler" and row.get("toolchain") == "payload":
            row["aot_specs"] = ["flashinfer.jit.sampling:gen_sampling_module"]
            row["aot_source"] = "hand-written for this test"
    vllm["triton_toolchain"] = ["gcc", "libc6-dev", "python3-dev"]
    vllm["jit_monitor_versions"] = ">=0.26.0"
    (target / "backends.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return target


def _write_row(compat, **changes):
    (compat / "triton_launchers.yaml").write_text(yaml.safe_dump({"launchers": [dict(ROW, **changes)]}))


def _h200(compat, **recipe_changes):
    recipe = load_recipe(FROZEN_RECIPES / "qwen2-7b-h200.yaml")
    if recipe_changes:
        recipe = recipe.model_copy(update=recipe_changes)
    matrix = load_matrix(compat)
    return recipe, resolve(recipe, matrix).stack, matrix


def _code(dockerfile: str, start: str) -> str:
    body = dockerfile[dockerfile.index(start):]
    return "\n".join(line for line in body.split("\n") if not line.lstrip().startswith("#"))


def test_a_measured_stack_gets_a_runtime_without_the_c_compiler_or_headers(compat):
    _write_row(compat)
    _, stack, _ = _h200(compat)
    assert stack.runtime_packages == ("python3", "python3-venv")
    assert stack.runtime_toolchain == ()
    assert (stack.triton, stack.triton_launchers, stack.jit_monitor) == ("3.6.0", 2, "error")
    assert "hand-written for this test" in stack.sources
    assert ("builder compiles Triton 3.6.0's driver helper and 2 launcher stubs (compat/triton_launchers.yaml, "
            "measured a hand-written row); the runtime carries no C compiler") in stack.notes


def test_without_a_row_the_compiler_stays_declared_and_the_note_says_why(compat):
    _, stack, _ = _h200(compat)
    assert stack.runtime_packages == ("gcc", "libc6-dev", "python3", "python3-dev", "python3-venv")
    assert stack.runtime_toolchain == ("gcc", "libc6-dev", "python3-dev")
    assert (stack.triton, stack.triton_launchers) == ("", 0)
    assert ("runtime carries a C compiler (gcc, libc6-dev, python3-dev), declared as the fallback Triton "
            "builds its launcher stubs with at start: compat/triton_launchers.yaml has no confirmed row measured "
            "for vllm 0.26.0 on compute capability 9.0 with bf16, KV auto, tp 1, pp 1, 1 node(s)") in stack.notes


@pytest.mark.parametrize("change", [
    {"confirmed": False}, {"backend_version": "0.25.0"}, {"compute_capabilities": ["8.0"]},
    {"precisions": ["fp8"]}, {"kv_cache_dtypes": ["fp8"]}, {"tensor_parallel": [2]},
], ids=lambda c: next(iter(c)))
def test_a_row_measured_for_other_settings_is_not_used(compat, change):
    _write_row(compat, **change)
    _, stack, _ = _h200(compat)
    assert "gcc" in stack.runtime_packages and stack.triton == ""


def test_the_dockerfile_compiles_the_launchers_in_the_builder_and_the_runtime_has_no_compiler(compat, tmp_path):
    _write_row(compat)
    recipe, stack, matrix = _h200(compat)
    files = render_context(recipe, stack, matrix)
    dockerfile = files["Dockerfile"]
    stage = dockerfile[dockerfile.index("FROM builder AS kernels"):dockerfile.index("AS runtime")]
    assert "COPY imgfab-kernels.py imgfab-triton-launchers.json /opt/imgfab/" in stage
    assert ("flashinfer.jit.sampling:gen_sampling_module \\\n"
            "       --triton /opt/imgfab/triton-seed /opt/imgfab/imgfab-triton-launchers.json") in stage
    runtime = _code(dockerfile, "AS runtime")
    assert "apt-get install -y --no-install-recommends python3 python3-venv \\" in runtime
    for word in ("gcc", "g++", "cc1", "nvcc", "libc6-dev", "python3-dev", "clang"):
        assert not re.search(rf"(?<![\w-]){re.escape(word)}(?![\w+-])", runtime), word
    assert json.loads(files["imgfab-triton-launchers.json"]) == {
        "backend": "vllm", "backend_version": "0.26.0", "triton": "3.6.0", "measured": "a hand-written row",
        "launchers": ROW["signatures"]}
    labels = json.loads(files["image.json"])
    assert labels["org.imgfab.toolchain"] == ""
    assert labels["org.imgfab.kernels.triton"] == "2 launchers, Triton 3.6.0"
    # vLLM's JIT monitor fails a compile after the warm-up
    assert "--jit-monitor-mode error" in files["entrypoint.sh"]


def test_without_a_row_the_runtime_installs_the_declared_compiler_and_labels_it(compat):
    recipe, stack, matrix = _h200(compat)
    files = render_context(recipe, stack, matrix)
    runtime = _code(files["Dockerfile"], "AS runtime")
    assert "apt-get install -y --no-install-recommends gcc libc6-dev python3 python3-dev python3-venv" in runtime
    assert "imgfab-triton-launchers.json" not in files and "--triton" not in files["Dockerfile"]
    assert "triton-seed" not in files["entrypoint.sh"]
    labels = json.loads(files["image.json"])
    assert labels["org.imgfab.toolchain"] == "gcc,libc6-dev,python3-dev"
    assert labels["org.imgfab.kernels.triton"] == ""


def test_a_lock_with_another_triton_is_refused_naming_the_versions(compat):
    _write_row(compat)
    recipe, stack, matrix = _h200(compat)
    text = (REPO / "recipes" / "qwen2-7b-h200.lock").read_text()
    assert "\ntriton==3.6.0 \\\n" in text
    request = payload_request(recipe, stack, compat)
    lock = Lock.parse(text.replace("\ntriton==3.6.0 \\\n", "\ntriton==3.7.0 \\\n")).bind(request)
    with pytest.raises(RecipeError) as refused:
        render_context(recipe, stack, matrix, lock=lock)
    assert refused.value.field == "backend.version"
    assert str(refused.value).startswith("the lock pins triton 3.7.0, but compat/triton_launchers.yaml "
                                         "measured vllm 0.26.0's launchers with Triton 3.6.0")
    render_context(recipe, stack, matrix, lock=Lock.parse(text).bind(request))  # the measured one renders


@pytest.mark.parametrize("change, message", [
    ({"signatures": [{"key": "A" * 64, "signature": ["*i32"]}]}, "a key is not a sha256"),
    ({"signatures": [{"key": KEY_A, "signature": "*i32"}]}, "each signature is"),
    ({"precisions": None}, "is malformed"),
])
def test_a_malformed_launchers_row_is_refused_at_load(compat, change, message):
    _write_row(compat, **change)
    with pytest.raises(MatrixError, match=message):
        load_matrix(compat)


def test_the_repository_row_is_the_measured_one():
    """compat/triton_launchers.yaml: the 18 signatures the H100 run of 2026-12-05 recorded, confirmed
    (the integration build of qwen2-7b-h200 regenerates each key from the real Triton 3.6.0)."""
    row, = load_matrix().triton_launchers
    assert (row.backend, row.backend_version, row.triton, row.confirmed) == ("vllm", "0.26.0", "3.6.0", True)
    assert len(row.signatures) == 18 and row.compute_capabilities == ("9.0",)
    proof = json.loads((REPO / "tests" / "fixtures" / "gpu_proof" / "h100-vllm-startup-2026-12-05.json").read_text())
    assert [s["key"] for s in row.signatures] == [s["key"] for s in proof["launchers_recorded"]["launchers"]]


def test_the_entrypoint_seeds_tritons_cache_and_keeps_what_is_there(compat, tmp_path):
    _write_row(compat)
    recipe, stack, matrix = _h200(compat)
    files = render_context(recipe, stack, matrix)
    text = files["entrypoint.sh"]
    seed = tmp_path / "seed"
    for key, name in ((KEY_A, "cuda_utils.so"), (KEY_B, "__triton_launcher.so")):
        (seed / key).mkdir(parents=True)
        (seed / key / name).write_text(key)
    start = text.index("if [ -d /opt/imgfab/triton-seed ]; then")
    block = text[start:text.index("\nfi\n", start) + 4].replace("/opt/imgfab/triton-seed", str(seed))
    cache = tmp_path / "cache" / "triton"
    (cache / KEY_B).mkdir(parents=True)
    (cache / KEY_B / "__triton_launcher.so").write_text("the volume's own")
    done = subprocess.run(["bash", "-euc", block], env=dict(os.environ, TRITON_CACHE_DIR=str(cache)),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert (cache / KEY_A / "cuda_utils.so").read_text() == KEY_A
    assert (cache / KEY_B / "__triton_launcher.so").read_text() == "the volume's own"
    assert sorted(p.name for p in cache.iterdir()) == sorted([KEY_A, KEY_B])  # no temporary left


FAKE_TRITON = {
    "triton/__init__.py": "",
    "triton/backends/__init__.py": "",
    "triton/backends/nvidia/__init__.py": "",
    "triton/backends/nvidia/driver.c": "/* the driver helper */\n",
    "triton/backends/nvidia/driver.py": '''
import os
dirname = os.path.dirname(os.path.realpath(__file__))
include_dirs = [os.path.join(dirname, "include")]
libraries = ["cuda"]
def library_dirs():
    return [os.environ["TRITON_LIBCUDA_PATH"]]
def make_launcher(constants, signature, tensordesc_meta):
    return "launcher for " + repr(list(signature.values())) + repr(tensordesc_meta)
''',
    "triton/runtime/__init__.py": "",
    "triton/runtime/build.py": '''
import hashlib, os, subprocess, sysconfig
def platform_key():
    return "x86_64,Linux,64bit,ELF"  # as Triton's, on a host where `file` is installed
class _Cache:
    def __init__(self, key):
        self.dir = os.path.join(os.environ["TRITON_CACHE_DIR"], key)
    def get_file(self, name):
        path = os.path.join(self.dir, name)
        return path if os.path.exists(path) else None
    def put(self, data, name, binary=True):
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, name), "wb" if binary else "w") as f:
            f.write(data)
        return os.path.join(self.dir, name)
def get_cache_manager(key):
    return _Cache(key)
def compile_module_from_src(src, name, library_dirs=None, include_dirs=None, libraries=None):
    key = hashlib.sha256((src + platform_key()).encode("utf-8")).hexdigest()
    os.makedirs(os.path.join(os.environ["TRITON_CACHE_DIR"], key), exist_ok=True)
    target = os.path.join(os.environ["TRITON_CACHE_DIR"], key, name + sysconfig.get_config_var("EXT_SUFFIX"))
    used = subprocess.run([os.environ["CC"], "--print-argv"], capture_output=True, text=True).stdout
    with open(target, "w") as f:
        f.write(src + "\\n" + used)
    raise ImportError("libcuda.so.1: cannot open shared object file")  # as on a host with no driver
''',
}

FAKE_CC = """#!/bin/sh
case " $* " in *" --print-argv "*) echo "$@"; exit 0;; esac
while [ "$#" -gt 0 ]; do [ "$1" = -o ] && : > "$2"; shift; done
"""


def _fake_key(signature, meta=None, linkage="ELF"):
    """The key Triton gives the fake launcher source, with ``file`` installed (linkage ELF) or not ('')."""
    import hashlib
    src = "launcher for " + repr([tuple(s) if isinstance(s, list) else s for s in signature]) + repr(meta)
    return hashlib.sha256((src + "x86_64,Linux,64bit," + linkage).encode()).hexdigest()


def _run_kernels(tmp_path, launchers):
    for name, text in FAKE_TRITON.items():
        (tmp_path / "site" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "site" / name).write_text(text)
    cc = tmp_path / "bin" / "fakecc"
    cc.parent.mkdir(exist_ok=True)
    cc.write_text(FAKE_CC)
    cc.chmod(0o755)
    (tmp_path / "launchers.json").write_text(json.dumps({"launchers": launchers}))
    env = {k: v for k, v in os.environ.items() if k not in ("FLASHINFER_CUDA_ARCH_LIST", "TRITON_CACHE_DIR")}
    env.update(PYTHONPATH=str(tmp_path / "site"), CC=str(cc))
    script = REPO / "src" / "imgfab" / "in_image" / "kernels.py"
    return subprocess.run([sys.executable, str(script), str(tmp_path / "out"), "--triton", str(tmp_path / "seed"),
                           str(tmp_path / "launchers.json")], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("linkage", ["ELF", ""], ids=["recorded-with-file", "recorded-without-file"])
def test_imgfab_kernels_compiles_the_helper_and_each_launcher_under_tritons_own_key(tmp_path, linkage):
    """Each module lands under both keys a runtime can compute (Triton's platform_key ends with
    the linkage ``file`` reports: ELF, or '' where the image has no ``file``), whichever the
    recording machine had."""
    signature = ["*fp32", ["*i32", "i64"]]
    key = _fake_key(signature, [{"block_size": [16]}], linkage)
    done = _run_kernels(tmp_path, [{"key": key, "signature": signature, "tensordesc_meta": [{"block_size": [16]}]}])
    assert done.returncode == 0, done.stderr
    suffix = __import__("sysconfig").get_config_var("EXT_SUFFIX")
    other = _fake_key(signature, [{"block_size": [16]}], "" if linkage else "ELF")
    built = tmp_path / "seed" / key / ("__triton_launcher" + suffix)
    text = built.read_text()
    # the signature reached make_launcher with its tuple back, and the link keeps libcuda needed
    assert text.startswith("launcher for ['*fp32', ('*i32', 'i64')][{'block_size': [16]}]")
    assert "-Wl,--no-as-needed" in text
    assert (tmp_path / "seed" / other / ("__triton_launcher" + suffix)).read_text() == text
    staged = tmp_path / "out" / str(built).lstrip("/")
    assert staged.read_text() == text and staged.stat().st_mtime == 0
    # cuda_utils and the launcher, each under its two keys
    assert len(list((tmp_path / "seed").iterdir())) == 4
    assert "imgfab-kernels: triton: cuda_utils and 1 launcher(s) -> " in done.stdout


def test_imgfab_kernels_fails_naming_a_launcher_this_triton_does_not_regenerate(tmp_path):
    done = _run_kernels(tmp_path, [{"key": KEY_A, "signature": ["*bf16"]}])
    assert done.returncode == 1
    assert done.stderr.strip() == (f"imgfab-kernels: triton: RuntimeError: the launcher recorded as {KEY_A} "
                                   f"regenerates as {_fake_key(['*bf16'])} or {_fake_key(['*bf16'], linkage='')}: "
                                   "this payload's Triton is not the one measured")
    assert not (tmp_path / "out").exists()
