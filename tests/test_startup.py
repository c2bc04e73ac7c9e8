"""Start-up (issue 23): a command loads only what it uses. What each command imports is
checked, never how long it took (timings live in bench/render_startup.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

# Loaded by none of `--help`, `schema --of output`: the recipe schema, templates, the matrix.
HEAVY = ("pydantic", "jinja2", "yaml", "imgfab.recipe", "imgfab.matrix", "imgfab.payload",
         "imgfab.render.context", "requests", "rich", "docker")
# Loaded by no vLLM render: the TensorRT-LLM flag tables, Docker, the network, the progress UI.
NOT_FOR_VLLM_RENDER = ("imgfab.render.trtllm", "imgfab.render.trtllm_flags", "imgfab.docker",
                       "imgfab.supply", "imgfab.ops", "docker", "requests", "rich")


def _modules(*argv: str, cwd) -> set[str]:
    code = ("import contextlib, io, json, sys\n"
            "from imgfab.cli import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "    try:\n"
            f"        cli.main({list(argv)!r}, standalone_mode=False)\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


def _loaded(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_help_and_the_output_schema_load_nothing_heavy(tmp_path):
    for argv in (("--help",), ("schema", "--of", "output"), ("render", "--help")):
        assert _loaded(_modules(*argv, cwd=tmp_path), HEAVY) == [], argv


def test_a_vllm_render_loads_no_tensorrt_llm_docker_or_network(tmp_path):
    modules = _modules("render", str(REPO / "recipes/qwen2-7b-h100.yaml"), "-o", str(tmp_path / "o"),
                       cwd=tmp_path)
    assert (tmp_path / "o" / "Dockerfile").is_file()
    assert "imgfab.render.context" in modules  # it did render
    assert _loaded(modules, NOT_FOR_VLLM_RENDER) == []


def test_a_tensorrt_llm_render_loads_its_flag_tables(tmp_path):
    """The control: the deferred module is loaded where it is used."""
    modules = _modules("render", str(REPO / "recipes/mistral-7b-a100-trtllm.yaml"), "--unlocked",
                       "-o", str(tmp_path / "o"), cwd=tmp_path)
    assert (tmp_path / "o" / "Dockerfile").is_file()
    assert "imgfab.render.trtllm" in modules
