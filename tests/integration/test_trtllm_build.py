"""Build the TensorRT engine recipe's builder stage on the local engine, up to where a GPU is needed.

A fake ``tensorrt-llm`` (plus ``tensorrt`` and ``torch``) wheel and the real uv wheel are served from
a PEP 503/691 index by the local stack's nginx; the recipe is locked against it (`imgfab lock --index-url`) and the
builder installs that lock. The builder image is then run WITHOUT a GPU: the compile step prints exactly
the checked argv and refuses cleanly (exit 5). Weights and calibration prompts are never in a layer.

Run with the local stack: ``source .stack/env && python -m pytest -m integration tests/integration``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from imgfab.render import trtllm
from imgfab.payload.lock import load_for_build
from imgfab.recipe import load_recipe
from imgfab.render.context import render_context, write_context
from imgfab.stack.resolve import resolve

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "llama31-8b-h100-fp8-engine.yaml"
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from fake_payload import INDEX_TIMEOUT_S, installer_wheel, project_json, published_index  # noqa: E402
DOCKER = os.environ.get("IMGFAB_DOCKER_CLI", "/usr/bin/docker")

if not os.environ.get("DOCKER_HOST"):
    if os.environ.get("CI") == "true":
        pytest.fail("DOCKER_HOST is unset under CI=true: the integration stack is missing",
                    pytrace=False)
    pytest.skip("DOCKER_HOST unset: source .stack/env to run the integration tests",
                allow_module_level=True)


def _wheel(directory: Path, name: str, version: str, files: dict[str, str],
           scripts: dict[str, str] | None = None) -> None:
    dist = f"{name.replace('-', '_')}-{version}"
    meta = {f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
            f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: imgfab-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    if scripts:
        meta[f"{dist}.dist-info/entry_points.txt"] = "[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in scripts.items())
    contents = {**files, **meta}
    record = []
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, text in sorted(contents.items()):
            data = text.encode()
            archive.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        record.append(f"{dist}.dist-info/RECORD,,")
        archive.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    project = directory / name
    project.mkdir(parents=True, exist_ok=True)
    filename = f"{dist}-py3-none-any.whl"
    (project / filename).write_bytes(buffer.getvalue())
    (project / "index.html").write_text(f'<a href="{filename}">{filename}</a>\n')
    project_json(project, name, [project / filename], [version])


FAKE_CLI = '''import sys
def main():
    print("fake " + sys.argv[0].rsplit("/", 1)[-1] + " " + " ".join(sys.argv[1:]))
'''


@pytest.fixture(scope="module")
def index(matrix):
    with published_index() as (folder, base):
        root = folder / "simple"
        torch = resolve(load_recipe(RECIPE), matrix).stack.torch  # the stack's own pin (2.9.1+cu130)
        _wheel(root, "tensorrt-llm", "1.2.1",
               {"tensorrt_llm/__init__.py": '__version__ = "1.2.1"\n',
                "tensorrt_llm/quantization/__init__.py": "def quantize_and_export(**kw):\n    raise SystemExit('fake')\n",
                "tensorrt_llm/commands/__init__.py": "", "tensorrt_llm/commands/fake.py": FAKE_CLI},
               {s: "tensorrt_llm.commands.fake:main" for s in ("trtllm-build", "trtllm-refit", "trtllm-serve")})
        _wheel(root, "tensorrt", "10.14.1.48.post1", {"tensorrt/__init__.py": '__version__ = "10.14.1.48.post1"\n'})
        _wheel(root, "torch", torch, {"torch/__init__.py": f'__version__ = "{torch}"\n'})
        # The builder installs the lock with the real uv wheel compat/payload.yaml pins (hash-checked).
        uv = installer_wheel()
        (root / "uv").mkdir()
        shutil.copyfile(uv, root / "uv" / uv.name)
        (root / "uv" / "index.html").write_text(f'<a href="{uv.name}">{uv.name}</a>\n')
        # PEP 691 JSON with upload times (the lock's era bound needs them), as serve_index writes
        project_json(root / "uv", "uv", [root / "uv" / uv.name], [])
        yield f"{base}/simple"


def _docker(*args, timeout=900, check=True):
    result = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:2])} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def builder(index, tmp_path_factory, matrix):
    recipe = load_recipe(RECIPE)
    stack = resolve(recipe, matrix).stack
    work = tmp_path_factory.mktemp("ctx")
    # The recipe locked against the fake index: the builder installs nothing else.
    lock_file = work / "test.lock"
    locked = subprocess.run([sys.executable, "-m", "imgfab.cli", "lock", str(RECIPE), "--index-url",
                             index, "--output", str(lock_file)], capture_output=True, text=True)
    assert locked.returncode == 0, locked.stderr
    lock = load_for_build(str(RECIPE), recipe, stack, lock_file)  # parsed strictly, bound to compat/payload.yaml
    context = write_context(render_context(recipe, stack, matrix, lock=lock), work / "ctx")
    pip_conf = work / "pip.conf"
    pip_conf.write_text(f"[global]\nindex-url = {index}\ntimeout = {INDEX_TIMEOUT_S}\nretries = 0\n")
    mirror = os.environ.get("IMGFAB_MIRROR", "127.0.0.1:5000/mirror")
    tag = "imgfab-test/trtllm-builder:latest"
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    result = subprocess.run(
        [DOCKER, "build", "--target", "builder", "--network", "host", "--progress", "plain",
         "--build-arg", f"BUILDER_IMAGE={mirror}/{stack.builder_image}", "--secret", f"id=pip-conf,src={pip_conf}",
         "-t", tag, str(context)], capture_output=True, text=True, timeout=1500, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    yield recipe, stack, tag, result.stderr
    _docker("rmi", "-f", tag, check=False)


def test_compile_command_is_the_checked_argv(builder):
    recipe, stack, tag, _ = builder
    plan = trtllm.engine_plan(recipe, stack)
    out = _docker("run", "--rm", tag, "/opt/imgfab/bin/imgfab-compile", "two-phase", "--print")
    assert out.stdout.splitlines() == [" ".join(plan.checkpoint_argv), " ".join(plan.build_argv)]
    inspect = _docker("inspect", "--format", "{{json .Config.Cmd}}", tag).stdout.strip()
    assert inspect == '["/opt/imgfab/bin/imgfab-compile","two-phase"]'


def test_compile_fails_cleanly_without_gpu(builder):
    _, _, tag, _ = builder
    out = _docker("run", "--rm", tag, check=False)  # the default CMD: imgfab-compile two-phase
    assert out.returncode == 5, out.stdout + out.stderr
    assert "no GPU visible" in out.stderr and "Traceback" not in out.stderr


def test_installed_commands_resolve(builder):
    _, _, tag, _ = builder
    out = _docker("run", "--rm", tag, "bash", "-c", "command -v trtllm-build trtllm-refit python3")
    assert "/opt/venv/bin/trtllm-build" in out.stdout


def test_no_weights_or_prompts_in_any_layer(builder, tmp_path):
    _, _, tag, _ = builder
    archive = tmp_path / "image.tar"
    _docker("save", "-o", str(archive), tag)
    prompt = (REPO / "recipes" / "calibration" / "chat-prompts.txt").read_text().splitlines()[0].encode()
    with tarfile.open(archive) as outer:
        for member in outer.getmembers():
            if not member.name.endswith("layer.tar"):
                continue
            with tarfile.open(fileobj=outer.extractfile(member)) as layer:
                for entry in layer.getmembers():
                    assert not entry.name.endswith((".safetensors", ".bin", "train.txt")), entry.name
                    if entry.isfile() and entry.size < 1 << 20:
                        assert prompt not in layer.extractfile(entry).read(), entry.name
    history = _docker("history", "--no-trunc", tag).stdout
    assert "pip.conf" not in history and "chat-prompts" not in history
