"""The fit check: published model sizes against GPU memory × tp × pp, heads that tp splits,
max lengths within the model's positions, and fixes that really fit.

GPU memory comes from the frozen matrix (tests/fixtures/compat_frozen/gpus.yaml), as the driver
reports it (reported_mib): L4 23034 MiB = 24152899584 bytes, H100-SXM 81559 MiB = 85520809984
bytes; the marketed 24 and 80 GiB are not what vLLM budgets."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from imgfab.errors import CompatibilityError, RecipeError
from imgfab.in_image import fit
from imgfab.recipe import parse_recipe
from imgfab.stack.resolve import resolve

from conftest import FROZEN_COMPAT, FROZEN_RECIPES, REPO

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from model_facts import MODELS, dense_parameters, write_model_dir  # noqa: E402


def _facts(name: str) -> dict:
    c = MODELS[name]["config"]
    return {"parameters": MODELS[name]["parameters"], "layers": c["num_hidden_layers"],
            "attention_heads": c["num_attention_heads"], "kv_heads": c["num_key_value_heads"],
            "head_size": c.get("head_dim", c["hidden_size"] // c["num_attention_heads"]),
            "max_positions": c["max_position_embeddings"]}


def _recipe(model: str | None, *, gpu: str = "H100-SXM", count: int = 1, pp: int = 1,
            max_len: int = 8192, **serve) -> dict:
    data = yaml.safe_load((FROZEN_RECIPES / "qwen2-7b-h100.yaml").read_text())
    data["model"].pop("facts")
    if model is not None:
        data["model"]["facts"] = _facts(model)
    data["target"] |= {"gpu": gpu, "count": count, "pipeline_parallel": pp}
    data["engine"] = {"dtype": "bfloat16"}
    data["serve"] |= {"max_model_len": max_len, **serve}
    return data


def _apply(data: dict, fix: str) -> dict:
    """The recipe with the first change a fix names (``a.b.c: value``, ``and``-joined parts)."""
    first = fix.split(" or ")[0]
    for part in first.split(" and "):
        match = re.match(r"([a-z_.]+): (\S+)", part.strip())
        assert match, fix
        node = data
        *parents, leaf = match.group(1).split(".")
        for key in parents:
            node = node.setdefault(key, {})
        value = match.group(2)
        node[leaf] = int(value) if value.isdigit() else value
    return data


@pytest.mark.parametrize("name", sorted(MODELS))
def test_published_parameter_counts_match_the_configs_shapes(name):
    """The transcribed config.json dimensions reproduce the published parameter count."""
    assert dense_parameters(name) == MODELS[name]["parameters"]
    assert MODELS[name]["source"].startswith("https://huggingface.co/")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_weights_dir_gives_the_same_facts(tmp_path, name):
    facts = fit.read_model_dir(str(write_model_dir(tmp_path / name, name)))
    assert facts.as_dict() == _facts(name)


def test_405b_on_four_l4_is_refused_with_the_numbers_and_a_real_fix(frozen_matrix):
    data = _recipe("Llama-3.1-405B", gpu="L4", count=4)
    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(data), frozen_matrix)
    line = caught.value.one_line()
    # 4 × 24152899584 bytes × 0.9 = 86950438502 bytes = 87.0 GB (the marketed 24 GiB gave 92.8 GB)
    assert ("needs 811.7 GB of weights (405.9B parameters in bf16), 4× L4 (24 GiB, 23034 MiB "
            "reported) hold 87.0 GB at 0.9") in line
    assert caught.value.field == "target.count"
    fixed = _apply(data, caught.value.fix)
    stack = resolve(parse_recipe(fixed), frozen_matrix).stack
    assert stack.fit.startswith("fits: ")


def test_405b_on_one_h100_node_needs_a_second_stage(frozen_matrix):
    data = _recipe("Llama-3.1-405B", count=8)
    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(data), frozen_matrix)
    assert caught.value.fix.startswith("target.pipeline_parallel: 2 (16× H100-SXM")
    assert " or target.gpu: " in caught.value.fix
    fixed = resolve(parse_recipe(_apply(data, caught.value.fix)), frozen_matrix).stack
    assert (fixed.tensor_parallel, fixed.pipeline_parallel) == (8, 2) and fixed.fit.startswith("fits")
    other = caught.value.fix.split(" or ")[1]
    assert resolve(parse_recipe(_apply(_recipe("Llama-3.1-405B", count=8), other)), frozen_matrix).stack.fit \
        .startswith("fits")


def test_70b_on_one_h100_asks_for_two(frozen_matrix):
    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(_recipe("Llama-3.1-70B")), frozen_matrix)
    assert "needs 141.1 GB of weights" in caught.value.message
    assert caught.value.fix.startswith("target.count: 2 ")


@pytest.mark.parametrize("name, weights", [("Llama-3.1-8B", "16.1"), ("Qwen2-7B", "15.2"), ("Mistral-7B", "14.5")])
def test_7b_and_8b_fit_one_h100_with_the_numbers(frozen_matrix, name, weights):
    """bf16 weights: 8030261248, 7615616512 and 7248023552 parameters × 2 bytes."""
    stack = resolve(parse_recipe(_recipe(name)), frozen_matrix).stack
    assert stack.fit.startswith(f"fits: {weights} GB of weights + ")
    # 81559 MiB × 1048576 = 85520809984 bytes; × 0.9 = 76968728986 bytes = 77.0 GB
    assert "≤ 77.0 GB (1× H100-SXM (80 GiB, 81559 MiB reported) at 0.9)" in stack.fit


# Llama-3.1-8B in bf16 on one L4 at max length 49152 (issue 36, memory as reported):
#   weights  8030261248 parameters × 2 bytes                    = 16060522496 bytes (16.1 GB)
#   KV cache 32 layers × 8 KV heads × 128 × 2 (K, V) × 2 bytes   = 131072 bytes a token
#            × 49152 tokens                                      =  6442450944 bytes (6.4 GB)
#   need                                                         = 22502973440 bytes (22.5 GB)
#   marketed 24 GiB = 25769803776 bytes × 0.9                    = 23192823398 bytes: it fitted
#   reported 23034 MiB = 24152899584 bytes × 0.9                 = 21737609626 bytes (21.7 GB): no
#   the KV cache left: (21737609626 - 16060522496) // 131072     = 43312 tokens; in steps of 256: 43264
LONG_ON_L4 = 49152


def test_a_recipe_that_fits_the_marketed_memory_but_not_the_reported_is_refused(frozen_matrix):
    data = _recipe("Llama-3.1-8B", gpu="L4", max_len=LONG_ON_L4)
    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(data), frozen_matrix)
    assert caught.value.message.endswith(
        "needs 16.1 GB of weights + 6.4 GB of KV cache (49152 tokens), 22.5 GB in all; "
        "1× L4 (24 GiB, 23034 MiB reported) hold 21.7 GB at 0.9")
    assert caught.value.field == "serve.max_model_len"
    assert caught.value.fix.startswith("serve.max_model_len: 43264 (the KV cache holds 43312 tokens)")
    assert resolve(parse_recipe(_apply(data, caught.value.fix)), frozen_matrix).stack.fit.startswith("fits")


def test_the_refusal_is_exit_2_naming_the_field_and_the_fix(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(_recipe("Llama-3.1-8B", gpu="L4", max_len=LONG_ON_L4)))
    done = subprocess.run([sys.executable, "-m", "imgfab.cli", "resolve", str(recipe), "--compat-dir",
                           str(FROZEN_COMPAT)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("imgfab: serve.max_model_len: ")
    assert "hold 21.7 GB at 0.9" in done.stderr and "serve.max_model_len: 43264" in done.stderr


def test_a_gpu_without_a_reported_total_counts_93_percent_of_its_nominal_memory(frozen_matrix):
    """L40 has no reported_mib in the frozen matrix: 48 × 1024 × 0.93 = 45711.36 → 45711 MiB
    = 47931654144 bytes; × 0.9 = 43138488730 bytes = 43.1 GB."""
    stack = resolve(parse_recipe(_recipe("Llama-3.1-8B", gpu="L40")), frozen_matrix).stack
    assert "(1× L40 (48 GiB, 45711 MiB assumed, 93% of nominal) at 0.9)" in stack.fit
    assert "≤ 43.1 GB " in stack.fit


def test_kv_cache_that_does_not_fit_asks_for_a_shorter_length(frozen_matrix):
    data = _recipe("Llama-3.1-8B", gpu="L4", max_len=131072)
    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(data), frozen_matrix)
    assert "16.1 GB of weights + 17.2 GB of KV cache (131072 tokens)" in caught.value.message
    assert caught.value.field == "serve.max_model_len"
    stack = resolve(parse_recipe(_apply(data, caught.value.fix)), frozen_matrix).stack
    assert stack.fit.startswith("fits")


@pytest.mark.parametrize("count,fix", [(3, "target.count: 4"), (6, "target.count: 8"),
                                       (5, "target.count: 4")])
def test_heads_that_tp_does_not_divide_are_refused(frozen_matrix, count, fix):
    """Llama-3.1-70B: 64 heads, 8 KV heads (vllm#414, #5003: vLLM dies at start otherwise)."""
    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(_recipe("Llama-3.1-70B", count=count)), frozen_matrix)
    assert caught.value.field == "target.count"
    assert "64 attention heads are not divisible by tensor parallel size" in caught.value.message
    assert caught.value.fix == fix


def test_kv_heads_that_tp_cannot_split_are_refused():
    facts = fit.ModelFacts(attention_heads=28, kv_heads=4)
    assert fit.heads_problem(facts, 4) == "" and fit.heads_problem(facts, 2) == ""
    assert "4 KV heads" in fit.heads_problem(fit.ModelFacts(attention_heads=48, kv_heads=4), 6)
    assert fit.tensor_parallel_sizes(facts, 8) == [1, 2, 4]


def test_max_model_len_above_the_positions_is_refused(frozen_matrix):
    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(_recipe("Qwen2-7B", max_len=65536)), frozen_matrix)
    assert caught.value.one_line() == (
        "serve.max_model_len: Qwen/Qwen2-7B-Instruct: max length 65536 is above the model's "
        "32768 positions (max_position_embeddings); fix: serve.max_model_len: 32768")


def test_without_facts_the_fit_is_said_not_checked(frozen_matrix):
    stack = resolve(parse_recipe(_recipe(None)), frozen_matrix).stack
    assert stack.fit.startswith("not checked: memory fit unknown, model.facts lacks parameters, "
                                "layers, kv_heads, head_size")


def test_weights_dir_completes_and_must_agree_with_the_recipe(frozen_matrix, tmp_path):
    directory = write_model_dir(tmp_path / "m", "Llama-3.1-70B")
    read = fit.read_model_dir(str(directory))
    with pytest.raises(CompatibilityError):  # 70B on one H100, learnt from the weights alone
        resolve(parse_recipe(_recipe(None)), frozen_matrix, weights=read, weights_from="m/config.json")
    with pytest.raises(RecipeError) as caught:  # the recipe says Qwen2-7B
        resolve(parse_recipe(_recipe("Qwen2-7B")), frozen_matrix, weights=read, weights_from="m/config.json")
    assert caught.value.field == "model.facts.parameters" or caught.value.field.startswith("model.facts.")


def test_resolve_weights_flag(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(_recipe(None)))
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}

    def imgfab_resolve(weights):
        return subprocess.run([sys.executable, "-m", "imgfab.cli", "resolve", str(recipe), "--compat-dir",
                               str(FROZEN_COMPAT), "--weights", str(weights)], capture_output=True, text=True, env=env)

    done = imgfab_resolve(write_model_dir(tmp_path / "qwen", "Qwen2-7B"))
    assert done.returncode == 0, done.stderr
    assert re.search(r"^fit +fits: 15\.2 GB of weights", done.stdout, re.M)
    refused = imgfab_resolve(write_model_dir(tmp_path / "big", "Llama-3.1-405B"))
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    assert "needs 811.7 GB of weights" in refused.stderr
    (tmp_path / "empty").mkdir()
    bad = imgfab_resolve(tmp_path / "empty")
    assert bad.returncode == 2 and bad.stderr.startswith("imgfab: --weights: ")


def test_per_gpu_need_in_mib():
    from imgfab.stack.fit import per_gpu_need_mib

    recipe = parse_recipe(_recipe("Llama-3.1-70B", count=4))
    need = per_gpu_need_mib(recipe, "bf16")
    # 141.1 GB of weights + 2.7 GB of KV cache (8192 tokens) over 4 GPUs at 0.9
    assert need is not None and 38000 < need < 38200
    assert per_gpu_need_mib(parse_recipe(_recipe(None)), "bf16") is None


def test_weights_dir_reader_refuses_what_is_not_a_regular_file(tmp_path):
    """A FIFO named config.json is refused by name, without blocking on it."""
    import os

    directory = tmp_path / "fifo"
    directory.mkdir()
    os.mkfifo(directory / "config.json")
    with pytest.raises(fit.FactsError, match="config.json is not a regular file"):
        fit.read_model_dir(str(directory))
    (directory / "config.json").unlink()
    (directory / "config.json").write_text('{"num_hidden_layers": 2}')
    os.mkfifo(directory / "model.safetensors")
    with pytest.raises(fit.FactsError, match="model.safetensors is not a regular file"):
        fit.read_model_dir(str(directory))
