"""The lock is data (issue 21, item 1): parsed, checked against compat/payload.yaml and the
recipe, and re-written for the builder; never copied into it.

Each attack of the adversarial pass edits a copy of a committed lock next to a copy of its
recipe: an option line, an include, a URL or path requirement in the body, or a header line
naming another index, installer or served GPU. ``--check``, ``render`` and ``build`` refuse
each one naming the line; a consistent forgery (the fingerprint recomputed) is refused too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imgfab.errors import RecipeError
from imgfab.payload import lock as lockmod
from imgfab.payload.lock import Lock

from conftest import REPO, VLLM_0191

RECIPE = "qwen2-7b-h100"
HASH = "sha256:" + "e" * 64

# Lines the pass put into a lock body; uv obeys each even with --index-url, --require-hashes,
# --no-deps and --no-build on its command line.
BODY_ATTACKS = [
    "--extra-index-url http://127.0.0.1:9/simple",
    "--extra-index-url=http://127.0.0.1:9/simple",
    "--index-url http://127.0.0.1:9/simple",
    "-i http://127.0.0.1:9/simple",
    "--find-links http://127.0.0.1:9/wheels/",
    "-f ./wheels",
    "--trusted-host 127.0.0.1",
    "--no-binary :all:",
    "--pre",
    "-r extra.txt",
    "--requirement extra.txt",
    "-c constraints.txt",
    "-e ./evil",
    "evil @ http://127.0.0.1:9/evil-1.0-py3-none-any.whl",
    f"evil @ http://127.0.0.1:9/evil-1.0-py3-none-any.whl --hash={HASH}",
    "./evil-1.0-py3-none-any.whl",
    "/tmp/evil-1.0-py3-none-any.whl",
    "evil-1.0.tar.gz",
    "evil==1.0; python_version > '3'",
    "evil>=1.0",
    "evil",
    f"evil==1.0 --hash={HASH} --extra-index-url http://127.0.0.1:9/simple",
    f"    --hash={HASH}",
    "# a comment below the pins",
]


def _forge(text: str, recipe: Path) -> str:
    """``text`` with its fingerprint recomputed, as a forger who read imgfab would: every input
    of the fingerprint is public. (On code without a whole-file fingerprint the line stays.)"""
    fingerprint = getattr(lockmod, "lock_fingerprint", None)
    if fingerprint is None:
        return text
    from imgfab.matrix.compat import load_matrix
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import resolve

    parsed = load_recipe(recipe)
    request = lockmod.payload_request(parsed, resolve(parsed, load_matrix()).stack)
    new = fingerprint(request, text)
    return re.sub(r"^# fingerprint: \S*$", f"# fingerprint: {new}", text, count=1, flags=re.M)


def _workspace(tmp_path: Path, edit, *, forge: bool = True) -> Path:
    recipe = tmp_path / f"{RECIPE}.yaml"
    shutil.copyfile(REPO / "recipes" / f"{RECIPE}.yaml", recipe)
    text = edit((REPO / "recipes" / f"{RECIPE}.lock").read_text())
    (tmp_path / f"{RECIPE}.lock").write_text(_forge(text, recipe) if forge else text)
    return recipe


def _imgfab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True,
                          text=True, cwd=cwd)


def _after_pin(line: str):
    """An edit putting ``line`` below the pins of torch (mid-body, where a diff hides it)."""
    def edit(text: str) -> str:
        anchor = re.search(r"^torch==.*(?:\n    --hash=.*)+\n", text, re.M)
        assert anchor
        return text[:anchor.end()] + line + "\n" + text[anchor.end():]
    return edit


def _line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.split("\n"), start=1) if line == needle)


def _expected_what(line: str) -> str:
    """The refusal each attack line must get: the kind of line, named."""
    if line.startswith("evil==1.0 "):
        return "text after the pin ("
    if line.startswith(("-r", "--requirement", "-c")):
        return "an include ("
    if line.startswith("-e"):
        return "an editable requirement (-e)"
    if line.startswith("-"):
        return f"an option line ({line.split()[0].split('=')[0]})"
    if line.startswith("    --hash="):
        return "a --hash line with no pin"
    if line.startswith("#"):
        return "a comment below the pins"
    if "@" in line:
        return "a URL requirement (evil @"
    if ";" in line:
        return "an environment marker"
    if "/" in line or line.endswith((".whl", ".tar.gz")):
        return "a path or archive requirement"
    return "not a name==version line"


@pytest.mark.parametrize("line", BODY_ATTACKS)
def test_lock_check_refuses_every_line_that_is_not_a_pin_naming_it(tmp_path, line):
    recipe = _workspace(tmp_path, _after_pin(line))
    result = _imgfab("lock", "--check", str(recipe))
    assert result.returncode == 2, (line, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    number = _line_of((tmp_path / f"{RECIPE}.lock").read_text(), line)
    assert f"{RECIPE}.lock:{number}: {_expected_what(line)}" in result.stderr, result.stderr
    assert "imgfab lock RECIPE" in result.stderr


@pytest.mark.parametrize("line", [BODY_ATTACKS[0], BODY_ATTACKS[4], BODY_ATTACKS[9], BODY_ATTACKS[13]])
def test_render_and_build_refuse_the_line_before_anything_reaches_the_builder(tmp_path, line, matrix):
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import resolve

    recipe_path = _workspace(tmp_path, _after_pin(line))
    recipe = load_recipe(recipe_path)
    stack = resolve(recipe, matrix).stack
    with pytest.raises(RecipeError, match=rf"{RECIPE}\.lock:\d+:"):
        lockmod.committed_lock(recipe_path, recipe, stack)  # what `imgfab render` renders with
    with pytest.raises(RecipeError, match=rf"{RECIPE}\.lock:\d+:"):
        lockmod.load_for_build(str(recipe_path), recipe, stack)  # `imgfab build`
    with pytest.raises(RecipeError, match=r"x\.lock:\d+:"):
        (tmp_path / "x.lock").write_text((tmp_path / f"{RECIPE}.lock").read_text())
        lockmod.load_for_build(str(recipe_path), recipe, stack, tmp_path / "x.lock")  # build --lock
    result = _imgfab("render", str(recipe_path), "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert not (tmp_path / "out" / "requirements.lock").exists()


def test_a_refused_line_never_echoes_a_password(tmp_path):
    for line in ("--extra-index-url http://alice:S3CRET@127.0.0.1:9/simple",
                 "--index-url=https://alice:S3CRET@pypi.corp.example/simple",
                 "evil @ https://alice:S3CRET@pypi.corp.example/evil.whl",
                 "alice:S3CRET@pypi.corp.example/simple"):
        recipe = _workspace(tmp_path, _after_pin(line))
        result = _imgfab("lock", "--check", str(recipe))
        assert result.returncode == 2 and "S3CRET" not in result.stderr + result.stdout, result.stderr


HEADER_ATTACKS = {
    "index": ("# index: https://pypi.org/simple (every other name; uv --index-strategy first-index)",
              "# index: http://127.0.0.1:9/simple (every other name; uv --index-strategy first-index)"),
    "installer": (None, "# installer: uv @ http://127.0.0.1:9/uv-0.13.9-py3-none-any.whl"),
    "serves": (None, "# serves: 10.0 (the recipe's B200: a cubin file no such GPU can run is cut)"),
    "unknown": (None, "# extra-index-url: http://127.0.0.1:9/simple"),
}


def _header_edit(key: str):
    old, new = HEADER_ATTACKS[key]

    def edit(text: str) -> str:
        if key == "unknown":
            return text.replace("# resolver:", new + "\n# resolver:", 1)
        pattern = re.escape(old) if old else rf"^# {key}: .*$"
        assert re.search(pattern, text, re.M)
        return re.sub(pattern, new, text, count=1, flags=re.M)
    return edit


@pytest.mark.parametrize("key", sorted(HEADER_ATTACKS))
def test_a_forged_header_is_refused_by_check_naming_its_line(tmp_path, key):
    recipe = _workspace(tmp_path, _header_edit(key))
    result = _imgfab("lock", "--check", str(recipe))
    assert result.returncode == 2, (key, result.stdout, result.stderr)
    assert re.search(rf"{RECIPE}\.lock:\d+:", result.stderr) and "imgfab lock" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("key", sorted(HEADER_ATTACKS))
def test_an_edited_header_without_a_new_fingerprint_is_refused(tmp_path, key):
    recipe = _workspace(tmp_path, _header_edit(key), forge=False)
    result = _imgfab("lock", "--check", str(recipe))
    assert result.returncode != 0, (key, result.stdout)


@pytest.mark.parametrize("key", ["index", "installer", "serves"])
def test_the_builder_takes_index_installer_and_serves_from_compat_not_the_header(tmp_path, key, matrix):
    """Even a forged header that got past every check decides nothing in the builder."""
    from imgfab.recipe import load_recipe
    from imgfab.render.context import render_context
    from imgfab.stack.resolve import resolve

    recipe_path = _workspace(tmp_path, _header_edit(key))
    recipe = load_recipe(recipe_path)
    stack = resolve(recipe, matrix).stack
    request = lockmod.payload_request(recipe, stack)
    forged = Lock.parse((tmp_path / f"{RECIPE}.lock").read_text())
    bind = getattr(forged, "bind", None)
    files = render_context(recipe, stack, matrix, lock=bind(request) if bind else forged)
    assert files["installer.lock"] == request.installer + "\n"
    assert "127.0.0.1" not in files["netenv.sh"] + files["requirements.lock"] + files["installer.lock"]
    assert re.search(r"^IMGFAB_INDEX_URL=https://pypi\.org/simple$", files["netenv.sh"], re.M)
    assert re.findall(r"^# serves: (.*)$", files["requirements.lock"], re.M) == [" ".join(request.serves)]


def test_an_edited_pin_or_hash_makes_the_lock_stale(tmp_path):
    for edit in (lambda t: re.sub(r"^(six==)\S+", r"\g<1>1.16.0", t, count=1, flags=re.M),
                 lambda t: re.sub(r"(^six==.*\n    --hash=sha256:)[0-9a-f]{64}", r"\g<1>" + "0" * 64, t,
                                  count=1, flags=re.M),
                 lambda t: t.replace("six==1.17.0 \\\n    --hash=sha256:",
                                     f"six==1.17.0 \\\n    --hash={HASH} \\\n    --hash=sha256:", 1)):
        recipe = _workspace(tmp_path, edit, forge=False)
        assert (tmp_path / f"{RECIPE}.lock").read_text() != (REPO / "recipes" / f"{RECIPE}.lock").read_text()
        result = _imgfab("lock", "--check", str(recipe))
        assert result.returncode == 1 and "stale" in result.stderr, result.stderr


def test_a_pin_removed_but_still_layered_is_refused_naming_the_layer_line(tmp_path):
    recipe = _workspace(tmp_path, lambda t: re.sub(r"^six==.*\n(    --hash=.*\n)+", "", t, count=1, flags=re.M))
    result = _imgfab("lock", "--check", str(recipe))
    number = next(n for n, line in enumerate((tmp_path / f"{RECIPE}.lock").read_text().split("\n"), start=1)
                  if line.startswith("# layer rest-1 "))
    assert result.returncode == 2 and f"{RECIPE}.lock:{number}: layer rest-1 names six" in result.stderr


def test_the_fingerprint_covers_every_line():
    text = (REPO / "recipes" / f"{RECIPE}.lock").read_text()
    from imgfab.matrix.compat import load_matrix
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import resolve

    recipe = load_recipe(REPO / "recipes" / f"{RECIPE}.yaml")
    request = lockmod.payload_request(recipe, resolve(recipe, load_matrix()).stack)
    base = lockmod.lock_fingerprint(request, text)
    assert base == Lock.parse(text).fingerprint
    lines = text.split("\n")
    for number in range(0, len(lines), 37):
        if lines[number].startswith("# fingerprint: "):
            continue
        edited = "\n".join(lines[:number] + [lines[number] + " "] + lines[number + 1:])
        assert lockmod.lock_fingerprint(request, edited) != base, number


@pytest.mark.parametrize("name", ["llama31-8b-l4", "qwen2-7b-h100", "qwen2-7b-h200"])
def test_the_rendered_requirements_hold_only_pins_hashes_and_imgfab_header(name):
    """The golden requirements.lock files: imgfab's own lines and nothing from the lock's header."""
    allowed = re.compile(r"^(# requirements of recipe [a-z0-9-]+, written by imgfab from its lock .*"
                         r"|# serves: [0-9. ]+|# collisions-cut: [A-Za-z0-9_./ -]+"
                         r"|# layer [a-z]+-[0-9]+ \([0-9.]+ [MG]?B\): [a-z0-9 -]+"
                         r"|[a-z0-9-]+==[0-9A-Za-z.+!-]+ \\|    --hash=sha256:[0-9a-f]{64}( \\)?|)$")
    text = (REPO / "tests" / "golden" / name / "requirements.lock").read_text()
    bad = [line for line in text.split("\n") if not allowed.match(line)]
    assert not bad, bad[:3]
    assert "# index:" not in text and "# installer:" not in text


def test_an_unreviewed_collision_path_is_refused_at_build(tmp_path, matrix):
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import resolve

    recipe_path = _workspace(tmp_path, lambda t: t.replace("# collisions-cut: build_backend.py",
                                                           "# collisions-cut: vllm/__init__.py", 1))
    recipe = load_recipe(recipe_path)
    stack = resolve(recipe, matrix).stack
    with pytest.raises(RecipeError, match="collisions-cut"):
        lockmod.load_for_build(str(recipe_path), recipe, stack)


def test_the_committed_lock_still_checks_and_round_trips():
    text = VLLM_0191.with_suffix(".lock").read_text()  # the demo's vLLM 0.19.1 lock, 174 packages
    parsed = Lock.parse(text)
    assert len(parsed.packages) == 174 and parsed.layers()[0] == "venv" and parsed.parsed.collisions


def test_build_with_a_lock_file_refuses_an_unreviewed_collision_path(tmp_path, matrix):
    """``build --lock FILE`` skips the committed lock's header comparison (a lock for another
    platform or index); the builder's file still names only reviewed collision paths."""
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import resolve

    recipe_path = _workspace(tmp_path, lambda t: t)
    text = (REPO / "recipes" / f"{RECIPE}.lock").read_text()
    (tmp_path / "other.lock").write_text(text.replace("# collisions-cut: build_backend.py",
                                                      "# collisions-cut: ../../../../usr/bin/python3", 1))
    (tmp_path / "unreviewed.lock").write_text(text.replace("# collisions-cut: build_backend.py",
                                                           "# collisions-cut: vllm/__init__.py", 1))
    recipe = load_recipe(recipe_path)
    stack = resolve(recipe, matrix).stack
    with pytest.raises(RecipeError, match=r"other\.lock:\d+: the '# collisions-cut:' line names a path outside"):
        lockmod.load_for_build(str(recipe_path), recipe, stack, tmp_path / "other.lock")
    with pytest.raises(RecipeError, match="vllm/__init__.py, which compat/payload.yaml"):
        lockmod.load_for_build(str(recipe_path), recipe, stack, tmp_path / "unreviewed.lock")


@pytest.mark.parametrize("key", ["index", "installer", "serves"])
def test_render_refuses_a_forged_header(tmp_path, key, matrix):
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import resolve

    recipe_path = _workspace(tmp_path, _header_edit(key))
    recipe = load_recipe(recipe_path)
    stack = resolve(recipe, matrix).stack
    with pytest.raises(RecipeError, match=rf"{RECIPE}\.lock:\d+: its '# {key}:' line"):
        lockmod.committed_lock(recipe_path, recipe, stack)
