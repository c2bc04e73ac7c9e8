"""imgfab lock: the lock-time checks, the lock file, --check, the remote RECORD reader, staging.

Everything here is offline: packages are fixtures (what a resolution and the wheels' RECORDs
would give), wheels are built in memory and served by a fake HTTP session.
"""

from __future__ import annotations

import re

import base64
import hashlib
import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from imgfab.payload import lock as lockmod
from imgfab.in_image import stage
from imgfab.matrix import wheelzip
from imgfab.errors import CompatibilityError
from imgfab.payload.lock import IndexPin, Lock, LockedPackage, PayloadRequest

from conftest import RECIPES, REPO, VLLM_0191

sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from fake_payload import fake_cubin  # noqa: E402


def _pkg(name, version="1.0", files=None, requires=(), urls=None, installed=0):
    return LockedPackage(name=name, version=version, hashes=[f"sha256:{'a' * 64}"],
                         urls=urls or [f"https://files.pythonhosted.org/x/{name}-{version}.whl"],
                         installed=installed, files=dict(files or {}), requires=list(requires))


def _request(**overrides):
    base = dict(recipe="r", stack_line="s", pins=("torch==2.9.1",), python="3.12",
                platform="x86_64-manylinux_2_39", cuda_major="13",
                indexes=(IndexPin("https://download.pytorch.org/whl/cu130", ("torch",)),),
                default_index="https://pypi.org/simple")
    base.update(overrides)
    return PayloadRequest(**base)


# ---------------------------------------------------------------- lock-time checks


def test_cuda_wheels_of_two_majors_are_refused_by_name():
    packages = [_pkg("nvidia-nccl-cu12"), _pkg("nvidia-nccl-cu13"), _pkg("nvidia-cublas-cu13")]
    with pytest.raises(CompatibilityError) as caught:
        lockmod.check_cuda_majors(packages)
    assert "cu12: nvidia-nccl-cu12" in caught.value.message
    assert "cu13: nvidia-cublas-cu13 nvidia-nccl-cu13" in caught.value.message
    lockmod.check_cuda_majors([_pkg("nvidia-nccl-cu12"), _pkg("nvidia-cublas-cu12"), _pkg("nvidia-ml-py")])


def test_two_distributions_writing_one_file_with_different_bytes_are_refused():
    nccl12 = _pkg("nvidia-nccl-cu12", files={"nvidia/nccl/lib/libnccl.so.2": "sha256=AAA",
                                             "nvidia/__init__.py": "sha256=E"})
    nccl13 = _pkg("nvidia-nccl-cu13", files={"nvidia/nccl/lib/libnccl.so.2": "sha256=BBB",
                                             "nvidia/__init__.py": "sha256=E"})
    with pytest.raises(CompatibilityError) as caught:
        lockmod.check_file_collisions([nccl12, nccl13])
    assert "nvidia/nccl/lib/libnccl.so.2 (nvidia-nccl-cu12 nvidia-nccl-cu13)" in caught.value.message
    assert "nvidia/__init__.py" not in caught.value.message  # same bytes: no harm
    # A reviewed collision (compat/payload.yaml file_collisions_allowed) passes; only that one.
    lockmod.check_file_collisions([nccl12, nccl13], (("nvidia/nccl/lib/libnccl.so.2",
                                                     ("nvidia-nccl-cu12", "nvidia-nccl-cu13")),))


def test_dist_info_files_never_collide():
    a = _pkg("a", files={"a-1.0.dist-info/RECORD": "", "shared.dist-info/x": "sha256=1"})
    b = _pkg("b", files={"shared.dist-info/x": "sha256=2"})
    lockmod.check_file_collisions([a, b])


@pytest.mark.parametrize(("version", "requires", "major"), [
    ("2.9.1", ["nvidia-cuda-runtime-cu12==12.8.90; platform_system == \"Linux\"",
               "nvidia-nccl-cu12==2.27.5; platform_system == \"Linux\"", "filelock"], "12"),
    ("2.9.1+cu130", [], "13"),
    ("2.9.1+cu128", [], "12"),
    ("2.11.0", ["cuda-toolkit[cudart]==13.0.2; platform_system == \"Linux\"", "filelock"], "13"),
    ("2.9.1+cpu", [], "cpu"),
    ("2.9.1", ["filelock", "sympy"], "cpu"),
])
def test_torch_cuda_major(version, requires, major):
    assert lockmod.torch_cuda_major(_pkg("torch", version, requires=requires)) == major


def test_torch_for_another_cuda_major_is_refused_with_its_evidence():
    torch = _pkg("torch", "2.9.1", requires=["nvidia-cuda-runtime-cu12==12.8.90; platform_system == \"Linux\"",
                                             "nvidia-nccl-cu12==2.27.5; platform_system == \"Linux\""])
    with pytest.raises(CompatibilityError) as caught:
        lockmod.check_torch_cuda([torch], "13", "13.1.1")
    message = caught.value.message
    assert "torch 2.9.1" in message and "CUDA 12 build" in message and "CUDA 13.1.1" in message
    assert "nvidia-nccl-cu12==2.27.5" in message
    lockmod.check_torch_cuda([torch], "12", "12.8.1")
    lockmod.check_torch_cuda([_pkg("torch", "2.9.1+cu130")], "13", "13.1.1")


def test_a_name_from_the_wrong_index_is_refused():
    request = _request()
    confused = _pkg("torch", "2.9.1", urls=["https://files.pythonhosted.org/p/torch-2.9.1.whl"])
    with pytest.raises(CompatibilityError) as caught:
        lockmod.check_indexes([confused], request, None)
    assert "torch (files.pythonhosted.org, pinned to download.pytorch.org)" in caught.value.message
    right = _pkg("torch", "2.9.1+cu130", urls=["https://download.pytorch.org/whl/cu130/torch-2.9.1.whl"])
    lockmod.check_indexes([right, _pkg("filelock")], request, None)


# ---------------------------------------------------------------- the lock file


def test_layer_plan_groups_by_content_and_caps_each_layer():
    gb = 10**9
    packages = [_pkg("nvidia-cublas-cu12", installed=int(1.5 * gb)), _pkg("nvidia-cudnn-cu12", installed=int(1.2 * gb)),
                _pkg("nvidia-nccl-cu12", installed=int(0.4 * gb)), _pkg("torch", installed=int(2.5 * gb)),
                _pkg("vllm", installed=gb), _pkg("flashinfer-python", installed=gb // 2), _pkg("six", installed=100),
                _pkg("transformers", installed=10**8), _pkg("tokenizers", installed=10**7)]
    plan = lockmod.layer_plan(packages)
    # models: what a vLLM patch release moves besides vLLM, in a layer of its own before vllm
    assert [name for name, _, _ in plan] == ["cuda-1", "cuda-2", "torch-1", "rest-1", "models-1", "vllm-1"]
    assert dict((n, names) for n, _, names in plan)["models-1"] == ["tokenizers", "transformers"]
    assert all(size <= lockmod.PLAN_LIMIT < lockmod.LAYER_LIMIT for name, size, _ in plan if name != "torch-1")
    assert dict((n, names) for n, _, names in plan)["torch-1"] == ["torch"]  # alone: over the limit
    text = lockmod.format_lock(_request(cuda_major="12", indexes=()), packages, uv_version="0.13.9")
    assert "# layer torch-1 (2.50 GB single package over the limit): torch" in text


def test_lock_text_round_trips_and_is_deterministic():
    packages = [_pkg("six", "1.17.0"), _pkg("attrs", "26.1.0")]
    request = _request(indexes=())
    text = lockmod.format_lock(request, packages, uv_version="0.13.9")
    assert text == lockmod.format_lock(request, list(reversed(packages)), uv_version="0.13.9")
    parsed = Lock.parse(text)
    assert parsed.fingerprint == lockmod.lock_fingerprint(request, text)
    assert parsed.packages == {"attrs": ("26.1.0", [f"sha256:{'a' * 64}"]), "six": ("1.17.0", [f"sha256:{'a' * 64}"])}
    assert parsed.layers() == ["venv", "rest-1"] and not parsed.refused and not parsed.unhashed
    assert text.index("attrs==26.1.0") < text.index("six==1.17.0")


def test_unhashed_and_refused_locks_are_recognised():
    text = lockmod.format_lock(_request(), [], uv_version="0.13.9", refused="torch 2.9.1 is a CUDA 12 build")
    assert Lock.parse(text).refused == "torch 2.9.1 is a CUDA 12 build"
    unhashed = Lock.parse("# fingerprint: x\n\ntensorrt-llm==1.2.1  # unhashed: index unreachable\n")
    assert unhashed.unhashed == ["tensorrt-llm"]


def test_diff_names_added_removed_and_changed_packages():
    old = Lock.parse("a==1 \\\n    --hash=sha256:" + "0" * 64 + "\nb==1\nc==1\n")
    new = Lock.parse("a==2\nc==1\nd==1\n")
    assert lockmod.lock_diff(old, new) == ["~ a 1 -> 2", "- b 1", "+ d 1"]


def test_fingerprint_follows_what_decides_the_payload():
    base = _request()
    assert base.fingerprint() == _request().fingerprint()
    for change in (dict(pins=("torch==2.9.0",)), dict(python="3.11"), dict(cuda_major="12"),
                   dict(indexes=()), dict(default_index="https://mirror/simple"), dict(installer="uv==1"),
                   dict(exclude_newer="2026-05-02T05:50:15Z")):
        assert _request(**change).fingerprint() != base.fingerprint(), change


# ---------------------------------------------------------------- --check


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_example_recipe_has_a_current_lock(path):
    result = lockmod.check_lock(str(path))
    assert result.problem == "", f"{path.name}: {result.problem}: run imgfab lock {path}"


def test_vllm_example_locks_are_installable_and_trtllm_ones_refused():
    for path in RECIPES:
        parsed = Lock.parse(path.with_suffix(".lock").read_text())
        if "tensorrt-llm" in path.read_text():
            assert "CUDA 12 build" in parsed.refused and "https://download.pytorch.org/whl/cu130" in parsed.refused
        else:
            assert parsed.packages and not parsed.unhashed and not parsed.refused
            assert all(hashes for _, hashes in parsed.packages.values())
            # one CUDA major, but for the reviewed exceptions (compat/payload.yaml)
            majors = {name.rsplit("-cu", 1)[1] for name in parsed.packages
                      if name.startswith("nvidia-") and re.search(r"-cu[0-9]+$", name)
                      and name != "nvidia-cutlass-dsl-libs-cu12"}
            assert len(majors) <= 1, (path.name, majors)


def test_check_exits_1_naming_missing_and_stale_locks(tmp_path):
    recipe = tmp_path / "qwen2-7b-h100.yaml"
    shutil.copyfile(REPO / "recipes" / "qwen2-7b-h100.yaml", recipe)
    other = tmp_path / "llama31-8b-l4.yaml"
    shutil.copyfile(REPO / "recipes" / "llama31-8b-l4.yaml", other)
    stale = (REPO / "recipes" / "llama31-8b-l4.lock").read_text().replace("# fingerprint: ", "# fingerprint: 0", 1)
    (tmp_path / "llama31-8b-l4.lock").write_text(stale)
    result = subprocess.run([sys.executable, "-m", "imgfab.cli", "lock", "--check", str(recipe), str(other)],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "qwen2-7b-h100 (qwen2-7b-h100.lock missing)" in result.stderr
    assert "llama31-8b-l4 (llama31-8b-l4.lock stale" in result.stderr
    shutil.copyfile(REPO / "recipes" / "qwen2-7b-h100.lock", tmp_path / "qwen2-7b-h100.lock")
    result = subprocess.run([sys.executable, "-m", "imgfab.cli", "lock", "--check", str(recipe)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_build_refuses_a_refused_lock_before_docker():
    from imgfab.matrix.compat import load_matrix
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import resolve

    path = REPO / "recipes" / "mistral-7b-a100-trtllm.yaml"
    recipe = load_recipe(path)
    stack = resolve(recipe, load_matrix()).stack
    with pytest.raises(CompatibilityError, match="CUDA 12 build"):
        lockmod.load_for_build(str(path), recipe, stack)


# ---------------------------------------------------------------- RECORD by range requests


def _wheel_bytes(files: dict[str, bytes], *, zip64: bool = False) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=zip64) as handle:
                handle.write(data)
    return buffer.getvalue()


class _Response:
    def __init__(self, status, content, headers=None):
        self.status_code, self.content, self.headers = status, content, headers or {}


class _Session:
    """Serves one byte string; honours Range unless ``ranges`` is False. Counts bytes sent."""

    def __init__(self, data: bytes, ranges: bool = True):
        self.data, self.ranges, self.sent = data, ranges, 0

    def get(self, url, headers=None, timeout=None):
        header = (headers or {}).get("Range", "")
        if not self.ranges or not header:
            self.sent += len(self.data)
            return _Response(200, self.data)
        spec = header.split("=", 1)[1]
        start, end = spec.split("-")
        if start == "":
            first = max(0, len(self.data) - int(end))
            last = len(self.data) - 1
        else:
            first, last = int(start), min(int(end), len(self.data) - 1)
        body = self.data[first:last + 1]
        self.sent += len(body)
        return _Response(206, body, {"Content-Range": f"bytes {first}-{last}/{len(self.data)}"})


@pytest.mark.parametrize("zip64", [False, True])
def test_record_is_read_with_range_requests_only(tmp_path, monkeypatch, zip64):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    record = b"pkg/__init__.py,sha256=x,3\npkg-1.0.dist-info/RECORD,,\n"
    big = os.urandom(3 * wheelzip.TAIL_BYTES)  # incompressible: the RECORD is far from the end
    data = _wheel_bytes({"pkg/__init__.py": b"x=1", "pkg/blob.bin": big,
                         "pkg-1.0.dist-info/METADATA": b"Name: pkg\n", "pkg-1.0.dist-info/RECORD": record}, zip64=zip64)
    session = _Session(data)
    digest = hashlib.sha256(data).hexdigest()
    found = wheelzip.read_members("https://h/pkg-1.0-py3-none-any.whl", digest,
                                  (".dist-info/RECORD", ".dist-info/METADATA"), session=session)
    assert found[".dist-info/RECORD"] == record.decode()
    assert found[".dist-info/METADATA"] == "Name: pkg\n"
    assert session.sent < len(data) / 2, "only the tail and the members were fetched"
    # Cached by the wheel's sha256: no request the second time.
    again = _Session(b"")
    assert wheelzip.read_members("https://h/x.whl", digest, session=again)[".dist-info/RECORD"] == record.decode()
    assert again.sent == 0


def test_a_server_ignoring_ranges_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    data = _wheel_bytes({"a.py": b"", "a-1.dist-info/RECORD": b"a.py,,\n"})
    found = wheelzip.read_members("http://127.0.0.1/a.whl", "f" * 64, session=_Session(data, ranges=False))
    assert found[".dist-info/RECORD"] == "a.py,,\n"


# ---------------------------------------------------------------- staging (the builder step)


def _install(site: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True)
    rows = []
    for path, data in files.items():
        target = site / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{path},sha256={digest},{len(data)}")
    (dist / "uv_cache.json").write_text('{"timestamp": 1}')
    rows.append(f"{dist.name}/uv_cache.json,sha256=x,15")
    rows.append(f"{dist.name}/RECORD,,")
    (dist / "RECORD").write_text("\n".join(reversed(rows)) + "\n")


def test_stage_splits_cuts_and_normalises(tmp_path):
    venv = tmp_path / "opt" / "venv"
    site = venv / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin").mkdir()
    os.symlink("/usr/bin/python3", venv / "bin" / "python")
    _install(site, "torch", "2.10.0", {"torch/__init__.py": b"", "torch/lib/libtorch.a": b"static",
                                       "torch/__pycache__/x.cpython-312.pyc": b"pyc"})
    _install(site, "vllm", "0.19.1", {"vllm/__init__.py": b"", "../../../bin/vllm": b"#!/opt/venv/bin/python\n"})
    _install(site, "six", "1.17.0", {"six.py": b""})
    lock = tmp_path / "x.lock"
    lock.write_text("# layer torch-1 (1 MB): torch\n# layer vllm-1 (1 MB): vllm\n# layer rest-1 (1 MB): six\n")
    staging = tmp_path / "layers"
    stage.stage(lock, venv, staging)
    rel = venv.relative_to("/")
    torch_tree = staging / "torch-1" / rel / "lib" / "python3.12" / "site-packages"
    assert (torch_tree / "torch" / "__init__.py").is_file()
    assert not (torch_tree / "torch" / "lib" / "libtorch.a").exists(), "static library cut"
    assert not (torch_tree / "torch" / "__pycache__" / "x.cpython-312.pyc").exists(), "shipped cache cut"
    # Bytecode compiled in place: hash-based, never re-validated, recording the final path.
    pycs = list((torch_tree / "torch" / "__pycache__").glob("__init__.*.pyc"))
    assert len(pycs) == 1 and int.from_bytes(pycs[0].read_bytes()[4:8], "little") == 0b01
    assert str(venv / "lib" / "python3.12" / "site-packages" / "torch" / "__init__.py").encode() in pycs[0].read_bytes()
    assert not (torch_tree / "torch-2.10.0.dist-info" / "uv_cache.json").exists()
    record = (torch_tree / "torch-2.10.0.dist-info" / "RECORD").read_text().splitlines()
    assert record == sorted(record) and not any("uv_cache.json" in line for line in record)
    assert (staging / "vllm-1" / rel / "bin" / "vllm").is_file()
    assert (staging / "rest-1" / rel / "lib" / "python3.12" / "site-packages" / "six.py").is_file()
    assert (staging / "venv" / rel / "pyvenv.cfg").is_file()
    assert os.readlink(staging / "venv" / rel / "bin" / "python") == "/usr/bin/python3"
    assert not any(venv.iterdir()), "everything moved"
    for root, dirs, files in os.walk(staging):
        for name in dirs + files:
            info = os.lstat(os.path.join(root, name))
            assert info.st_mtime == stage.EPOCH and info.st_uid == 0, os.path.join(root, name)


def test_stage_refuses_a_locked_distribution_that_is_not_installed(tmp_path):
    venv = tmp_path / "venv"
    (venv / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    lock = tmp_path / "x.lock"
    lock.write_text("# layer torch-1 (1 MB): torch\n")
    with pytest.raises(SystemExit) as caught:
        stage.stage(lock, venv, tmp_path / "layers")
    assert caught.value.code == 2


def test_stage_rules_match_the_lock_cut_rules():
    assert stage.cut_kind("triton/backends/nvidia/lib/libcudart.a") == "static"
    assert stage.cut_kind("numpy/__pycache__/x.pyc") == "cache"
    assert stage.cut_kind("torch/lib/libtorch_cuda.so") is None


# ---------------------------------------------------------------- cubins for other GPUs


@pytest.mark.parametrize("name, arch", [
    ("cubins/x/fmha/fmhaSm100fKernel_QkvE4m3OBfloat16H128.cubin", (100, "f")),
    ("cubins/gemm/Gemm_Bfloat16_t128x64_schedS_sm100f.cubin", (100, "f")),
    ("a/fmhaSm103aKernel_Qkv.cubin", (103, "a")),
    ("a/kernel_sm_90a.cubin", (90, "a")),
    ("deep-gemm/kernel.fp8_m_grouped_gemm.007404769193.cubin", None),  # no arch in the name: kept
    ("torch/lib/libsm100.so", None),
])
def test_cubin_arch_comes_from_the_last_sm_in_the_file_name(name, arch):
    assert stage.cubin_arch(name) == arch


@pytest.mark.parametrize("sm, suffix, capability, runs", [
    (100, "f", "9.0", False), (100, "f", "10.0", True), (100, "f", "10.3", True),
    (103, "a", "10.0", False), (100, "a", "10.3", False), (90, "a", "9.0", True),
    (80, "", "8.9", True), (89, "", "8.0", False), (90, "", "12.0", False),
])
def test_a_cubin_runs_on_its_major_at_or_above_its_minor_and_a_builds_only_exactly(sm, suffix, capability, runs):
    assert stage.runs_on(sm, suffix, capability) is runs


@pytest.mark.parametrize("sm", [80, 89, 90, 100, 103, 120])
def test_the_sm_is_read_from_both_elf_layouts(sm):
    assert stage.elf_sm(fake_cubin(sm)) == sm
    assert stage.elf_sm(fake_cubin(sm, arch_specific=True)) == sm


def test_a_file_that_is_not_a_cuda_elf_has_no_sm():
    x86 = bytearray(fake_cubin(90))
    x86[18:20] = (62).to_bytes(2, "little")  # EM_X86_64
    assert stage.elf_sm(bytes(x86)) is None and stage.elf_sm(b"not an elf" * 10) is None


def test_the_arch_cut_keeps_what_the_served_gpu_runs_and_files_without_a_name():
    gpus = ("9.0",)
    assert stage.cut_kind("f/fmhaSm100fKernel_x.cubin", gpus) == "arch"
    assert stage.cut_kind("f/kernel_sm90a.cubin", gpus) is None
    assert stage.cut_kind("f/kernel_sm80.cubin", gpus) == "arch", "sm80 SASS does not run on 9.0"
    assert stage.cut_kind("deep-gemm/kernel.fp8.0074.cubin", gpus) is None
    assert stage.cut_kind("f/fmhaSm100fKernel_x.cubin") is None, "no # serves line: no arch cut"


def _venv_with_cubins(tmp_path: Path, files: dict[str, bytes]) -> tuple[Path, Path]:
    venv = tmp_path / "opt" / "venv"
    site = venv / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    _install(site, "flashinfer-cubin", "0.6.6", files)
    lock = tmp_path / "x.lock"
    lock.write_text("# serves: 9.0 (the recipe's H100)\n# layer vllm-1 (1 MB): flashinfer-cubin\n")
    return venv, lock


def test_stage_cuts_cubins_the_served_gpu_cannot_run(tmp_path, capsys):
    venv, lock = _venv_with_cubins(tmp_path, {
        "flashinfer_cubin/cubins/fmhaSm100fKernel_a.cubin": fake_cubin(100),
        "flashinfer_cubin/cubins/fmhaSm103aKernel_b.cubin": fake_cubin(103, arch_specific=True),
        "flashinfer_cubin/cubins/gemm_sm90a.cubin": fake_cubin(90, arch_specific=True),
        "flashinfer_cubin/cubins/deep/kernel.0074.cubin": fake_cubin(100),
    })
    staging = tmp_path / "layers"
    stage.stage(lock, venv, staging)
    tree = staging / "vllm-1" / venv.relative_to("/") / "lib" / "python3.12" / "site-packages" / "flashinfer_cubin" / "cubins"
    assert sorted(p.name for p in tree.rglob("*.cubin")) == ["gemm_sm90a.cubin", "kernel.0074.cubin"]
    assert "imgfab-stage: cut arch: 2 files" in capsys.readouterr().out


@pytest.mark.parametrize("data, said", [(fake_cubin(90), "says sm90"), (b"\0" * 64, "not a CUDA ELF")])
def test_stage_fails_when_a_cubin_header_contradicts_its_name(tmp_path, capsys, data, said):
    venv, lock = _venv_with_cubins(tmp_path, {"flashinfer_cubin/cubins/fmhaSm100fKernel_a.cubin": data})
    with pytest.raises(SystemExit) as caught:
        stage.stage(lock, venv, tmp_path / "layers")
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "fmhaSm100fKernel_a.cubin: named sm100f" in err and said in err and len(err.splitlines()) == 1
    assert (venv / "lib" / "python3.12" / "site-packages" / "flashinfer_cubin" / "cubins"
            / "fmhaSm100fKernel_a.cubin").exists(), "nothing cut on a lying name"


def test_lock_names_the_served_gpu_the_cut_and_the_cut_architectures():
    fi = _pkg("flashinfer-cubin", "0.6.6", urls=["https://files.pythonhosted.org/x/fi.whl"])
    fi.cuts, fi.cut_archs = {"arch": 1_040_000_000}, {"sm103a", "sm100f", "sm100a"}
    text = lockmod.format_lock(_request(indexes=(), serves=("9.0",), gpu="H100-SXM"), [fi], uv_version="0.13.9")
    assert "# serves: 9.0 (the recipe's H100-SXM:" in text
    assert "# cubins-cut: sm100a sm100f sm103a (" in text
    assert "# cut: cubins no GPU the image serves can run: 1.04 GB (flashinfer-cubin 1.04 GB)" in text
    lock = Lock.parse(text)
    assert lock.cubins_cut == ("sm100a", "sm100f", "sm103a")
    assert stage.serves(text) == ("9.0",)
    label = ("7.0", "7.5", "8.0", "8.9", "9.0", "10.0", "10.3", "12.0")
    assert lock.serving_archs(label) == ("7.0", "7.5", "8.0", "8.9", "9.0", "12.0")


def test_the_served_gpu_is_part_of_the_fingerprint():
    assert _request(serves=("9.0",)).fingerprint() != _request(serves=("8.9",)).fingerprint()


def test_every_vllm_example_lock_serves_its_recipe_gpu_and_labels_follow_the_cut():
    from imgfab.matrix.compat import load_matrix
    from imgfab.recipe import load_recipe
    from imgfab.render.context import render_context
    from imgfab.stack.resolve import resolve

    matrix = load_matrix()
    for path in RECIPES:
        recipe = load_recipe(path)
        stack = resolve(recipe, matrix).stack
        lock = lockmod.committed_lock(path, recipe, stack)
        if lock is None:  # the TensorRT-LLM locks are refusals
            continue
        assert stage.serves(lock.text) == (stack.compute_capability,), path.name
        served = lockmod.served_stack(stack, lock)
        files = render_context(recipe, served, matrix, lock=lock)
        label = next(line for line in files["Dockerfile"].splitlines() if "org.imgfab.archs=" in line)
        for cut in lock.cubins_cut:
            assert not any(stage.runs_on(*stage.arch_label(cut), a) for a in served.archs), (path.name, cut)
        assert ",".join(served.archs) in label


def test_stage_compiles_each_group_in_an_interpreter_of_its_own_with_one_worker(tmp_path, monkeypatch):
    """A .pyc's bytes depend on what the compiling process did before (marshal's reference
    flags follow reference counts): each layer group gets a fresh interpreter and one worker,
    so a group's bytes depend on its own files only."""
    import subprocess as sp

    calls = []
    monkeypatch.setattr(sp, "run", lambda argv, **kwargs: calls.append(argv))
    venv, lock = _venv_with_cubins(tmp_path, {"flashinfer_cubin/__init__.py": b""})
    stage.stage(lock, venv, tmp_path / "layers")
    trees = sorted(Path(argv[-1]).name for argv in calls)
    assert trees == ["venv", "vllm-1"], "one interpreter per group"
    assert all(argv[0] == os.path.realpath(sys.executable) and "workers=1" in argv[3] for argv in calls)


def test_stage_bytecode_is_compiled_and_valid_at_its_final_path(tmp_path):
    venv, lock = _venv_with_cubins(tmp_path, {"flashinfer_cubin/__init__.py": b"X = frozenset({'a', 'b'})\n"})
    stage.stage(lock, venv, tmp_path / "layers")
    tree = tmp_path / "layers" / "vllm-1" / venv.relative_to("/") / "lib" / "python3.12" / "site-packages"
    pycs = list((tree / "flashinfer_cubin" / "__pycache__").glob("__init__.*.pyc"))
    assert len(pycs) == 1 and int.from_bytes(pycs[0].read_bytes()[4:8], "little") == 0b01  # unchecked hash


def test_a_reviewed_collision_is_named_in_the_lock_and_cut_by_the_stage(tmp_path, capsys):
    """build_backend.py: flashinfer-python and torch-c-dlpack-ext both install it with different
    bytes; uv extracts in parallel, so which one is left differed between two cold builds of one
    lock. Reviewed as never read (compat/payload.yaml), it is cut."""
    a = _pkg("flashinfer-python", files={"build_backend.py": "sha256=AAA", "flashinfer/__init__.py": "sha256=F"})
    b = _pkg("torch-c-dlpack-ext", files={"build_backend.py": "sha256=BBB"})
    allowed = (("build_backend.py", ("flashinfer-python", "torch-c-dlpack-ext")),)
    assert lockmod.reviewed_collisions([a, b], allowed) == ["build_backend.py"]
    assert lockmod.reviewed_collisions([a, b], ()) == [], "an unreviewed collision refuses instead"
    text = lockmod.format_lock(_request(indexes=(), collisions_allowed=allowed), [a, b], uv_version="0.13.9")
    assert "# collisions-cut: build_backend.py (" in text and stage.collisions(text) == ("build_backend.py",)

    venv = tmp_path / "opt" / "venv"
    site = venv / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    _install(site, "flashinfer-python", "0.6.6", {"build_backend.py": b"one", "flashinfer/__init__.py": b""})
    _install(site, "torch-c-dlpack-ext", "0.1.5", {"build_backend.py": b"two"})
    lock = tmp_path / "x.lock"
    lock.write_text(text.split("\n\n")[0] + "\n")
    stage.stage(lock, venv, tmp_path / "layers")
    assert not list((tmp_path / "layers").rglob("build_backend.py*")), "cut in every group"
    assert list((tmp_path / "layers").rglob("flashinfer/__init__.py"))
    assert "imgfab-stage: cut collision: 1 files" in capsys.readouterr().out


def test_stage_run_by_the_venv_it_stages_still_compiles(tmp_path, monkeypatch):
    """The engine path runs imgfab-stage with /opt/venv/bin first on PATH: the python3 it runs
    as is a link inside the venv it moves away. The compiles use the resolved interpreter."""
    venv, lock = _venv_with_cubins(tmp_path, {"flashinfer_cubin/__init__.py": b"X = 1\n"})
    (venv / "bin").mkdir()
    os.symlink(os.path.realpath(sys.executable), venv / "bin" / "python3")
    monkeypatch.setattr(sys, "executable", str(venv / "bin" / "python3"))
    stage.stage(lock, venv, tmp_path / "layers")
    tree = tmp_path / "layers" / "vllm-1" / venv.relative_to("/") / "lib" / "python3.12" / "site-packages"
    assert list((tree / "flashinfer_cubin" / "__pycache__").glob("__init__.*.pyc"))


def test_a_reviewed_wheel_of_another_cuda_major_is_allowed_only_where_reviewed(matrix):
    """nvidia-cutlass-dsl[cu13] (vLLM 0.26) requires its -libs-cu12 flavor too: reviewed in
    compat/payload.yaml for vLLM on CUDA 13, and only there; every other mix still refuses."""
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import resolve

    mixed = [_pkg("nvidia-cutlass-dsl-libs-cu12"), _pkg("nvidia-cutlass-dsl-libs-cu13"),
             _pkg("nvidia-nccl-cu13")]
    recipe = load_recipe(REPO / "recipes" / "qwen2-7b-h200.yaml")
    request = lockmod.payload_request(recipe, resolve(recipe, matrix).stack)
    assert request.other_majors_allowed == ("nvidia-cutlass-dsl-libs-cu12",)
    lockmod.check_cuda_majors(mixed, request.other_majors_allowed)
    with pytest.raises(CompatibilityError, match="2 majors"):
        lockmod.check_cuda_majors(mixed + [_pkg("nvidia-nccl-cu12")], request.other_majors_allowed)
    old = load_recipe(VLLM_0191)  # vLLM 0.19.1 on CUDA 12
    assert lockmod.payload_request(old, resolve(old, matrix).stack).other_majors_allowed == ()
