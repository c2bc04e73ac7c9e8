"""Issue 20 (compatibility truth, round 3): known advisories on a resolved stack.

The expected answers come from the advisories as published (compat/advisories.yaml names the
pages read): GHSA-2pc9-4j83-qjmr / CVE-2026-22807, code execution through a model's auto_map,
affects vLLM >=0.10.1,<0.14.0 and is fixed in 0.14.0; CVE-2026-48746 (critical 9.1, the API-key
middleware bypass) affects >=0.3.0,<0.22.0. The issue's case: an H100 fleet on driver 560 under
strict resolves to vLLM 0.10.1.1 (inside both), and minor-compat gives 0.19.1.

The stacks are resolved against the frozen matrix (tests/fixtures/compat_frozen); the releases the
notes name are its rows: 0.33.0 is its newest vLLM (torch 2.14.0, strict floor 580.95.05), 0.19.1
its newest CUDA 12 one (torch 2.10.0), 0.22.0 the oldest outside CVE-2026-48746.

Issue 34: a critical advisory is a decision, not a default. A stack inside one is refused unless
the recipe names it in ``backend.accept_advisories`` (the frozen recipes name CVE-2026-48746, so
the note tests below resolve; the refusal tests take the acceptance out), the accepted ones are in
the image's labels and said by ``select``, and ``init``, ``validate`` and ``lock`` print them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

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
                         "target.driver ≥ 580.95.05 gives vllm 0.33.0; "
                         "accepted by backend.accept_advisories"), note


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


# --- a critical advisory refuses unless named (issue 34; before: backend.advisories) ---------

def _unaccepted(version: str | None = None, **target) -> dict:
    data = _recipe(**target)
    data["backend"].pop("accept_advisories")
    if version:
        data["backend"]["version"] = version
    return data


def test_a_critical_pick_not_named_is_refused_with_forward_compat_as_the_way_out(frozen_matrix):
    from imgfab.errors import CompatibilityError

    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(_unaccepted("==0.19.1")), frozen_matrix)
    error = caught.value
    assert error.field == "backend.accept_advisories"
    assert "vllm 0.19.1 is inside CVE-2026-48746 (critical 9.1), fixed in 0.22.0" in error.message
    # the recipe's R535 under minor-compat reaches no CUDA 13 release; R535 runs 13.0 by forward compatibility
    assert error.fix == ("dropping backend.version and target.driver_policy: forward-compat gives vllm 0.33.0 "
                         "with torch 2.14.0, outside every critical advisory; forward compatibility runs "
                         "the newer CUDA on the fleet's driver through the image's cuda-compat package, "
                         "on data-center GPUs only")


def test_the_unpinned_r535_recipe_is_refused_naming_the_advisory_not_the_newer_releases(frozen_matrix):
    # The demo's fleet: H100 on R535 under minor-compat. The CUDA 13 releases fail on the
    # driver; 0.19.1, the newest that fits, is inside CVE-2026-48746: that is the refusal.
    from imgfab.errors import CompatibilityError

    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(_unaccepted()), frozen_matrix)
    assert caught.value.field == "backend.accept_advisories"
    assert caught.value.message.startswith(
        "no vllm stack outside the critical advisories fits H100-SXM with driver 535.104.05 (minor-compat)")
    assert "the newest that fits: vllm 0.19.1: vllm 0.19.1 is inside CVE-2026-48746" in caught.value.message
    assert caught.value.fix.startswith("target.driver_policy: forward-compat gives vllm 0.33.0")


def test_refusal_skips_critical_releases_or_names_the_driver(frozen_matrix):
    # Strict on R560: 0.10.1.1 would be picked, inside CVE-2026-48746 (critical); every release
    # the driver allows is inside it, so the refusal's fix is a newer driver, not a policy that
    # gives 0.19.1 (itself inside it).
    from imgfab.errors import CompatibilityError

    with pytest.raises(CompatibilityError) as caught:
        resolve(parse_recipe(_unaccepted(driver=">=560.35.03", driver_policy="strict")), frozen_matrix)
    assert caught.value.fix == ("target.driver ≥ 580.95.05 gives vllm 0.33.0 with torch 2.14.0, "
                                "outside every critical advisory")


def _frozen_with_row(tmp_path, affected: str, severity: str = "critical") -> Path:
    """The frozen compat with one vLLM advisory row added, CVE-2099-0002."""
    compat = tmp_path / "compat"
    shutil.copytree(FROZEN_COMPAT, compat)
    path = compat / "advisories.yaml"
    data = yaml.safe_load(path.read_text())
    data["advisories"].append({"id": "CVE-2099-0002", "aliases": ["GHSA-2222-3333-4444"],
                               "package": "vllm", "affected": affected, "fixed": "99.0.0",
                               "severity": severity, "cvss": "", "summary": "a row of this test",
                               "source": "https://example.invalid/row", "confirmed": True})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return compat


def test_the_resolver_prefers_an_older_release_outside_every_critical_advisory(tmp_path):
    # R580 strict fits 0.33.0, the newest; a critical row on 0.33.0 alone leaves 0.26.0, the
    # next release the frozen matrix holds, outside every critical advisory: that one is picked.
    from imgfab.matrix.compat import load_matrix

    matrix = load_matrix(_frozen_with_row(tmp_path, "==0.33.0"))
    recipe = _unaccepted(driver=">=580.95.05", driver_policy="strict")
    stack = resolve(parse_recipe(recipe), matrix).stack
    assert stack.backend_version == "0.26.0"
    # named by an alias, the advisory is accepted: the newest is picked, its note says so
    recipe["backend"]["accept_advisories"] = ["GHSA-2222-3333-4444"]
    accepted = resolve(parse_recipe(recipe), matrix).stack
    assert accepted.backend_version == "0.33.0"
    [note] = _notes(accepted, "CVE-2099-0002 (GHSA-2222-3333-4444; critical)")
    assert note.endswith("; accepted by backend.accept_advisories"), note


def test_a_high_advisory_never_refuses_and_nothing_is_accepted_by_default(tmp_path, frozen_matrix):
    from imgfab.matrix.compat import load_matrix

    matrix = load_matrix(_frozen_with_row(tmp_path, "==0.33.0", severity="high"))
    stack = resolve(parse_recipe(_unaccepted(driver=">=580.95.05", driver_policy="strict")), matrix).stack
    assert stack.backend_version == "0.33.0" and _notes(stack, "CVE-2099-0002 (GHSA-2222-3333-4444; high)")
    assert parse_recipe(_unaccepted()).backend.accept_advisories == ()


def test_an_acceptance_naming_no_known_advisory_is_refused(frozen_matrix):
    from imgfab.errors import RecipeError

    data = _recipe()
    data["backend"]["accept_advisories"] = ["CVE-2026-48764"]  # digits swapped: accepts nothing
    with pytest.raises(RecipeError) as caught:
        resolve(parse_recipe(data), frozen_matrix)
    assert caught.value.field == "backend.accept_advisories"
    assert caught.value.message.startswith("CVE-2026-48764: no advisory of compat/advisories.yaml")


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


@pytest.mark.parametrize("value, message", [
    ("note", "backend.advisories (note/refuse) was replaced by backend.accept_advisories"),
    ("refuse", "backend.advisories (note/refuse) was replaced by backend.accept_advisories"),
])
def test_the_old_blanket_field_is_refused_naming_its_replacement(value, message):
    from imgfab.errors import RecipeError

    data = _recipe()
    data["backend"]["advisories"] = value
    with pytest.raises(RecipeError) as caught:
        parse_recipe(data)
    assert caught.value.field == "backend.advisories" and message in caught.value.message


@pytest.mark.parametrize("accepted, message", [
    (["cve-2026-48746"], "is not an advisory id"),
    (["CVE-2026-48746", "CVE-2026-48746"], "names an advisory twice"),
    (["GHSA-2pc9-4j83-qjmr; rm"], "is not an advisory id"),
])
def test_accept_advisories_takes_advisory_ids_only(accepted, message):
    from imgfab.errors import RecipeError

    data = _recipe()
    data["backend"]["accept_advisories"] = accepted
    with pytest.raises(RecipeError) as caught:
        parse_recipe(data)
    assert caught.value.field == "backend.accept_advisories" and message in caught.value.message


def test_the_acceptance_is_in_the_labels_and_select_says_so(frozen_matrix):
    from imgfab.recipe import recipe_hash
    from imgfab.render.context import image_labels

    recipe = parse_recipe(_recipe())
    stack = resolve(recipe, frozen_matrix).stack
    labels = image_labels(recipe, stack, recipe_hash(recipe), "config.json")
    assert labels["org.imgfab.advisories.accepted"] == "CVE-2026-48746"
    plain = parse_recipe(_recipe(driver=">=580.95.05", driver_policy="strict") | {"backend": {"name": "vllm"}})
    assert image_labels(plain, stack, recipe_hash(plain), "config.json")["org.imgfab.advisories.accepted"] == ""
    image = Candidate(Published("r/x", "old", "sha256:" + "0" * 64, {
        "org.imgfab.backend": "vllm", "org.imgfab.backend.version": "0.19.1", "org.imgfab.torch": "2.10.0",
        "org.imgfab.advisories.accepted": labels["org.imgfab.advisories.accepted"]}),
        [Verdict(True, "driver", "ok")])
    [line] = advisory_lines(frozen_matrix, image, [image])
    assert line.startswith("vllm 0.19.1 is inside CVE-2026-48746 (critical 9.1) "
                           "(accepted by its recipe: backend.accept_advisories): "), line
    bare = Candidate(Published("r/x", "bare", "sha256:" + "1" * 64, {
        "org.imgfab.backend": "vllm", "org.imgfab.backend.version": "0.19.1", "org.imgfab.torch": "2.10.0"}),
        [Verdict(True, "driver", "ok")])
    assert "accepted" not in advisory_lines(frozen_matrix, bare, [bare])[0]


def _recipe_file(tmp_path, data: dict) -> Path:
    path = tmp_path / "h100-r535.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_validate_refuses_an_unaccepted_critical_stack_and_prints_an_accepted_one(tmp_path):
    refused = CliRunner().invoke(cli, ["validate", str(_recipe_file(tmp_path, _unaccepted())),
                                       "--compat-dir", str(FROZEN_COMPAT)])
    assert refused.exit_code == 2, refused.output
    assert "backend.accept_advisories: no vllm stack outside the critical advisories" in refused.output
    assert "CVE-2026-48746" in refused.output
    accepted = CliRunner().invoke(cli, ["validate", str(_recipe_file(tmp_path, _recipe())),
                                        "--compat-dir", str(FROZEN_COMPAT), "--json"])
    assert accepted.exit_code == 0, accepted.output
    [entry] = json.loads(accepted.stdout)["recipes"]
    [line] = [a for a in entry["advisories"] if "CVE-2026-48746" in a]
    assert line.startswith("vllm 0.19.1 is inside CVE-2026-48746") and line.endswith(
        "accepted by backend.accept_advisories")
    text = CliRunner().invoke(cli, ["validate", str(_recipe_file(tmp_path, _recipe())),
                                    "--compat-dir", str(FROZEN_COMPAT)])
    assert "  advisory: vllm 0.19.1 is inside CVE-2026-48746" in text.output


def _imgfab(*args: str) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: its own error handling turns a refusal into one line."""
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args, "--compat-dir", str(FROZEN_COMPAT)],
                          capture_output=True, text=True, timeout=300)


def test_init_on_r535_names_the_advisory_and_forward_compat(tmp_path):
    target = tmp_path / "starter.yaml"
    answers = ("init", "--model", "Qwen/Qwen2-7B-Instruct", "--revision",
               "f2826a00ceef68f0f2b946d945ecc0477ce4450c", "--gpu", "H100", "--driver", "535.104.05",
               "--output", str(target))
    result = _imgfab(*answers)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert "vllm 0.19.1 is inside CVE-2026-48746" in line
    assert "target.driver_policy: forward-compat gives vllm 0.33.0" in line
    assert not target.exists()
    fc = _imgfab(*answers, "--policy", "forward-compat")
    assert fc.returncode == 0, fc.stderr
    assert "resolves to vllm 0.33.0" in fc.stdout and "advisory:" not in fc.stdout


def test_lock_refuses_a_critical_stack_before_resolving_any_payload(tmp_path):
    # no lock file, no index: the refusal comes from the stack, named, before uv is asked
    path = _recipe_file(tmp_path, _unaccepted())
    for args in (["lock", "--check"], ["lock"]):
        result = _imgfab(*args, str(path))
        assert result.returncode == 2, (args, result.stderr)
        assert "vllm 0.19.1 is inside CVE-2026-48746" in result.stderr, args


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


@pytest.mark.parametrize("accept, severity, code", [(True, "critical", 0), (False, "high", 0), (False, "critical", 2)])
def test_lock_check_reads_the_whole_locked_set_against_the_advisories(tmp_path, accept, severity, code):
    # transformers is no top-level pin (vllm's requirement resolves it): only the lock knows it.
    version = _locked("transformers")
    compat = _with_row(tmp_path, "transformers", f"<={version}", severity)
    data = yaml.safe_load((REPO / "recipes" / "qwen2-7b-h200.yaml").read_text())
    if accept:
        data["backend"]["accept_advisories"] = ["CVE-2099-0001"]
    recipe = tmp_path / "qwen2-7b-h200.yaml"
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    shutil.copy(REPO / "recipes" / "qwen2-7b-h200.lock", tmp_path)
    result = CliRunner().invoke(cli, ["lock", "--check", "--compat-dir", str(compat), str(recipe)])
    assert result.exit_code == code, result.output
    assert f"advisory: transformers {version} (locked) is inside CVE-2099-0001" in result.output
    if code == 2:
        [line] = [l for l in result.output.splitlines() if l.startswith("imgfab: ")]
        assert line.startswith("imgfab: backend.accept_advisories: locked packages inside critical "
                               f"advisories: qwen2-7b-h200: transformers {version} (CVE-2099-0001, fixed in 99.0.0)")
    if accept:
        assert "CVE-2099-0001" in result.output and "accepted by backend.accept_advisories" in result.output
    as_json = CliRunner().invoke(cli, ["lock", "--check", "--json", "--compat-dir", str(compat), str(recipe)])
    [entry] = json.loads(as_json.stdout)["locks"]
    assert any("CVE-2099-0001" in note for note in entry["advisories"])
