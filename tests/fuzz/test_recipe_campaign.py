"""The recipe fuzz campaign (issue 12): at least 10,000 hypothesis-generated recipes through the
whole input path (YAML file → load_recipe → resolve → render_context). Marked ``fuzz``; outside
CI's budget (scripts/test.sh deselects it). Run it with:

    IMGFAB_FUZZ_EXAMPLES=10000 python -m pytest -m fuzz tests/fuzz -p no:cacheprovider -s

Each recipe is an example recipe with one to three fields replaced by hostile values (line
breaks, terminal escapes, non-ASCII digits, huge integers, image-owned paths, shell
metacharacters, deep structures), or a YAML text with aliases or deep nesting. Every outcome
must be a valid render, a RecipeError or a CompatibilityError with one printable line; a
rendered recipe must keep its mount off image-owned paths and put no control character in any
file. Figures (count, time, outcomes) go to ``$IMGFAB_FUZZ_REPORT`` (default
``build/fuzz-report.json``) and to stdout.
"""

from __future__ import annotations

import collections
import copy
import json
import os
import posixpath
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgfab.errors import CompatibilityError, RecipeError
from imgfab.recipe import IMAGE_OWNED_PATHS, load_recipe

pytestmark = pytest.mark.fuzz

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("IMGFAB_FUZZ_EXAMPLES", "10000"))
REPORT = Path(os.environ.get("IMGFAB_FUZZ_REPORT", REPO / "build" / "fuzz-report.json"))
BASES = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "recipes").glob("*.yaml"))]
OUTCOMES: collections.Counter[str] = collections.Counter()
FIELDS: collections.Counter[str] = collections.Counter()
STARTED: list[float] = []

PATHS = [("name",), ("model", "id"), ("model", "revision"), ("model", "mount_path"),
         ("target", "gpu"), ("target", "count"), ("target", "pipeline_parallel"),
         ("target", "driver"), ("target", "driver_policy"), ("backend", "name"),
         ("backend", "version"), ("backend", "trtllm_path"), ("engine", "dtype"),
         ("engine", "quantization"), ("engine", "kv_cache_dtype"), ("engine", "max_batch_size"),
         ("engine", "max_input_len"), ("engine", "max_seq_len"), ("engine", "max_num_tokens"),
         ("engine", "calibration"), ("engine", "calibration", "prompts"),
         ("engine", "calibration", "samples"), ("serve", "port"), ("serve", "served_model_name"),
         ("serve", "max_model_len"), ("serve", "gpu_memory_utilization"), ("serve", "preset"),
         ("serve", "presets"), ("serve", "presets", "chat", "max_num_seqs"),
         ("image", "registry"), ("image", "repository"), ("image", "uid"), ("image", "shm_size"),
         ("image", "os"), ("extra",), ("model", "extra")]
NASTY = ["", " ", "\n", "x\n", "\r", "\x00", "\x1b[2J", "\x1b]0;t\x07", "\u2028", "$(id)", "`id`",
         "a;b", "a|b", "a&&b", "'", '"', "\\", "--privileged", "-v", "/", "//", "/opt/imgfab",
         "/opt/venv", "/etc", "/dev/shm", "/run/secrets", "/usr", "/home/imgfab", "/models//x",
         "/models/x/.", "/models/./x/", "/models/../etc", "../x", "a/../../b", "/etc/passwd",
         "٣٥٣", "５３５", ">=５３５.104.05", ">=535.104.05\n", "１６g", "0", "1k", "63m", "64m",
         "16g", "4097g", "9" * 50, "x" * 300, "a" * 64, "qwen2-7b", "Qwen/Qwen2-7B", "0" * 40,
         "g" * 40, "H100", "H100-SXM", "L40S", "A100-80GB", "fp8", "nvfp4", "int4_awq", "vllm",
         "tensorrt-llm", "engine", "pytorch", "chat", "long-context", "ubuntu22.04",
         "127.0.0.1:5000", "registry.example:99999", "llm/x", "LLM/X", "llm//x", "12345",
         "1e9", "0x10", "NaN", "true", "null", "~"]
_leaf = st.one_of(st.sampled_from(NASTY), st.text(max_size=40), st.none(), st.booleans(),
                  st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
                  st.integers(0, 70000))
_value = st.recursive(_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["a", "chat", "prompts", "x", ""]),
                                                 inner, max_size=3)), max_leaves=8)


# Plausible values per field: most recipes then render, so the render path is fuzzed too.
PLAUSIBLE = {
    "model.mount_path": st.sampled_from(["/models/a", "/srv/llm", "/models//b/.", "/data/w/",
                                         "/opt/models", "/mnt/x.y"]),
    "model.id": st.sampled_from(["/weights/x", "Org/Name-1.5", "a/b"]),
    "target.count": st.integers(1, 8), "target.pipeline_parallel": st.integers(1, 4),
    "target.driver": st.sampled_from([">=470.57.02", ">=535.104.05", ">=550.54.15", ">= 570.124.06",
                                      ">=580.65.06"]),
    "target.driver_policy": st.sampled_from(["strict", "minor-compat"]),
    "target.gpu": st.sampled_from(["H100", "H100-SXM", "L40S", "L4", "A100-80GB", "H200", "B200"]),
    "engine.max_batch_size": st.integers(1, 4096), "engine.max_seq_len": st.integers(4096, 131072),
    "engine.kv_cache_dtype": st.sampled_from(["auto", "fp8"]),
    "engine.quantization": st.sampled_from(["none", "fp8", "int4_awq", "nvfp4", "int8_sq"]),
    "serve.port": st.integers(1024, 65535), "serve.preset": st.sampled_from(["chat", "long-context"]),
    "serve.served_model_name": st.sampled_from(["qwen", "org/model", "m-1.0"]),
    "serve.gpu_memory_utilization": st.floats(0.06, 0.99),
    "serve.presets.chat.max_num_seqs": st.integers(1, 4096),
    "image.shm_size": st.sampled_from(["64m", "1g", "16G", "4096g", "2048m"]),
    "image.uid": st.integers(1000, 2**31 - 1), "image.os": st.sampled_from(["ubuntu22.04", "ubuntu24.04"]),
    "image.repository": st.sampled_from(["llm/a", "x", "team/sub/model-1"]),
    "image.registry": st.sampled_from(["r.example", "127.0.0.1:5000"]),
    "name": st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
}


def _alias_yaml(width: int, depth: int, base: dict) -> str:
    lines = ["a0: &a0 [" + ",".join(['"x"'] * width) + "]"]
    for level in range(1, depth + 1):
        lines.append(f"a{level}: &a{level} [" + ",".join([f"*a{level - 1}"] * width) + "]")
    text = yaml.safe_dump(base)
    return "\n".join(lines) + "\n" + text.replace("name:", f"x-name: *a{depth}\nname:", 1)


def _deep_yaml(depth: int, base: dict) -> str:
    return yaml.safe_dump(base) + "extra: " + "[" * depth + "]" * depth + "\n"


@st.composite
def recipe_texts(draw) -> tuple[str, str]:
    """(kind, YAML text) of one fuzzed recipe."""
    base = copy.deepcopy(draw(st.sampled_from(BASES)))
    kind = draw(st.sampled_from(["fields"] * 8 + ["alias", "deep"]))
    if kind == "alias":
        return kind, _alias_yaml(draw(st.integers(1, 12)), draw(st.integers(1, 9)), base)
    if kind == "deep":
        return kind, _deep_yaml(draw(st.integers(1, 3000)), base)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        dotted = ".".join(path)
        plausible = dotted in PLAUSIBLE and draw(st.integers(0, 2)) > 0  # two in three
        FIELDS[dotted] += 1
        node = base
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[path[-1]] = draw(PLAUSIBLE[dotted] if plausible else _value)
    try:
        return kind, yaml.safe_dump(base, allow_unicode=True)
    except (yaml.YAMLError, ValueError, OverflowError):
        return kind, json.dumps(base, default=str)


@pytest.fixture(scope="module")
def matrix():
    from imgfab.matrix.compat import load_matrix

    return load_matrix()


@pytest.fixture(scope="module", autouse=True)
def report():
    STARTED.append(time.monotonic())
    yield
    seconds = round(time.monotonic() - STARTED[0], 1)
    figures = {"examples_requested": EXAMPLES, "recipes_run": sum(OUTCOMES.values()),
               "seconds": seconds, "outcomes": dict(sorted(OUTCOMES.items())),
               "fields_mutated": dict(sorted(FIELDS.items()))}
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print("\nfuzz campaign:", json.dumps({k: v for k, v in figures.items() if k != "fields_mutated"},
                                        sort_keys=True))


def _one_line(error) -> None:
    line = error.one_line()
    assert line and "\n" not in line and len(line) < 2000, line
    assert not any(ord(ch) < 32 or 0x7f <= ord(ch) <= 0x9f for ch in line), repr(line)


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
          suppress_health_check=list(HealthCheck))
@given(case=recipe_texts())
def test_fuzzed_recipe_is_rendered_or_refused_in_one_line(case, matrix, tmp_path_factory):
    from imgfab.render.context import render_context
    from imgfab.stack.resolve import resolve

    kind, text = case
    path = tmp_path_factory.getbasetemp() / "fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        recipe = load_recipe(path)
    except RecipeError as error:
        _one_line(error)
        OUTCOMES[f"{kind}: RecipeError"] += 1
        return
    mount = recipe.model.mount_path
    assert mount == posixpath.normpath(mount) and not any(
        mount == o or mount.startswith(o + "/") or o.startswith(mount + "/")
        for o in IMAGE_OWNED_PATHS), mount
    try:
        stack = resolve(recipe, matrix).stack
        files = render_context(recipe, stack, matrix)
    except (RecipeError, CompatibilityError) as error:
        _one_line(error)
        OUTCOMES[f"{kind}: {type(error).__name__}"] += 1
        return
    for name, body in files.items():
        assert not any(ord(ch) < 32 and ch not in "\n\t" for ch in body), (name, text[:200])
    OUTCOMES[f"{kind}: rendered"] += 1
