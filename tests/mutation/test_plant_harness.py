"""The planted-bug harness's own rules (issue 31), on a tiny stand-in tree: a plant that breaks
the code or no longer applies is a harness error, never a kill; a test failing on an assertion
or on the product's exception is a kill. Not marked ``mutation``: this runs in every suite."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plant_harness import (HARNESS_ERROR, KILLED, SURVIVED, Plant, apply, check_plants, classify,  # noqa: E402
                           main, run_suite)

GUARD = '''\
LIMIT = 3


def allowed(size):
    if size > LIMIT:
        return False
    return True


def check(size):
    if not allowed(size):
        raise ValueError(f"{size} is above the limit")
'''

GUARD_TESTS = '''\
from imgfab.guard import allowed


def test_refuses_above_the_limit():
    assert not allowed(4)


def test_allows_the_limit():
    assert allowed(3)
'''

GUARD_OFF = Plant("guard off", "guard.py", old="    if size > LIMIT:", new="    if False:")
# The plant of plants_compat4.py before issue 31: the body of an `if` removed, an IndentationError.
GUARD_OFF_BADLY = Plant("guard off, badly", "guard.py", old="        return False\n", new="")


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture
def repo(tmp_path) -> Path:
    """A stand-in repository: an ``imgfab`` package with one guard and a module importing its
    limit, a compat directory, and tests that catch the guard being turned off."""
    _tree(tmp_path, {"src/imgfab/__init__.py": "", "src/imgfab/guard.py": GUARD,
                     "src/imgfab/user.py": "from imgfab.guard import LIMIT\n",
                     "compat/README.md": "", "tests/test_guard.py": GUARD_TESTS})
    return tmp_path


def _planted(repo: Path, plant: Plant) -> None:
    target = repo / "src" / "imgfab" / plant.path
    target.write_text(apply(plant, target.read_text()))


def test_a_plant_that_breaks_the_syntax_is_a_harness_error_not_a_kill(repo):
    assert [(p.name, why) for p, why in check_plants([GUARD_OFF_BADLY], repo)] == [
        ("guard off, badly",
         "IndentationError: expected an indented block after 'if' statement on line 5 (guard.py, line 6)")]
    _planted(repo, GUARD_OFF_BADLY)
    result, junit = run_suite(repo, ["tests"], "-x")
    assert result.returncode != 0  # what the harness counted as a kill before issue 31
    verdict = classify(result.returncode, junit)
    assert (verdict.kind, verdict.why) == (HARNESS_ERROR, "pytest exit 2: interrupted (a collection error?)")


def test_a_genuine_assertion_failure_is_a_kill(repo):
    assert check_plants([GUARD_OFF], repo) == []
    _planted(repo, GUARD_OFF)
    result, junit = run_suite(repo, ["tests"], "-x")
    verdict = classify(result.returncode, junit)
    assert (verdict.kind, verdict.test) == (KILLED, "tests.test_guard::test_refuses_above_the_limit")


def test_plants_that_do_not_apply_or_break_an_import_are_reported(repo):
    plants = [GUARD_OFF,
              Plant("text gone", "guard.py", old="    if size >= LIMIT:", new="    if False:"),
              Plant("text twice", "guard.py", old="allowed(size)", new="allowed(0)"),
              Plant("no change", "guard.py", old="LIMIT = 3", new="LIMIT = 3"),
              Plant("catcher gone", "guard.py", old="LIMIT = 3", new="LIMIT = 4",
                    first=("tests/test_gone.py",)),
              Plant("limit renamed", "guard.py", old="LIMIT = 3\n", new="LIMTI = 3\n")]
    assert [(p.name, why) for p, why in check_plants(plants, repo)] == [
        ("text gone", "ValueError: its old text occurs 0 times in guard.py, not once"),
        ("text twice", "ValueError: its old text occurs 2 times in guard.py, not once"),
        ("no change", "ValueError: its old and new text are the same"),
        ("catcher gone", "ValueError: its first test files do not exist: tests/test_gone.py"),
        ("limit renamed", "importing imgfab.user: ImportError: cannot import name 'LIMIT' from "
                          f"'imgfab.guard' ({repo}/src/imgfab/guard.py)")]


def test_check_mode_lists_each_broken_plant_on_one_line_and_fails(repo, capsys):
    plants = [GUARD_OFF, GUARD_OFF_BADLY, Plant("text gone", "guard.py", old="LIMIT = 9", new="LIMIT = 1")]
    assert main(plants, repo, ["--check-plants"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        "broken plant: 'guard off, badly' (guard.py): IndentationError: expected an indented block "
        "after 'if' statement on line 5 (guard.py, line 6)",
        "broken plant: 'text gone' (guard.py): ValueError: its old text occurs 0 times in guard.py, not once"]
    assert out[2].startswith("check-plants: 3 plants, 2 broken, ")
    assert main([GUARD_OFF], repo, ["--check-plants"]) == 0
    assert main([GUARD_OFF], repo, []) == 2
    assert capsys.readouterr().err.endswith("--check-plants (got nothing)\n")


def test_what_each_kind_of_red_test_proves(tmp_path):
    """One run with a test of each kind; each test's part of the junit report judged alone."""
    _tree(tmp_path, {
        "src/imgfab/__init__.py": "", "src/imgfab/guard.py": GUARD,
        "src/imgfab/broken.py": "def f(:\n",
        "tests/test_collect.py": "import imgfab.broken  # noqa: F401\n",
        "tests/test_kinds.py": '''\
import pytest
from imgfab import guard


@pytest.fixture
def over_the_limit():
    guard.check(9)


@pytest.fixture
def missing_module():
    import imgfab.missing  # noqa: F401


@pytest.fixture
def missing_file():
    open("/nonexistent/imgfab-harness")


def test_assertion():
    assert guard.allowed(4)


def test_product_exception():
    guard.check(9)


def test_import_error():
    from imgfab.guard import nothing  # noqa: F401


def test_fixture_product_exception(over_the_limit):
    pass


def test_fixture_import_error(missing_module):
    pass


def test_fixture_error_outside_the_product(missing_file):
    pass
'''})
    result, junit = run_suite(tmp_path, ["tests"], "--continue-on-collection-errors")
    assert result.returncode == 1, result.stdout[-2000:]
    verdicts = {}
    for case in ET.fromstring(junit).iter("testcase"):
        alone = f"<testsuites><testsuite>{ET.tostring(case, encoding='unicode')}</testsuite></testsuites>"
        verdict = classify(1, alone)
        verdicts[verdict.test] = verdict.kind
    assert verdicts == {
        "tests.test_collect": HARNESS_ERROR,
        "tests.test_kinds::test_assertion": KILLED,
        "tests.test_kinds::test_product_exception": KILLED,
        "tests.test_kinds::test_import_error": HARNESS_ERROR,
        "tests.test_kinds::test_fixture_product_exception": KILLED,
        "tests.test_kinds::test_fixture_import_error": HARNESS_ERROR,
        "tests.test_kinds::test_fixture_error_outside_the_product": HARNESS_ERROR,
    }
    assert classify(1, junit).kind == KILLED  # one real kill among harness errors is a kill


@pytest.mark.parametrize(("returncode", "why"), [
    (2, "pytest exit 2: interrupted (a collection error?)"),
    (3, "pytest exit 3: internal error"),
    (4, "pytest exit 4: usage error"),
    (5, "pytest exit 5: no tests collected"),
    (1, "pytest left no readable junit report (no element found: line 1, column 0)"),
    (1, "pytest exit 1 with no failed test"),
])
def test_runs_that_prove_nothing_are_harness_errors(returncode, why):
    junit = "" if "no readable" in why else "<testsuites><testsuite><testcase/></testsuite></testsuites>"
    verdict = classify(returncode, junit)
    assert (verdict.kind, verdict.why) == (HARNESS_ERROR, why)


def test_a_green_run_is_a_survival():
    assert classify(0, "<testsuites><testsuite><testcase/></testsuite></testsuites>").kind == SURVIVED
