"""One valid JSON object, always; no terminal control from an untrusted string (issue 34,
class 6).

Redaction runs over the values of a ``--json`` object before it is serialized, never over the
serialized text, where a secret pattern could cut the backslash of an escaped quote
(``password=\\"``) and leave invalid JSON. Every string printed for a person goes through
:func:`imgfab.errors.printable`: a recipe's file name, a registry's tags and labels, a model id,
bake's progress line. The expected texts are written out by hand.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from conftest import FROZEN_COMPAT, FROZEN_RECIPES, REPO

from imgfab.errors import RecipeError, printable, redact, redact_values
from imgfab.output import document, dumps
from imgfab.progress import Progress

sys.path.insert(0, str(REPO / "tests" / "ops"))
from test_select_doctor import _labels  # noqa: E402
from test_select_hostile import _image, _Registry  # noqa: E402

SECRET = "S3CRET"
HOSTILE_NAME = "a\x1b[31mred\r.yaml"  # an escape sequence and a carriage return


def _imgfab(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from imgfab.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def _raw_controls(text: str) -> list[str]:
    """Every character a terminal would act on, tab and newline aside."""
    return [ch for ch in text if (ord(ch) < 32 and ch not in "\t\n") or 0x7f <= ord(ch) <= 0x9f]


# --- redaction of values -----------------------------------------------------------------

# (a value as a recipe or a registry may carry it, the value the JSON object must hold)
SECRET_VALUES = [
    (f'password="{SECRET}\\"y', "password=***"),
    (f"unknown GPU 'password=\"{SECRET}\\\\\"y'", "unknown GPU 'password=***'"),
    (f'api_key="{SECRET}\\" and more', "api_key=***"),
    (f"token='{SECRET}\\'s' rest", "token=*** rest"),
    (f'--password=\\"{SECRET}\\" x', "--password=*** x"),
    (f'https://u:p\\"{SECRET}@registry.example/v2/', "https://u:***@registry.example/v2/"),
    (f'alice:{SECRET}"\\@pypi.corp.example/simple', "alice:***@pypi.corp.example/simple"),
    (f'Authorization: Bearer {SECRET}xyz"\\', 'Authorization: Bearer ***"\\'),
]


@pytest.mark.parametrize("value, redacted", SECRET_VALUES)
def test_a_secret_with_quotes_and_backslashes_leaves_one_valid_json_object(value, redacted):
    doc = document("validate", exit_code=2, error={"message": value, "line": value},
                   recipes=[{"path": value, value: [value]}])
    parsed = json.loads(dumps(doc))
    assert parsed["error"] == {"message": redacted, "line": redacted}
    assert parsed["recipes"] == [{"path": redacted, redacted: [redacted]}]
    assert SECRET not in dumps(doc)


def test_redact_values_walks_every_container_and_stringifies_the_rest():
    value = {"a": (f"password={SECRET}", 1, 2.5, True, None), "b": {"c": [Path(f"/x/token={SECRET}")]}}
    assert redact_values(value) == {"a": ["password=***", 1, 2.5, True, None], "b": {"c": ["/x/token=***"]}}


def test_a_built_image_s_json_is_redacted_value_by_value():
    """An unterminated quoted secret: redacted over serialized text, it would take the rest of
    the object with it."""
    from imgfab.docker.build import BuiltImage

    built = BuiltImage(recipe="r", context="c", image_id="sha256:1", tags=[f"x token='{SECRET}"],
                       size_bytes=1, duration_s=1.0, steps=1, cached_steps=0, cached_by_stage={},
                       base_images={"b": f'https://u:{SECRET}"@h/i'}, verify={})
    shown = built.to_dict()
    assert shown["tags"] == ["x token=***"] and shown["base_images"] == {"b": "https://u:***@h/i"}


def _recipe(tmp_path: Path, name: str, **changes) -> Path:
    """A frozen qwen2-7b-h100 recipe with ``changes`` (section -> fields), written as ``name``."""
    data = yaml.safe_load((FROZEN_RECIPES / "qwen2-7b-h100.yaml").read_text())
    for section, fields in changes.items():
        data[section] |= fields
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_validate_json_stays_one_valid_object_with_the_secret_redacted(tmp_path):
    recipe = _recipe(tmp_path, "r.yaml", target={"gpu": f'password="{SECRET}\\"y'})
    result = _imgfab("validate", "--json", str(recipe), "--compat-dir", str(FROZEN_COMPAT))
    assert result.returncode == 2
    (error,) = json.loads(result.stdout)["recipes"][0]["errors"]
    assert error["field"] == "target.gpu"
    assert error["message"] == "unknown GPU 'password=***'"
    assert SECRET not in result.stdout + result.stderr


@pytest.fixture
def registry(matrix):
    """The hostile registry: one good image, one whose driver floor label is an escape sequence
    around a quoted password."""
    _Registry.manifests.clear()
    good = _labels(matrix, "qwen2-7b-h100")
    _image("good", json.dumps({"config": {"Labels": good}}).encode())
    hostile = {**good, "org.imgfab.driver.floor": f'\x1b[31m password="{SECRET}\\"y\x1b[0m\r'}
    _image("hostile", json.dumps({"config": {"Labels": hostile}}).encode())
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}/llm/x"
    server.shutdown()
    server.server_close()
    _Registry.manifests.clear()


def _select(repository: str, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMGFAB_", "DOCKER_"))}
    env["DOCKER_CONFIG"] = str(tmp_path)
    return _imgfab("select", "--registry", repository, "--driver", "999.1.1", "--gpu", "H100-SXM",
                   *flags, env=env)


def test_select_json_stays_one_valid_object_with_the_registry_s_secret_redacted(registry, tmp_path):
    result = _select(registry, tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    candidates = {c["tag"]: c for c in json.loads(result.stdout)["candidates"]}
    assert candidates["hostile"]["fits"] is False
    assert candidates["hostile"]["reason"] == ("labels: unreadable org.imgfab labels: not a dotted "
                                               "numeric version: '\\x1b[31m password=***'")
    assert SECRET not in result.stdout + result.stderr


def test_select_explain_prints_the_registry_s_text_without_controls(registry, tmp_path):
    result = _select(registry, tmp_path, "--explain")
    assert result.returncode == 0, result.stderr
    assert not _raw_controls(result.stdout + result.stderr)
    assert any(line.startswith("- hostile: ") for line in result.stdout.splitlines())


# --- terminal text -----------------------------------------------------------------------

@pytest.mark.parametrize("text, shown", [
    ("recipes/a\x1b[31mred\x1b[0m\r.yaml", "recipes/ared.yaml"),
    ("title\x1b]0;owned\x07 and \x1b]8;;http://x\x1b\\link", "title and link"),
    ("bell\x07 back\x08space del\x7f c1\x9b31m nul\x00", "bell backspace del c131m nul"),
    ("charset \x1b(Bok, alone at the end\x1b", "charset ok, alone at the end"),
    ("tab\tand\nnewline stay", "tab\tand\nnewline stay"),
    ("plain: qwen2-7b-h100.yaml, ünïcode ✓", "plain: qwen2-7b-h100.yaml, ünïcode ✓"),
])
def test_printable_removes_escape_sequences_and_controls(text, shown):
    assert printable(text) == shown


def _hostile_recipe_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / HOSTILE_NAME).write_bytes((FROZEN_RECIPES / "qwen2-7b-h100.yaml").read_bytes())
    return folder


def test_list_prints_a_hostile_file_name_without_its_controls(tmp_path):
    folder = _hostile_recipe_dir(tmp_path)
    result = _imgfab("list", str(folder), "--compat-dir", str(FROZEN_COMPAT))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (f"{folder}/ared.yaml: Qwen/Qwen2-7B-Instruct on H100-SXM, vllm, fp8; "
                             "lock missing\n")


def test_validate_prints_a_hostile_file_name_without_its_controls(tmp_path):
    folder = _hostile_recipe_dir(tmp_path)
    result = _imgfab("validate", str(folder / HOSTILE_NAME), "--compat-dir", str(FROZEN_COMPAT))
    assert result.returncode == 0, result.stderr
    # the file's line, then what validate says of it (the frozen recipe accepts an advisory)
    assert result.stdout.startswith(f"{folder}/ared.yaml: ok\n")
    assert not _raw_controls(result.stdout)


def test_validate_prints_a_hostile_model_id_in_one_clean_line(tmp_path):
    recipe = _recipe(tmp_path, "r.yaml", model={"id": "org/\x1b[2Jname\r"})
    result = _imgfab("validate", str(recipe), "--compat-dir", str(FROZEN_COMPAT))
    assert result.returncode == 2
    assert not _raw_controls(result.stdout + result.stderr)
    assert result.stderr.count("\n") == 1


def test_bake_s_progress_line_prints_a_hostile_file_name_without_its_controls(tmp_path):
    folder = tmp_path / "recipes"  # the shipped recipe and its committed lock, which bake needs
    folder.mkdir()
    (folder / HOSTILE_NAME).write_bytes((REPO / "recipes" / "qwen2-7b-h100.yaml").read_bytes())
    (folder / "qwen2-7b-h100.lock").write_bytes((REPO / "recipes" / "qwen2-7b-h100.lock").read_bytes())
    result = _imgfab("bake", str(folder / HOSTILE_NAME), "-o", str(tmp_path / "bake.json"))
    assert not _raw_controls(result.stdout + result.stderr), repr(result.stderr)
    assert "bake: rendered: 1/1 ared.yaml\n" in result.stderr, result.stderr


def test_progress_escapes_rich_markup_and_drops_controls():
    from rich.text import Text

    with Progress("rich", stream=io.StringIO()) as progress:
        progress.item("bake: rendered", 1, 1, "[red]x\x1b[31m.yaml")
        assert Text.from_markup(progress._status.status).plain == "bake: rendered: 1/1 [red]x.yaml"
    out = io.StringIO()
    Progress("plain", stream=out).item("bake: rendered", 1, 1, "x\x1b[31m\r.yaml")
    assert out.getvalue().endswith("] bake: rendered: 1/1 x.yaml\n")


def test_the_cli_s_one_line_error_quoting_a_hostile_name_has_no_controls(tmp_path):
    result = _imgfab("validate", str(tmp_path / HOSTILE_NAME))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and not _raw_controls(result.stderr), repr(result.stderr)


def test_an_internal_error_s_line_has_no_controls(tmp_path):
    program = ("import sys, imgfab.cli as cli\n"
               "def boom(*a, **k):\n    raise ValueError('bad \\x1b[31mvalue\\r')\n"
               "import imgfab.recipe\nimgfab.recipe.load_recipe = boom\n"
               "sys.argv = ['imgfab', 'validate', 'x.yaml']\ncli.main()\n")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr == ("imgfab: internal error: ValueError: bad value (run with --debug for "
                             "the traceback)\n")


def test_a_redacted_error_line_is_still_one_line():
    assert RecipeError(f'password="{SECRET}\\"\nx', field="f").one_line() == "f: password=***"
    assert redact(f"x password='{SECRET}") == "x password=***"


def test_resolve_s_report_prints_its_lines_without_controls(capsys):
    from dataclasses import replace

    from imgfab.matrix.compat import load_matrix
    from imgfab.recipe import load_recipe
    from imgfab.report import print_resolution
    from imgfab.stack.resolve import resolve

    resolution = resolve(load_recipe(FROZEN_RECIPES / "qwen2-7b-h100.yaml"), load_matrix(FROZEN_COMPAT))
    print_resolution(replace(resolution, stack=replace(resolution.stack, notes=("from \x1b[31mred\r weights",))))
    out = capsys.readouterr().out
    assert "note: from red weights\n" in out and not _raw_controls(out)


def test_the_build_log_prints_the_engine_s_lines_without_controls(capsys):
    from imgfab.docker.build import BuildProgress

    with BuildProgress("qwen2-7b-h100", rich_ui=False) as log:
        log.line(f"#5 [2/3] RUN \x1b[31mecho\r --password={SECRET}")
    assert capsys.readouterr().err == "#5 [2/3] RUN echo --password=***\n"
