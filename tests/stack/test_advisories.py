"""Issue 20 (compatibility truth, round 3): known advisories on a resolved stack.

The expected answers come from the advisories as published (compat/advisories.yaml names the
pages read): GHSA-2pc9-4j83-qjmr / CVE-2026-22807, code execution through a model's auto_map,
affects vLLM >=0.10.1,<0.14.0 and is fixed in 0.14.0; CVE-2026-48746 (critical 9.1, the API-key
middleware bypass) affects >=0.3.0,<0.22.0. The issue's case: an H100 fleet on driver 560 under
strict resolves to vLLM 0.10.1.1 (inside both), and minor-compat gives 0.19.1.

The stacks are resolved against the frozen matrix (tests/fixtures/compat_frozen); the releases the
notes name are its rows: 0.33.0 is its newest vLLM (torch 2.14.0, strict floor 580.95.05), 0.19.1
its newest CUDA 12 one (torch 2.10.0), 0.22.0 the oldest outside CVE-2026-48746.
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from click.testing import CliRunner

from imgfab.cli import cli
from imgfab.errors import MatrixError
from imgfab.matrix.advisories import load_advisories
from imgfab.ops.select import Candidate, Published, advisory_lines
from imgfab.in_image.rules import Verdict
from imgfab.recipe import parse_recipe
from imgfab.stack.resolve import resolve

from conftest import FROZEN_COMPAT, FROZEN_RECIPES, REPO

AUTO_MAP = "GHSA-2pc9-4j83-qjmr (CVE-2026-22807; high 8.8)"


def _recipe(**target) -> dict:
    data = yaml.safe_load((FROZEN_RECIPES / "qwen2-7b-h100.yaml").read_text())
    data["target"].update(target)
    return data


def _notes(stack, advisory: str) -> list[str]:
    return [n for n in stack.notes if f"is inside {advisory}" in n]


def test_the_strict_r560_pick_is_named_inside_the_auto_map_advisory_with_the_policy_that_fixes_it(frozen_matrix):
    stack = resolve(parse_recipe(_recipe(driver=">=560.35.03", driver_policy="strict")), frozen_matrix).stack
    assert stack.backend_version == "0.10.1.1"
    [note] = _notes(stack, AUTO_MAP)
    assert note.startswith("vllm 0.10.1.1 is inside GHSA-2pc9-4j83-qjmr")
    assert "affected >=0.10.1,<0.14.0, fixed in 0.14.0; target.driver_policy: minor-compat gives vllm 0.19.1" in note


def test_an_advisory_the_other_policy_does_not_fix_names_a_newer_driver(frozen_matrix):
    stack = resolve(parse_recipe(_recipe(driver=">=560.35.03", driver_policy="strict")), frozen_matrix).stack
    [note] = _notes(stack, "CVE-2026-48746 (critical 9.1)")
    assert note.endswith("affected >=0.3.0,<0.22.0, fixed in 0.22.0; "
                         "target.driver ≥ 580.95.05 gives vllm 0.33.0"), note


def test_a_pinned_release_names_dropping_the_pin(frozen_matrix):
    data = _recipe(driver=">=999.0", driver_policy="strict")
    data["backend"]["version"] = "==0.13.0"
    [note] = _notes(resolve(parse_recipe(data), frozen_matrix).stack, AUTO_MAP)
    assert note.endswith("fixed in 0.14.0; dropping backend.version '==0.13.0' gives vllm 0.33.0"), note


def test_the_newest_release_carries_no_advisory_note(frozen_matrix):
    stack = resolve(parse_recipe(_recipe(driver=">=999.0", driver_policy="strict")), frozen_matrix).stack
    assert stack.backend_version == "0.33.0"
    assert not [n for n in stack.notes if " is inside " in n]


def test_an_unconfirmed_advisory_says_so(frozen_matrix):
    stack = resolve(parse_recipe(_recipe(driver=">=560.35.03", driver_policy="strict")), frozen_matrix).stack
    [note] = _notes(stack, "GHSA-8fr4-5q9j-m8gm")
    assert note.endswith("(advisory range unconfirmed)")
    assert any(u.startswith("advisory GHSA-8fr4-5q9j-m8gm: ") for u in stack.unconfirmed)


def test_resolve_json_carries_the_advisory(tmp_path):
    path = tmp_path / "h100-r560.yaml"
    path.write_text(yaml.safe_dump(_recipe(driver=">=560.35.03", driver_policy="strict")))
    result = CliRunner().invoke(cli, ["resolve", str(path), "--json", "--compat-dir", str(FROZEN_COMPAT)])
    assert result.exit_code == 0, result.output
    notes = json.loads(result.output)["stack"]["notes"]
    assert any(AUTO_MAP in n and "minor-compat gives vllm 0.19.1" in n for n in notes), notes


# --- select: the chosen image, and a fitting one outside the advisory ------------------------

def _image(tag: str, version: str) -> Candidate:
    labels = {"org.imgfab.backend": "vllm", "org.imgfab.backend.version": version, "org.imgfab.torch": "2.10.0"}
    return Candidate(Published("r/x", tag, "sha256:" + "0" * 64, labels), [Verdict(True, "driver", "ok")])


def test_select_names_the_advisory_and_a_fitting_image_outside_it(frozen_matrix):
    old, new = _image("old", "0.10.1.1"), _image("new", "0.19.1")
    lines = advisory_lines(frozen_matrix, old, [new, old])
    [line] = [x for x in lines if AUTO_MAP in x]
    assert line.startswith("vllm 0.10.1.1 is inside") and line.endswith("fitting image outside it: new (vllm 0.19.1)")
    [critical] = [x for x in lines if "CVE-2026-48746" in x]
    assert critical.endswith("no other image that fits this host is outside it")
    assert not [x for x in advisory_lines(frozen_matrix, _image("newest", "0.33.0"), []) if "vllm" in x]


# --- malformed rows ---------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    ({"fixed": "0.12.0"}, "is inside its own range"),
    ({"affected": ">=0.10.1,<<0.14.0"}, "Invalid specifier"),
    ({"severity": "urgent"}, "is not one of"),
])
def test_a_malformed_advisory_is_refused(tmp_path, change, message):
    shutil.copytree(FROZEN_COMPAT, tmp_path / "compat")
    path = tmp_path / "compat" / "advisories.yaml"
    data = yaml.safe_load(path.read_text())
    row = next(r for r in data["advisories"] if r["id"] == "GHSA-2pc9-4j83-qjmr")
    row.update(change)
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(MatrixError) as info:
        load_advisories(tmp_path / "compat")
    assert message in str(info.value) and "GHSA-2pc9-4j83-qjmr" in str(info.value)


# --- backend.advisories: refuse, and the torch/transformers rows (issue 20, item 6) -------------

def _refusing(version: str | None = None, **target) -> dict:
    data = _recipe(**target)
    data["backend"]["advisories"] = "refuse"
    if version:
        data["backend"]["version"] = version
    return data


def test_refuse_turns_a_critical_pick_into_a_refusal_that_names_it_and_a_fix_outside_it(frozen_matrix):
    from imgfab.errors import CompatibilityError

    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(_refusing("==0.19.1")), frozen_matrix)
    error = caught.value
    assert error.field == "backend.advisories"
    assert "vllm 0.19.1 is inside CVE-2026-48746 (critical 9.1), fixed in 0.22.0" in error.message
    # the recipe's R535 under minor-compat reaches no CUDA 13 release; R535 runs 13.0 by forward compatibility
    assert error.fix == ("dropping backend.version and target.driver_policy: forward-compat gives vllm 0.33.0 "
                         "with torch 2.14.0, outside every critical advisory")


def test_refuse_skips_critical_releases_for_an_older_clean_one_or_names_the_driver(frozen_matrix):
    # Strict on R560: 0.10.1.1 would be picked, inside CVE-2026-48746 (critical); every release
    # the driver allows is inside it, so the refusal's fix is a newer driver, not a policy that
    # gives 0.19.1 (itself inside it).
    from imgfab.errors import CompatibilityError

    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(_refusing(driver=">=560.35.03", driver_policy="strict")), frozen_matrix)
    assert caught.value.fix == ("target.driver ≥ 580.95.05 gives vllm 0.33.0 with torch 2.14.0, "
                                "outside every critical advisory")


def test_note_is_the_default_and_a_high_advisory_never_refuses(frozen_matrix):
    # R580 strict picks 0.33.0, past 0.22.0: no critical advisory, so refuse resolves the same.
    plain = resolve(parse_recipe(_recipe(driver=">=580.95.05", driver_policy="strict")), frozen_matrix).stack
    refusing = resolve(parse_recipe(_refusing(driver=">=580.95.05", driver_policy="strict")), frozen_matrix).stack
    assert plain.backend_version == refusing.backend_version == "0.33.0"
    assert parse_recipe(_recipe()).backend.advisories == "note"


def test_torch_rows_hold_the_releases_their_advisories_name(frozen_matrix):
    # GHSA-53q9-r3pm-6pq6 (torch.load weights_only bypass): < 2.6.0, fixed in 2.6.0;
    # CVE-2026-24747 (weights_only unpickler memory corruption): < 2.10.0, fixed in 2.10.0.
    assert [a.id for a in frozen_matrix.advisories_for("torch", "2.5.1")] == ["CVE-2026-24747", "GHSA-53q9-r3pm-6pq6"]
    assert [a.id for a in frozen_matrix.advisories_for("torch", "2.9.1")] == ["CVE-2026-24747"]
    assert frozen_matrix.advisories_for("torch", "2.10.0") == []


def test_the_strict_r560_pick_names_its_torch_advisory_too(frozen_matrix):
    stack = resolve(parse_recipe(_recipe(driver=">=560.35.03", driver_policy="strict")), frozen_matrix).stack
    assert stack.torch == "2.7.1"  # vLLM 0.10.1.1's pin
    [note] = [n for n in stack.notes if n.startswith("torch 2.7.1 is inside CVE-2026-24747")]
    assert note.endswith("fixed in 2.10.0; target.driver_policy: minor-compat gives torch 2.10.0")


def test_transformers_rows_and_the_locked_set(frozen_matrix):
    from imgfab.stack.advisories import locked_hits

    # CVE-2026-4372: every release since 4.56.0, fixed in 5.3.0.
    hits = locked_hits(frozen_matrix, {"transformers": "4.57.1", "torch": "2.10.0", "vllm": "0.22.0"})
    assert [(name, version, a.id) for name, version, a in hits] == [("transformers", "4.57.1", "CVE-2026-4372")]
    assert locked_hits(frozen_matrix, {"transformers": "5.3.0", "torch": "2.10.0"}) == []


def test_refuse_is_a_recipe_field_with_two_values():
    from imgfab.errors import RecipeError

    with pytest.raises(RecipeError) as caught:
        parse_recipe(_refusing() | {"backend": {"name": "vllm", "advisories": "ignore"}})
    assert caught.value.field == "backend.advisories" and "'note' or 'refuse'" in caught.value.message


def _with_row(tmp_path, package: str, affected: str, severity: str):
    """The shipped compat/ with one advisory row added: `lock --check` reads the example's
    committed lock, which is recorded against the shipped compat, not the frozen one."""
    compat = tmp_path / "compat"
    shutil.copytree(REPO / "compat", compat)
    path = compat / "advisories.yaml"
    data = yaml.safe_load(path.read_text())
    data["advisories"].insert(0, {"id": "CVE-2099-0001", "aliases": [], "package": package,
                                  "affected": affected, "fixed": "99.0.0", "severity": severity,
                                  "cvss": "", "summary": "a row of this test",
                                  "source": "https://example.invalid/row", "confirmed": True})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return compat


def _locked(name: str) -> str:
    line = next(l for l in (REPO / "recipes" / "qwen2-7b-h200.lock").read_text().splitlines()
                if l.startswith(f"{name}=="))
    return line.split("==", 1)[1].split()[0]


@pytest.mark.parametrize("refuse, severity, code", [(False, "critical", 0), (True, "high", 0), (True, "critical", 2)])
def test_lock_check_reads_the_whole_locked_set_against_the_advisories(tmp_path, refuse, severity, code):
    # transformers is no top-level pin (vllm's requirement resolves it): only the lock knows it.
    version = _locked("transformers")
    compat = _with_row(tmp_path, "transformers", f"<={version}", severity)
    data = yaml.safe_load((REPO / "recipes" / "qwen2-7b-h200.yaml").read_text())
    if refuse:
        data["backend"]["advisories"] = "refuse"
    recipe = tmp_path / "qwen2-7b-h200.yaml"
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    shutil.copy(REPO / "recipes" / "qwen2-7b-h200.lock", tmp_path)
    result = CliRunner().invoke(cli, ["lock", "--check", "--compat-dir", str(compat), str(recipe)])
    assert result.exit_code == code, result.output
    assert f"advisory: transformers {version} (locked) is inside CVE-2099-0001" in result.output
    if code == 2:
        [line] = [l for l in result.output.splitlines() if l.startswith("imgfab: ")]
        assert line.startswith("imgfab: backend.advisories: locked packages inside critical advisories: "
                               f"qwen2-7b-h200: transformers {version} (CVE-2099-0001, fixed in 99.0.0)")
    as_json = CliRunner().invoke(cli, ["lock", "--check", "--json", "--compat-dir", str(compat), str(recipe)])
    [entry] = json.loads(as_json.stdout)["locks"]
    assert any("CVE-2099-0001" in note for note in entry["advisories"])
