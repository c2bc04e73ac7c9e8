"""`imgfab smoke --weights DIR` checks the model in DIR against the image before starting it
(issue 22): the labels of real renders, header-only weights directories made from published
config.json files (tests/fixtures/model_facts.py), the resolver's rule."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import FROZEN_COMPAT, FROZEN_RECIPES, REPO
from imgfab.errors import CompatibilityError, RecipeError
from imgfab.ops.smoke_fit import weights_fit

sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from model_facts import write_model_dir  # noqa: E402


def _labels(recipe: str, **changes) -> dict[str, str]:
    """The image labels of example ``recipe`` with ``changes`` (section -> fields; None drops
    model.facts) applied, as `imgfab render` writes them on the frozen matrix (GPU memory from
    tests/fixtures/compat_frozen/gpus.yaml: L4 24 GiB reporting 23034 MiB, H100-SXM 80 GiB
reporting 81559 MiB; the fit counts the reported MiB: 23034 × 1048576 × 0.92 = 22.2 GB)."""
    from imgfab.matrix.compat import load_matrix
    from imgfab.recipe import parse_recipe
    from imgfab.render.context import render_context
    from imgfab.stack.resolve import resolve

    data = copy.deepcopy(yaml.safe_load((FROZEN_RECIPES / f"{recipe}.yaml").read_text()))
    for section, fields in changes.items():
        if fields is None:
            data["model"].pop("facts")
        else:
            data[section] |= fields
    matrix = load_matrix(FROZEN_COMPAT)
    parsed = parse_recipe(data)
    files = render_context(parsed, resolve(parsed, matrix).stack, matrix)
    return json.loads(files["image.json"])


def _weights(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    write_model_dir(directory, name)
    return directory


def test_the_image_s_own_model_fits(tmp_path):
    line = weights_fit(_labels("llama31-8b-l4"), _weights(tmp_path, "Llama-3.1-8B"))
    assert line.startswith("fits: 16.1 GB of weights + 2.1 GB of KV cache (16384 tokens)"), line
    assert "1× L4 (24 GiB, 23034 MiB reported) at 0.92" in line


def test_a_model_that_cannot_fit_is_refused_with_the_numbers(tmp_path):
    """The recipe declared no facts (the resolver could not check); the weights say 405B."""
    labels = _labels("llama31-8b-l4", facts=None)
    with pytest.raises(CompatibilityError) as caught:
        weights_fit(labels, _weights(tmp_path, "Llama-3.1-405B"))
    line = caught.value.one_line()
    assert line.startswith("--weights: meta-llama/Llama-3.1-8B-Instruct does not fit: needs "
                           "811.7 GB of weights (405.9B parameters in bf16), 1× L4 (24 GiB, 23034 MiB "
                           "reported) hold 22.2 GB at 0.92"), line
    assert "imgfab resolve RECIPE --weights DIR" in line and "\n" not in line
    assert caught.value.exit_code == 2


def test_weights_of_another_model_than_the_recipe_declared_are_refused(tmp_path):
    with pytest.raises(RecipeError) as caught:
        weights_fit(_labels("qwen2-7b-h100"), _weights(tmp_path, "Llama-3.1-8B"))
    assert caught.value.field == "--weights"
    assert "the image was built for Qwen/Qwen2-7B-Instruct" in caught.value.one_line()


def test_heads_tp_cannot_split_are_refused(tmp_path):
    labels = _labels("llama31-8b-l4", facts=None, target={"count": 3})
    with pytest.raises(CompatibilityError) as caught:
        weights_fit(labels, _weights(tmp_path, "Llama-3.1-8B"))
    assert "32 attention heads are not divisible by tensor parallel size 3" in caught.value.one_line()


def test_a_max_length_above_the_positions_is_refused(tmp_path):
    labels = _labels("llama31-8b-l4", facts=None,
                     engine={"max_seq_len": 65536}, serve={"max_model_len": 65536})
    with pytest.raises(CompatibilityError) as caught:
        weights_fit(labels, _weights(tmp_path, "Mistral-7B"))
    assert "max length 65536 is above the model's 32768 positions" in caught.value.one_line()


def test_what_was_not_checked_is_said(tmp_path):
    labels = _labels("llama31-8b-l4", facts=None)
    bare = tmp_path / "config-only"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"num_hidden_layers": 32}))
    assert weights_fit(labels, bare) == ("fit not checked: " + str(bare) + " and the recipe's "
                                         "model.facts lack parameters, kv_heads, head_size")
    old = {k: v for k, v in labels.items() if not k.startswith("org.imgfab.fit.")}
    assert weights_fit(old, bare).startswith("fit not checked: the image declares no serving shape")
    with pytest.raises(RecipeError) as caught:
        weights_fit(labels, tmp_path)  # no config.json
    assert caught.value.field == "--weights" and "config.json" in caught.value.one_line()


class LabelsOnly:
    """An engine that answers inspect_image and fails the test if a container is started."""

    def __init__(self, labels: dict[str, str]):
        self.labels = labels

    def has_image(self, image: str) -> bool:
        return True

    def inspect_image(self, image: str) -> dict:
        return {"Config": {"Labels": self.labels, "User": "10001:10001"}}

    def run_container(self, image: str, **kwargs):
        raise AssertionError("a container was started for a model that cannot fit")


def test_smoke_refuses_before_any_container_starts(tmp_path):
    from imgfab.ops.smoke_shapes import smoke_command

    engine = LabelsOnly(_labels("llama31-8b-l4", facts=None))
    with pytest.raises(CompatibilityError):
        smoke_command("img:1", weights=_weights(tmp_path, "Llama-3.1-405B"), engine=engine)


def test_smoke_cli_refusal_is_exit_2_and_one_line(tmp_path):
    """The real CLI entry point; only the engine's inspect_image answers from a file."""
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps(_labels("llama31-8b-l4", facts=None)))
    weights = _weights(tmp_path, "Llama-3.1-405B")
    program = """import json, sys
import imgfab.docker.engine as engine
labels = json.load(open(sys.argv[1]))
engine.has_image = lambda ref: True
engine.inspect_image = lambda ref: {"Config": {"User": "10001:10001", "Labels": labels}}
from imgfab.cli import main
sys.argv = ["imgfab", "smoke", "img:1", "--weights", sys.argv[2]]
main()
"""
    result = subprocess.run([sys.executable, "-c", program, str(labels), str(weights)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("imgfab: --weights: meta-llama/Llama-3.1-8B-Instruct does not fit: "
                           "needs 811.7 GB"), line


def test_safetensors_headers_without_tensors_leave_the_parameters_unknown(tmp_path):
    # The integration tests' stand-in weights: config.json and a header with no tensors.
    from imgfab.in_image.fit import read_model_dir

    (tmp_path / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    assert read_model_dir(str(tmp_path)).parameters is None
