"""Refuse, don't crash (issue 34, class 7): what a weights directory or a lock file holds is
read within bounds (nesting, the digits of a number, a header's size, the parameters a shape
claims, a lock's size and encoding), and a file beyond one is refused in one line naming the
file and the bound, exit 2; the in-image probe says so in its fit line, never in a traceback.

Each hostile file is written here by hand; the expected lines are written out in full.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import FROZEN_COMPAT, FROZEN_RECIPES, REPO

for folder in ("fixtures", "ops", "in_image"):  # model_facts; test_smoke_fit's and test_probe's labels
    sys.path.insert(0, str(REPO / "tests" / folder))
from model_facts import MODELS, write_model_dir  # noqa: E402
from test_probe import VLLM_LABELS  # noqa: E402
from test_smoke_fit import _labels  # noqa: E402

QWEN_CONFIG = MODELS["Qwen2-7B"]["config"]
FIX = "fix: give the model's directory as downloaded (config.json, *.safetensors)"


def _imgfab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def _recipe_without_facts(tmp_path: Path) -> Path:
    """The frozen qwen2-7b-h100 recipe without model.facts: every fact comes from --weights."""
    data = yaml.safe_load((FROZEN_RECIPES / "qwen2-7b-h100.yaml").read_text())
    data["model"].pop("facts")
    path = tmp_path / "qwen2-7b-h100.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _header(path: Path, raw: bytes, length: int | None = None) -> None:
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw)


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def _weights(tmp_path: Path, *, config: str | None = None, header: bytes | None = None,
             length: int | None = None) -> Path:
    """A weights directory: Qwen2-7B's config.json unless ``config``, and a model.safetensors
    holding only ``header`` (with the 8-byte ``length`` it claims) when given."""
    directory = tmp_path / "weights"
    directory.mkdir()
    (directory / "config.json").write_text(config if config is not None else json.dumps(QWEN_CONFIG))
    if header is not None:
        _header(directory / "model.safetensors", header, length)
    return directory


def _tensor(shape: str) -> bytes:
    return b'{"w": {"dtype": "BF16", "shape": ' + shape.encode() + b', "data_offsets": [0, 0]}}'


# (case, weights directory arguments, what the one line says; {d}: the directory)
HOSTILE_WEIGHTS = [
    ("deep config.json", dict(config=_deep(100_000)), "{d}/config.json nests deeper than 64 levels"),
    ("config.json 65 levels", dict(config=json.dumps({**QWEN_CONFIG, "x": json.loads(_deep(64))})),
     "{d}/config.json nests deeper than 64 levels"),
    ("5,000-digit config.json", dict(config='{"num_hidden_layers": ' + "9" * 5000 + "}"),
     "{d}/config.json has a number of 5000 digits, above the bound of 40"),
    ("41-digit float in config.json", dict(config='{"rope_theta": 1.' + "0" * 40 + "}"),
     "{d}/config.json has a number of 41 digits, above the bound of 40"),
    ("hidden_size below the heads",
     dict(config=json.dumps({**QWEN_CONFIG, "hidden_size": 9}), header=_tensor("[1000]")),
     "config.json hidden_size 9 is smaller than its 28 attention heads, so a head has no size"),
    ("header length 2**63", dict(header=b"{}", length=2**63),
     "{d}/model.safetensors claims a 9223372036854775808-byte header, above the bound of 104857600 bytes"),
    ("shape whose product overflows", dict(header=_tensor(json.dumps([2**62] * 20))),
     "{d}/model.safetensors: tensor 'w' claims more than 1000000000000000 parameters, the bound"),
    ("one dimension past the bound", dict(header=_tensor(json.dumps([10**15 + 1]))),
     "{d}/model.safetensors: tensor 'w' claims more than 1000000000000000 parameters, the bound"),
    ("5,000-digit dimension", dict(header=_tensor("[" + "7" * 5000 + "]")),
     "{d}/model.safetensors's header has a number of 5000 digits, above the bound of 40"),
    ("deep header", dict(header=_tensor(_deep(50_000))),
     "{d}/model.safetensors's header nests deeper than 64 levels"),
]


@pytest.mark.parametrize("case, weights, said", HOSTILE_WEIGHTS, ids=[c[0] for c in HOSTILE_WEIGHTS])
def test_resolve_refuses_hostile_weights_in_one_line_exit_2(tmp_path, case, weights, said):
    directory = _weights(tmp_path, **weights)
    result = _imgfab("resolve", str(_recipe_without_facts(tmp_path)), "--weights", str(directory),
                     "--compat-dir", str(FROZEN_COMPAT))
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"imgfab: --weights: {said.format(d=directory)}; {FIX}\n"
    assert result.stdout == ""


def test_weights_within_every_bound_are_read(tmp_path):
    """64 levels, 40 digits and a model of 10**15 parameters are still a model."""
    from imgfab.in_image.fit import read_model_dir

    config = json.dumps({**QWEN_CONFIG, "x": json.loads(_deep(63)), "big": int("9" * 40)})
    config = config[:-1] + ', "f": 1.' + "0" * 39 + "}"  # 40 digits as written
    directory = _weights(tmp_path, config=config, header=_tensor(json.dumps([10**15])))
    facts = read_model_dir(str(directory))
    assert (facts.parameters, facts.layers, facts.kv_heads) == (10**15, 28, 4)


def test_the_sum_over_files_is_bounded_too(tmp_path):
    from imgfab.in_image.fit import FactsError, read_model_dir

    directory = _weights(tmp_path, header=_tensor(json.dumps([10**15])))
    _header(directory / "model-2.safetensors", _tensor("[1]"))
    with pytest.raises(FactsError) as caught:
        read_model_dir(str(directory))
    assert str(caught.value) == (f"the *.safetensors files of {directory} claim more than "
                                 "1000000000000000 parameters, the bound")


def test_smoke_refuses_a_deep_config_json_in_one_line_exit_2(tmp_path):
    """`imgfab smoke --weights DIR`, the real entry point; the engine answers from a file."""
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps(_labels("llama31-8b-l4", facts=None)))
    directory = _weights(tmp_path, config=_deep(100_000))
    program = """import json, sys
import imgfab.docker.engine as engine
labels = json.load(open(sys.argv[1]))
engine.has_image = lambda ref: True
engine.inspect_image = lambda ref: {"Config": {"User": "10001:10001", "Labels": labels}}
from imgfab.cli import main
sys.argv = ["imgfab", "smoke", "img:1", "--weights", sys.argv[2]]
main()
"""
    result = subprocess.run([sys.executable, "-c", program, str(labels), str(directory)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"imgfab: --weights: --weights {directory}: {directory}/config.json nests "
                             "deeper than 64 levels; fix: point --weights at the model's own files "
                             "(config.json, *.safetensors)\n")


def test_the_probe_says_a_deep_config_json_in_its_fit_line_not_a_traceback(tmp_path):
    weights = write_model_dir(tmp_path / "model", "Qwen2-7B")
    (weights / "config.json").write_text(_deep(100_000))
    image_json = tmp_path / "image.json"
    image_json.write_text(json.dumps({**VLLM_LABELS, "org.imgfab.model.mount": str(weights)}))
    result = subprocess.run([sys.executable, "-m", "imgfab.in_image.probe", "--image-json",
                             str(image_json), "--skip", "driver,mode,arch,precision,cuda,shm"],
                            capture_output=True, text=True, timeout=120)
    assert result.stderr == ""
    assert result.returncode == 3  # the host is wrong: it mounted something that is no model
    fit = [line for line in result.stdout.splitlines() if " fit: " in line]
    assert fit == [f"FAIL fit: {weights}/config.json nests deeper than 64 levels; fix: mount the "
                   f"model's own files at {weights}"]


def test_the_probe_refuses_a_deep_image_json_as_the_image_s_fault(tmp_path):
    image_json = tmp_path / "image.json"
    image_json.write_text(_deep(100_000))
    result = subprocess.run([sys.executable, "-m", "imgfab.in_image.probe", "--image-json",
                             str(image_json)], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr) == (4, "")
    assert result.stdout.splitlines()[0] == (
        f"FAIL image: {image_json} nests deeper than 64 levels; fix: run an image built by imgfab; "
        "rebuild it if /opt/imgfab was changed")


# --- locks -------------------------------------------------------------------------------

LOCK_FIX = ("fix: run `imgfab lock RECIPE` to rewrite it (a lock holds only name==version lines "
            "with their --hash lines)")


def _lock_workspace(tmp_path: Path, content: bytes) -> tuple[Path, Path]:
    recipe = tmp_path / "qwen2-7b-h100.yaml"
    recipe.write_bytes((FROZEN_RECIPES / "qwen2-7b-h100.yaml").read_bytes())
    lock = tmp_path / "qwen2-7b-h100.lock"
    lock.write_bytes(content)
    return recipe, lock


NOT_UTF8 = b"# fingerprint: \xff\xfe\n"


@pytest.mark.parametrize("content, said", [
    (NOT_UTF8, "{lock}: byte 16 is not UTF-8 (a lock is UTF-8 text)"),
    (b"#" * (4 * 1024 * 1024 + 1), "{lock} is larger than 4194304 bytes, the bound for a lock"),
], ids=["not UTF-8", "over 4 MiB"])
def test_lock_check_refuses_a_lock_beyond_its_bounds_in_one_line_exit_2(tmp_path, content, said):
    recipe, lock = _lock_workspace(tmp_path, content)
    result = _imgfab("lock", "--check", str(recipe), "--compat-dir", str(FROZEN_COMPAT))
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"imgfab: lock: {said.format(lock=lock)}; {LOCK_FIX}\n"


def test_build_refuses_a_lock_that_is_not_utf8_before_any_step(tmp_path):
    recipe, lock = _lock_workspace(tmp_path, NOT_UTF8)
    result = _imgfab("build", str(recipe), "--lock", str(lock), "--compat-dir", str(FROZEN_COMPAT))
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"imgfab: lock: {lock}: byte 16 is not UTF-8 (a lock is UTF-8 text); {LOCK_FIX}\n"


def test_list_shows_a_lock_that_is_not_utf8_as_that_recipe_s_error(tmp_path):
    recipe, lock = _lock_workspace(tmp_path, NOT_UTF8)
    result = _imgfab("list", str(tmp_path), "--compat-dir", str(FROZEN_COMPAT))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (f"{recipe}: lock: {lock}: byte 16 is not UTF-8 (a lock is UTF-8 text); "
                             f"{LOCK_FIX}\n")
