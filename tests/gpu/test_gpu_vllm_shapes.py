"""The rendered vLLM runtime serves on a real GPU in every run shape, with real vLLM.

Run on the GPU machine after ``tests/gpu/standin.sh`` (docker-up, base, payload; then
``eval "$(tests/gpu/standin.sh env)"``)::

    IMGFAB_GPU_PROOF_OUT=/tmp/proof python -m pytest -m gpu tests/gpu/test_gpu_vllm_shapes.py -s

The recipe is ``recipes/qwen2-7b-h200.yaml`` (vLLM 0.26.0, torch 2.11.0, CUDA 13), rendered by
imgfab; its runtime stage is built unchanged but for what :func:`standin_dockerfile` replaces
(the base, the apt-get of the OS layer, the payload COPYs as one COPY of the venv assembled here), and ``imgfab smoke
--synthetic-model`` starts it as run.sh, as compose.yaml and as k8s.yaml would, each against a
random-weight Qwen2 made inside the image. What this does not prove: that the lock installs
(the payload is the lock's packages, less the host's own torch and CUDA wheels at the same
versions), and the real ``nvidia/cuda`` base (the host's Ubuntu 24.04 stands in).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "qwen2-7b-h200.yaml"
IMAGE = "imgfab-proof/qwen2-7b-h200:standin"
CACHE_VOLUME = "imgfab-proof-qwen2-7b-h200-cache"
GPU_DEVICES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
_APT = re.compile(r"^(rm -f /etc/apt/apt\.conf\.d/docker-clean|apt-get .*)$")


def standin_dockerfile(dockerfile: str, base: str) -> tuple[str, list[str]]:
    """The rendered runtime stage (and the ``files`` stage it copies from) with the stand-in's
    replacements, and what they removed: ``FROM`` the stand-in base; the OS layer without its
    apt steps (the base holds the packages); the payload ``COPY --from=builder`` layers as one
    ``COPY venv/ /opt/venv/`` of the venv assembled on this host (there is no builder stage
    here); ``COPY --link`` as plain ``COPY``, because the GPU host's Debian bookworm dockerd
    builds with the classic builder (the files and their owners are the same; only the layer's
    independence from the one below, which the stand-in does not push, is lost). Everything
    else, the CUDA_HOME view and its nvcc check and the epoch stamps included, runs as rendered."""
    first = "FROM ${RUNTIME_IMAGE} AS files"
    if first not in dockerfile:
        first = "FROM ${RUNTIME_IMAGE} AS runtime"
    stage = dockerfile[dockerfile.index(first):]
    removed: list[str] = [line for line in stage.split("\n") if line.startswith("FROM ${RUNTIME_IMAGE} AS ")]
    stage = stage.replace("FROM ${RUNTIME_IMAGE} AS ", f"FROM {base} AS ")
    lines, out, i = stage.split("\n"), [], 0
    payload = tuple(f"COPY {link}--from={stage_name} /opt/imgfab/layers/" for link in ("", "--link ")
                    for stage_name in ("builder", "payload"))
    while i < len(lines):
        line = lines[i]
        if line.startswith(payload):
            if not any(r.startswith(payload) for r in removed):
                out.append("COPY venv/ /opt/venv/")
                if "AS kernels" in dockerfile:
                    # the runtime leaves the compiler wheels' layer out (toolkit-N): so does this venv
                    out.append(f"RUN python3 /opt/venv/{DROP_TOOLKIT}")
            removed.append(line)
        elif line == KERNELS_COPY:
            # the kernels stage ran as a container on this host (standin_kernels): its output
            out.append("COPY kernels/ /")
            removed.append(line)
        elif line.startswith("COPY --link "):
            removed.append(f"--link of {line}")
            out.append("COPY " + line.removeprefix("COPY --link "))
        elif line.startswith("RUN --mount=type=cache,target=/var/cache/apt"):
            logical = []
            while lines[i].endswith("\\"):
                logical.append(lines[i][:-1].strip())
                i += 1
            logical.append(lines[i].strip())
            text = " ".join(logical).removeprefix("RUN ")
            parts = [p.strip() for p in text.split(" && ")]
            head = parts[0].split()
            removed += [w for w in head if w.startswith("--mount=")]
            parts[0] = " ".join(w for w in head if not w.startswith("--mount="))
            removed += [p for p in parts if _APT.match(p)]
            kept = [p for p in parts if not _APT.match(p)]
            out.append("RUN " + " \\\n    && ".join(kept))
        else:
            out.append(line)
        i += 1
    return "\n".join(out), removed


KERNELS_COPY = "COPY --link --from=kernels /opt/imgfab/layers/kernels/ /"
# Removes what the lock's toolkit group holds (the cuda-toolkit[cccl,crt,nvcc,nvvm] wheels, by
# their RECORDs) from the stand-in's venv, as the runtime's layer plan leaves that group out.
DROP_TOOLKIT = "imgfab-standin-drop-toolkit.py"
DROP_TOOLKIT_SOURCE = """import pathlib, re, shutil, sys
site = next(pathlib.Path('/opt/venv/lib').glob('python3*/site-packages'))
dropped = 0
for info in site.glob('*.dist-info'):
    name = re.sub(r'[-_.]+', '-', info.name.rsplit('-', 1)[0]).lower()
    if not re.match(r'^nvidia-(cuda-nvcc|nvvm|cuda-crt|cuda-cccl)$', name):
        continue
    for row in (info / 'RECORD').read_text().splitlines():
        path = site / row.rsplit(',', 2)[0]
        if path.is_file() or path.is_symlink():
            path.unlink()
            dropped += 1
    shutil.rmtree(info, ignore_errors=True)
print('stand-in: dropped', dropped, 'files of the toolkit wheels')
pathlib.Path(sys.argv[0]).unlink()
"""


def standin_kernels(dockerfile: str, context: Path, base: str, env: dict[str, str]) -> dict:
    """The rendered kernels stage run on this host with no GPU (a container without devices,
    the host's torch bind-mounted read-only as the stand-in's runtime has it, since the classic
    builder mounts nothing): its RUN line as rendered, over a hard-linked copy of the assembled
    venv. Writes ``context/kernels`` (what the runtime's COPY takes) and returns the record."""
    import time

    import hashlib

    start = dockerfile.index("FROM builder AS kernels")
    stage = dockerfile[start:dockerfile.index("\nFROM ", start + 1)]
    run = stage[stage.index("\nRUN ") + 5:].rstrip()
    # One compile per lease: each proof step is its own pytest process, and the same stage and
    # script give the same kernels (kept under the stand-in's state directory).
    launchers = context / "imgfab-triton-launchers.json"
    key = hashlib.sha256((run + (context / "imgfab-kernels.py").read_text()
                          + (launchers.read_text() if launchers.is_file() else "")).encode()).hexdigest()[:16]
    state = Path(os.environ.get("IMGFAB_STANDIN", "/tmp/imgfab-standin"))
    kept = state / f"kernels-{key}"
    if (kept / "record.json").is_file():
        shutil.copytree(kept / "kernels", context / "kernels", symlinks=True)
        return {**json.loads((kept / "record.json").read_text()), "reused": str(kept)}
    (context / "kernels").mkdir()
    work = context.parent / "kernels-venv"  # outside the build context: never sent to the builder
    subprocess.run(["cp", "-al", "/opt/venv", str(work)], check=True)
    argv = ["docker", "run", "--rm", "--network", "none", "--user", "0",
            "-v", f"{work}:/opt/venv", "-v", f"{context / 'imgfab-kernels.py'}:/opt/imgfab/imgfab-kernels.py:ro",
            "-v", f"{context / 'kernels'}:/opt/imgfab/layers/kernels",
            # FlashInfer's build tree, kept: a second run (other launchers) recompiles nothing
            "-v", f"{state / 'flashinfer-workspace'}:/tmp/imgfab-kernels"]
    if launchers.is_file():
        argv[-2:-2] = ["-v", f"{launchers}:/opt/imgfab/imgfab-triton-launchers.json:ro"]
    (state / "flashinfer-workspace").mkdir(parents=True, exist_ok=True)
    argv += [a for m in _mounts() for a in ("-v", m)]
    argv += ["--entrypoint", "/bin/bash", base, "-c", run]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1500)
    seconds = round(time.monotonic() - started, 1)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    built = sorted(str(p.relative_to(context / "kernels")) for p in (context / "kernels").rglob("*.so"))
    assert built, "the kernels stage staged no library"
    record = {"seconds_no_gpu": seconds, "cpus": os.cpu_count(), "built": built,
              "stdout_tail": done.stdout[-1500:]}
    shutil.copytree(context / "kernels", kept / "kernels", symlinks=True)
    (kept / "record.json").write_text(json.dumps(record))
    return record


def _env() -> dict[str, str]:
    for key in ("DOCKER_HOST", "IMGFAB_STANDIN_BASE", "IMGFAB_STANDIN_MOUNTS"):
        if not os.environ.get(key):
            pytest.fail(f"{key} is not set: run tests/gpu/standin.sh (docker-up, base, payload) "
                        "and eval its env on the GPU machine")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p))


def build_standin(context: Path, image: str = IMAGE, launchers: dict | None = None) -> dict:
    """Render the recipe into ``context``, build its stand-in runtime as ``image`` (the kernels
    stage run on this host with no GPU), and return the record. ``launchers`` replaces the
    rendered imgfab-triton-launchers.json (bench/startup.py: the signatures a run recorded)."""
    env = _env()
    context.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "imgfab.cli", "render", str(RECIPE), "--output",
                    str(context)], env=env, check=True, capture_output=True, text=True)
    if launchers is not None:
        (context / "imgfab-triton-launchers.json").write_text(json.dumps(launchers, indent=1, sort_keys=True) + "\n")
    rendered = (context / "Dockerfile").read_text()
    text, removed = standin_dockerfile(rendered, os.environ["IMGFAB_STANDIN_BASE"])
    (context / "Dockerfile.standin").write_text(text)
    # the assembled venv as the build context's venv/ (hard links: no copy of 2 GB)
    subprocess.run(["cp", "-al", "/opt/venv", str(context / "venv")], check=True)
    kernels = {}
    if "AS kernels" in rendered:
        (context / "venv" / DROP_TOOLKIT).write_text(DROP_TOOLKIT_SOURCE)
        kernels = standin_kernels(rendered, context, os.environ["IMGFAB_STANDIN_BASE"], env)
    built = subprocess.run(["docker", "build", "--network", "host", "-f", "Dockerfile.standin",
                            "-t", image, "."], cwd=context, capture_output=True,
                           # the classic builder: the stand-in's stage needs no BuildKit, and
                           # the GPU host's Debian dockerd comes without buildx
                           env=dict(env, DOCKER_BUILDKIT="0"),
                           text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return {"dockerfile_removed": removed, "dockerfile": text, "kernels": kernels,
            "mounts": _mounts(), "build_tail": built.stdout[-1500:]}


def nocc_variant(image: str) -> str:
    """``image`` less every C/C++ compiler (gcc, cc, g++, c++ and gcc's cc1/cc1plus), as
    ``<image>-nocc``: the runtime a vLLM recipe renders (no compiler) on the stand-in base, which
    is the GPU host's own root filesystem and so has them."""
    variant = f"{image}-nocc"
    dockerfile = (f"FROM {image}\nUSER 0\n"
                  "RUN rm -f /usr/bin/gcc* /usr/bin/cc /usr/bin/c++ /usr/bin/g++* /usr/bin/x86_64-linux-gnu-g* "
                  "/usr/lib/gcc/x86_64-linux-gnu/*/cc1* && ! command -v gcc && ! command -v cc\n"
                  "USER 10001:10001\n")
    built = subprocess.run(["docker", "build", "-t", variant, "-"], input=dockerfile,
                           env=dict(_env(), DOCKER_BUILDKIT="0"), capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return variant


@pytest.fixture(scope="module")
def standin_image(tmp_path_factory) -> str:
    _record("standin", build_standin(tmp_path_factory.mktemp("ctx") / "qwen2-7b-h200"))
    return IMAGE


def _mounts() -> list[str]:
    """The host trees the container binds read-only (the torch venv, the driver's files)."""
    return [line.strip() for line in Path(os.environ["IMGFAB_STANDIN_MOUNTS"]).read_text().splitlines()
            if line.strip() and not line.startswith("/opt/venv:")]


def _record(name: str, data: dict) -> None:
    out = os.environ.get("IMGFAB_GPU_PROOF_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")


def test_standin_dockerfile_changes_only_base_apt_and_payload():
    rendered = (REPO / "tests" / "golden" / "qwen2-7b-h200" / "Dockerfile").read_text()
    text, removed = standin_dockerfile(rendered, "standin")
    assert text.startswith("FROM standin AS files") and "\nFROM standin AS runtime\n" in text
    code = "\n".join(line for line in text.split("\n") if not line.lstrip().startswith("#"))
    assert "${RUNTIME_IMAGE}" not in code and "--link" not in code and "--mount" not in code
    assert "apt-get" not in text and "--from=builder" not in text and "--from=payload" not in text
    assert text.count("COPY venv/ /opt/venv/") == 1
    # the builder compiled the kernels (issue 33): the runtime takes them, drops the compiler
    # wheels and makes no CUDA_HOME view
    venv = text.index("COPY venv/ /opt/venv/")
    assert text.index("RUN python3 /opt/venv/imgfab-standin-drop-toolkit.py") > venv
    assert text.index("COPY kernels/ /") > venv
    assert "/opt/imgfab/cuda" not in text and "FLASHINFER_DISABLE_JIT=1" in text
    assert text.count("COPY --from=files /stage/") == 3
    assert "useradd" in text and "ENTRYPOINT" in text
    assert "touch --no-dereference --date=@0" in text
    assert sum("--from=payload /opt/imgfab/layers/" in line for line in removed) >= 5
    assert KERNELS_COPY in removed


@pytest.mark.parametrize("shape", ["runsh", "compose", "k8s"])
def test_rendered_vllm_runtime_serves_in_each_shape(standin_image, shape):
    """Real vLLM 0.26.0 on this GPU: the FlashInfer sampler's kernels compile at the first
    start with the payload's nvcc (CUDA_HOME view), and every shape can execute them."""
    env = _env()
    argv = [sys.executable, "-m", "imgfab.cli", "smoke", standin_image, "--synthetic-model",
            "--shape", shape, "--gpus", "none", "--network", "host", "--timeout", "540",
            "--env", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64", "--json"]
    argv += [a for d in GPU_DEVICES if os.path.exists(d) for a in ("--device", d)]
    argv += [a for m in _mounts() for a in ("--mount", m)]
    if os.environ.get("IMGFAB_PROOF_NO_MEMLOCK") == "1":  # an engine that cannot raise it
        argv.append("--no-memlock")
    if shape != "k8s":  # run.sh and compose share the host's cache volume, as on a host
        argv += ["--cache-volume", CACHE_VOLUME]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=590)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"smoke printed no report: {done.stdout[-2000:]} {done.stderr[-3000:]}")
    _record(f"shape-{shape}", report)
    (result,) = report["shapes"]
    print(f"\n{shape}: passed={result['passed']} healthy_after_s={result['healthy_after_s']} "
          f"ttft_ms={result['ttft_ms']} tokens_per_s={result['tokens_per_s']}")
    assert report["synthetic"] and "synthetic weights" in report["weights"]
    assert result["passed"], (result["failures"], result["log_tail"][-4000:])
    assert result["noexec"] == []
    assert result["model_ids"] == ["qwen2-7b"]
    assert result["ttft_ms"] and result["tokens_per_s"]
    if shutil.which("nvidia-smi"):
        assert result["peak_gpu_memory_bytes"] and max(result["peak_gpu_memory_bytes"]) > 0


def test_the_runtime_serves_with_no_c_compiler(standin_image):
    """Issue 33's question, measured: does the runtime need a C compiler once the builder
    compiled FlashInfer's kernels? The stand-in image less every C/C++ compiler (gcc, cc, g++,
    c++ and gcc's cc1/cc1plus), started as run.sh from an empty cache: Triton compiles its
    launcher stubs with cc at first use (triton/runtime/build.py), so a pass here means serving
    launched none that it had to compile. The record keeps the log either way."""
    env = _env()
    variant = nocc_variant(standin_image)
    argv = [sys.executable, "-m", "imgfab.cli", "smoke", variant, "--synthetic-model",
            "--shape", "runsh", "--gpus", "none", "--network", "host", "--timeout", "540",
            "--env", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64", "--json",
            "--cache-volume", f"{CACHE_VOLUME}-nocc"]
    argv += [a for d in GPU_DEVICES if os.path.exists(d) for a in ("--device", d)]
    argv += [a for m in _mounts() for a in ("--mount", m)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=590)
    report = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {"stdout": done.stdout[-2000:],
                                                                                 "stderr": done.stderr[-3000:]}
    _record("nocc", report)
    (result,) = report["shapes"]
    print(f"\nno C compiler: passed={result['passed']} healthy_after_s={result['healthy_after_s']}")
    assert result["passed"], (result["failures"], result["log_tail"][-4000:])
