"""Flag tables of TensorRT-LLM (compat/trtllm_flags/*.yaml) and the checks built on them.

The committed tables are tested as they are, without any wheel. The extractor is tested on a
small wheel built here; the tests that need the real TensorRT-LLM wheel skip, saying so, unless
IMGFAB_TRTLLM_WHEEL names it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from imgfab.errors import MatrixError
from imgfab.render.trtllm_flags import (KNOWN_MISTAKES, check_command, flags_dir, load_flags,
                                        verify_known_mistakes)

ROOT = Path(__file__).resolve().parents[2]
PINNED = "1.2.1"


def _extractor():
    spec = importlib.util.spec_from_file_location("extract_trtllm_flags",
                                                  ROOT / "scripts" / "extract_trtllm_flags.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pinned():
    return load_flags(PINNED)


# ----------------------------------------------------------------------------- committed tables
def test_tables_ship_inside_the_package():
    assert (flags_dir() / f"{PINNED}.yaml").is_file()


@pytest.mark.parametrize("path", sorted((ROOT / "compat" / "trtllm_flags").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_table_is_sourced_and_says_when_unconfirmed(path):
    doc = yaml.safe_load(path.read_text())
    assert path.stem == str(doc["tensorrt_llm_version"])
    for name, body in doc["commands"].items():
        assert body["source"], name
        assert isinstance(body["confirmed"], bool), name
        if not body["confirmed"]:
            assert doc.get("note"), f"{name} is unconfirmed but the file has no note saying why"
    if doc.get("stand_in"):
        assert not any(b["confirmed"] for b in doc["commands"].values())


def test_pinned_table_knows_the_core_flags(pinned):
    build, _ = pinned.command("trtllm-build")
    for flag in ("--checkpoint_dir", "--output_dir", "--max_seq_len", "--max_batch_size",
                 "--max_num_tokens", "--gemm_plugin", "--gpt_attention_plugin", "--strip_plan"):
        assert flag in build.flags, flag
    serve, _ = pinned.command("trtllm-serve")
    for flag in ("--backend", "--tokenizer", "--host", "--port", "--max_batch_size",
                 "--max_num_tokens", "--max_seq_len", "--tp_size",
                 "--kv_cache_free_gpu_memory_fraction", "--extra_llm_api_options"):
        assert flag in serve.flags, flag
    assert {"pytorch", "tensorrt"} <= set(serve.flags["--backend"].choices)
    quantize, _ = pinned.command("quantize.py")
    assert {"fp8", "int4_awq", "nvfp4"} <= set(quantize.flags["--qformat"].choices)


def test_pinned_table_records_the_wheel_pins(pinned):
    assert pinned.requires_dist["tensorrt"].startswith("tensorrt~=10.")
    assert "nvidia-modelopt" in pinned.requires_dist
    assert pinned.console_scripts["trtllm-build"] == "tensorrt_llm.commands.build:main"


def test_rejects_quantization_type_with_the_pointer(pinned):
    problems = check_command(["--checkpoint_dir", "/ckpt", "--quantization_type", "fp8"],
                             pinned, "trtllm-build")
    assert problems == [
        (f"trtllm-build --quantization_type: no such flag in TensorRT-LLM {PINNED}; quantization "
         "is chosen at the checkpoint step (quantize.py --qformat fp8)")]


@pytest.mark.parametrize("flag, hint", [
    ("--max_output_len", "--max_seq_len"),
    ("--tp_size", "quantize.py --tp_size"),
])
def test_rejects_other_tutorial_mistakes(pinned, flag, hint):
    [problem] = check_command([flag, "2"], pinned, "trtllm-build")
    assert problem.startswith(f"trtllm-build {flag}: no such flag in TensorRT-LLM {PINNED}; ")
    assert hint in problem


def test_rejects_a_bad_choices_value(pinned):
    assert check_command(["--gemm_plugin", "fp9"], pinned, "trtllm-build") == [
        (f"trtllm-build --gemm_plugin fp9: not a valid value in TensorRT-LLM {PINNED}; expected one "
         "of auto, float16, float32, bfloat16, int32, fp8, nvfp4, disable")]
    assert check_command(["--qformat=int3"], pinned, "quantize.py")[0].startswith(
        f"quantize.py --qformat int3: not a valid value in TensorRT-LLM {PINNED}")
    assert check_command(["m", "--backend", "onnx"], pinned, "trtllm-serve")[0].startswith(
        "trtllm-serve --backend onnx: not a valid value")


def test_accepts_a_rendered_engine_pipeline(pinned):
    quantize = ["--model_dir", "/hf", "--qformat", "fp8", "--kv_cache_dtype", "fp8",
                "--tp_size", "2", "--output_dir", "/ckpt", "--calib_size", "512"]
    build = ["trtllm-build", "--checkpoint_dir", "/ckpt", "--output_dir", "/engine",
             "--max_batch_size", "64", "--max_seq_len=8192", "--max_num_tokens", "8192",
             "--gemm_plugin", "auto", "--use_paged_context_fmha", "enable", "--strip_plan",
             "--kv_cache_type", "PAGED", "--workers", "2"]
    serve = ["/engine", "--backend", "trt", "--tokenizer", "/hf", "--host", "0.0.0.0",
             "--port", "8000", "--max_batch_size", "64", "--tp_size", "2",
             "--kv_cache_free_gpu_memory_fraction", "0.9"]
    assert check_command(quantize, pinned, "quantize.py") == []
    assert check_command(build, pinned, "trtllm-build") == []
    assert check_command(serve, pinned, "trtllm-serve") == []


def test_reports_store_true_with_a_value_and_a_missing_value(pinned):
    assert check_command(["--strip_plan=yes", "--max_seq_len"], pinned, "trtllm-build") == [
        f"trtllm-build --strip_plan: takes no value in TensorRT-LLM {PINNED}; drop '=yes'",
        f"trtllm-build --max_seq_len: expects a value in TensorRT-LLM {PINNED}"]


def test_suggests_the_nearest_flag(pinned):
    [problem] = check_command(["--max_seq_length", "4096"], pinned, "trtllm-build")
    assert problem.endswith("did you mean --max_seq_len?")


def test_serve_subcommands(pinned):
    assert check_command(["disaggregated", "-c", "disagg.yaml"], pinned, "trtllm-serve") == []
    [problem] = check_command(["disaggregated", "--tp_size", "2"], pinned, "trtllm-serve")
    assert problem.startswith("trtllm-serve disaggregated --tp_size: no such flag")


def test_every_known_mistake_is_true_of_every_table():
    for path in sorted(flags_dir().glob("*.yaml")):
        flagset = load_flags(path.stem)
        assert verify_known_mistakes(flagset) == [], path.name


def test_known_mistakes_cover_the_brief():
    named = {(m.command, m.flag) for m in KNOWN_MISTAKES}
    assert {("trtllm-build", "--quantization_type"), ("trtllm-build", "--max_output_len"),
            ("trtllm-build", "--tp_size")} <= named


def test_unknown_version_and_command_are_matrix_errors(pinned):
    with pytest.raises(MatrixError, match="no flag table for TensorRT-LLM 0.0.1"):
        load_flags("0.0.1")
    with pytest.raises(MatrixError, match="no command 'trtllm-nope'"):
        check_command([], pinned, "trtllm-nope")


# ----------------------------------------------------------------------------- the extractor
_MINI_BUILD = '''\
import argparse
from tensorrt_llm.helpers import add_common
from tensorrt_llm.limits import Limits

LEVELS = {"info": 1, "debug": 2}


def parse_arguments():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint_dir", type=str, default=None, help="Where the checkpoint is.\\nMore.")
    parser.add_argument("--max_seq_len", "--max_decoder_seq_len", dest="max_seq_len", type=int,
                        default=Limits.max_seq_len, help="Maximum " "length.")
    parser.add_argument("--log_level", default="info", choices=LEVELS.keys())
    group = parser.add_argument_group("g")
    group.add_argument("--strip_plan", action="store_true", help="Strip.")
    add_common(parser)
    return parser


def main():
    parse_arguments().parse_args()
'''
_MINI_HELPERS = '''\
def add_common(parser):
    parser.add_argument("--workers", type=int, default=1, required=False)
'''
_MINI_LIMITS = '''\
class Limits:
    max_seq_len: int = 4096
'''
_MINI_SERVE = '''\
import click


class Group(click.Group):
    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands:
            return "serve", self.commands["serve"], args
        return super().resolve_command(ctx, args)


@click.command("serve")
@click.argument("model", type=str)
@click.option("--backend", type=click.Choice(["pytorch", "tensorrt"]), default="pytorch")
@click.option("--tp_size", "--tensor_parallel_size", type=int, default=1, help="TP.")
@click.option("--trust_remote_code", is_flag=True, default=False)
def serve(model, backend, tp_size, trust_remote_code):
    pass


main = Group(commands={"serve": serve})
'''


def _mini_wheel(directory: Path) -> Path:
    wheel = directory / "tensorrt_llm-9.9.9-cp312-cp312-linux_x86_64.whl"
    files = {
        "tensorrt_llm/__init__.py": "",
        "tensorrt_llm/commands/__init__.py": "",
        "tensorrt_llm/commands/build.py": _MINI_BUILD,
        "tensorrt_llm/commands/serve.py": _MINI_SERVE,
        "tensorrt_llm/helpers.py": _MINI_HELPERS,
        "tensorrt_llm/limits.py": _MINI_LIMITS,
        "tensorrt_llm-9.9.9.dist-info/METADATA":
            "Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 9.9.9\n"
            "Requires-Dist: tensorrt~=10.14.1\nRequires-Dist: torch<=2.10.0a0,>=2.9.1\n"
            'Requires-Dist: pytest; extra == "devel"\n',
        "tensorrt_llm-9.9.9.dist-info/entry_points.txt":
            "[console_scripts]\ntrtllm-build = tensorrt_llm.commands.build:main\n"
            "trtllm-serve = tensorrt_llm.commands.serve:main\n",
    }
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def test_extractor_reads_a_wheel_without_importing_it(tmp_path):
    extractor = _extractor()
    out = tmp_path / "out"
    assert extractor.main([str(_mini_wheel(tmp_path)), "--out-dir", str(out)]) == 0
    doc = yaml.safe_load((out / "9.9.9.yaml").read_text())
    assert doc["artifact"]["name"] == "tensorrt_llm-9.9.9-cp312-cp312-linux_x86_64.whl"
    assert len(doc["artifact"]["sha256"]) == 64
    assert doc["requires_dist"] == {"tensorrt": "tensorrt~=10.14.1", "torch": "torch<=2.10.0a0,>=2.9.1"}
    build = doc["commands"]["trtllm-build"]
    assert build["source"] == ("pypi:tensorrt_llm-9.9.9-cp312-cp312-linux_x86_64.whl:"
                               "tensorrt_llm/commands/build.py")
    by_name = {f["names"][0]: f for f in build["flags"]}
    assert list(by_name) == ["--checkpoint_dir", "--log_level", "--max_seq_len", "--strip_plan",
                             "--workers"]
    assert by_name["--max_seq_len"]["names"] == ["--max_seq_len", "--max_decoder_seq_len"]
    assert by_name["--max_seq_len"]["default"] == 4096  # resolved through tensorrt_llm.limits
    assert by_name["--max_seq_len"]["help"] == "Maximum length."
    assert by_name["--checkpoint_dir"]["help"] == "Where the checkpoint is."
    assert by_name["--log_level"]["choices"] == ["info", "debug"]
    assert by_name["--strip_plan"]["action"] == "store_true"
    assert by_name["--workers"]["origin"] == "tensorrt_llm/helpers.py:2"
    serve = doc["commands"]["trtllm-serve"]
    assert serve["default_subcommand"] == "serve"
    flags = {f["names"][0]: f for f in serve["subcommands"]["serve"]["flags"]}
    assert flags["--backend"]["choices"] == ["pytorch", "tensorrt"]
    assert flags["--tp_size"]["names"] == ["--tp_size", "--tensor_parallel_size"]
    assert flags["--trust_remote_code"]["action"] == "store_true"
    assert doc["commands"]["trtllm-refit"] == {
        "present": False, "confirmed": True,
        "source": "pypi:tensorrt_llm-9.9.9-cp312-cp312-linux_x86_64.whl:"
                  "tensorrt_llm-9.9.9.dist-info/entry_points.txt"}


def test_extractor_output_is_byte_identical_across_runs(tmp_path):
    extractor = _extractor()
    wheel = _mini_wheel(tmp_path)
    first, second = tmp_path / "a", tmp_path / "b"
    assert extractor.main([str(wheel), "--out-dir", str(first)]) == 0
    assert extractor.main([str(wheel), "--out-dir", str(second)]) == 0
    assert (first / "9.9.9.yaml").read_bytes() == (second / "9.9.9.yaml").read_bytes()


def test_extracted_table_loads_and_checks(tmp_path):
    extractor = _extractor()
    assert extractor.main([str(_mini_wheel(tmp_path)), "--out-dir", str(tmp_path)]) == 0
    flags = load_flags("9.9.9", directory=tmp_path)
    assert flags.confirmed and flags.stand_in is None
    assert check_command(["--log_level", "loud"], flags, "trtllm-build") == [
        ("trtllm-build --log_level loud: not a valid value in TensorRT-LLM 9.9.9; expected one of "
         "info, debug")]
    assert check_command(["m", "--tensor_parallel_size", "2", "--trust_remote_code"], flags,
                         "trtllm-serve") == []


def test_extractor_refuses_an_unknown_shape(tmp_path, capsys):
    extractor = _extractor()
    wheel = _mini_wheel(tmp_path)
    broken = tmp_path / "broken" / wheel.name
    broken.parent.mkdir()
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(broken, "w") as dst:
        for item in src.namelist():
            text = src.read(item).decode()
            if item.endswith("build.py"):
                text = text.replace('"--checkpoint_dir"', "NAME")
            dst.writestr(item, text)
    assert extractor.main([str(broken), "--stdout"]) == 2
    assert "option names are not string literals" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the real wheel
_REAL_WHEEL = os.environ.get("IMGFAB_TRTLLM_WHEEL", "")


@pytest.mark.skipif(not (_REAL_WHEEL and Path(_REAL_WHEEL).is_file()),
                    reason="the TensorRT-LLM wheel is not here: set IMGFAB_TRTLLM_WHEEL to "
                           "tensorrt_llm-<v>-cp312-cp312-linux_x86_64.whl (from pypi.nvidia.com; "
                           "pypi.org only has a wheel-stub sdist)")
def test_real_wheel_extracts_identically_twice(tmp_path):
    extractor = _extractor()
    first, second = tmp_path / "a", tmp_path / "b"
    assert extractor.main([_REAL_WHEEL, "--out-dir", str(first)]) == 0
    assert extractor.main([_REAL_WHEEL, "--out-dir", str(second)]) == 0
    [made] = list(first.glob("*.yaml"))
    assert made.read_bytes() == (second / made.name).read_bytes()
    flags = load_flags(made.stem, directory=first)
    build, _ = flags.command("trtllm-build")
    assert {"--max_seq_len", "--gemm_plugin"} <= set(build.flags)
