"""Secrets on the way into a build (issue 12): the docker child gets a scrubbed environment,
the pip-source fingerprint is keyed (not a bare hash of pip.conf), pip.conf is written by a
serializer that refuses line breaks, passwords in URLs are redacted from every message and
``--json`` report, and ``image.registry`` is used.

The engine is a stand-in at its edge: a fake docker CLI script, or ``engine.build`` replaced
by a recorder that stops the build once it has seen what docker would be given.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from imgfab.docker import build as build_module
from imgfab.docker import engine
from imgfab.docker.build import BuildOptions, BuiltImage, build_recipe
from imgfab.errors import EngineError, RecipeError

from conftest import RECIPES

RECIPE = next(p for p in RECIPES if p.name == "qwen2-7b-h100.yaml")
PASSWORD = "hunter2-Pa55word"


def test_docker_child_environment_is_scrubbed(tmp_path, monkeypatch):
    dump = tmp_path / "env.txt"
    fake = tmp_path / "docker"
    fake.write_text(f"#!/bin/sh\nenv > {dump}\necho '--secret'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("IMGFAB_DOCKER_CLI", str(fake))
    monkeypatch.setenv("IMGFAB_REGISTRY_PASSWORD", PASSWORD)
    monkeypatch.setenv("IMGFAB_PIP_INDEX_URL", f"https://u:{PASSWORD}@idx/simple")
    monkeypatch.setenv("SOME_API_TOKEN", PASSWORD)
    engine.docker_cli()
    seen = dump.read_text()
    assert PASSWORD not in seen
    assert "DOCKER_BUILDKIT=1" in seen and "PATH=" in seen


class _Stop(Exception):
    pass


@pytest.fixture
def recorder(monkeypatch, tmp_path):
    """Replace engine.build: record its arguments and the pip.conf it is handed, then stop."""
    seen: dict = {}

    def fake_build(context, *, tags, build_args, secrets, network, on_line, no_cache=False, **_):
        seen.update(tags=list(tags), build_args=dict(build_args))
        if "pip-conf" in secrets:
            path = Path(secrets["pip-conf"])
            seen["pip_conf"] = path.read_bytes()
            seen["pip_conf_mode"] = stat.S_IMODE(path.stat().st_mode)
        raise EngineError("stopped by the test")

    monkeypatch.setattr(engine, "build", fake_build)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("IMGFAB_PIP_TIMEOUT", "IMGFAB_PIP_RETRIES", "IMGFAB_REGISTRY"):
        monkeypatch.delenv(name, raising=False)
    return seen


def _build(tmp_path, recipe=RECIPE, **options):
    with pytest.raises(EngineError, match="stopped by the test"):
        build_recipe(str(recipe), BuildOptions(**options), context_dir=tmp_path / "ctx")


def test_pip_source_fingerprint_is_keyed_and_pip_conf_is_private(tmp_path, recorder):
    _build(tmp_path, pip_index_url=f"https://ci:{PASSWORD}@pypi.corp.example/simple")
    fingerprint = recorder["build_args"]["IMGFAB_PIP_SOURCE"]
    conf = recorder["pip_conf"]
    assert PASSWORD.encode() in conf
    assert fingerprint != hashlib.sha256(conf).hexdigest()[:16], "a bare hash can be guessed"
    assert recorder["pip_conf_mode"] == 0o600
    key = tmp_path / "cache" / "imgfab" / "pip-source.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    _build(tmp_path, pip_index_url=f"https://ci:{PASSWORD}@pypi.corp.example/simple")
    assert recorder["build_args"]["IMGFAB_PIP_SOURCE"] == fingerprint, "stable per cache"
    _build(tmp_path, pip_index_url="https://ci:other@pypi.corp.example/simple")
    assert recorder["build_args"]["IMGFAB_PIP_SOURCE"] != fingerprint, "changes with the index"


@pytest.mark.parametrize("url", [
    "https://pypi.example/simple\n[global]\nindex-url = https://evil.example/simple",
    "https://pypi.example/simple\rtrusted-host = evil.example",
    "https://pypi.example/simple\x00",
    "https://pypi.example/simple extra-index-url = https://evil.example",
])
def test_pip_conf_lines_cannot_be_injected(tmp_path, recorder, url):
    with pytest.raises(RecipeError) as caught:
        build_recipe(str(RECIPE), BuildOptions(pip_index_url=url), context_dir=tmp_path / "ctx")
    assert caught.value.field == "--pip-index-url"
    assert "pip_conf" not in recorder, "nothing reached docker"


def test_pip_settings_from_the_environment_are_numbers(tmp_path, recorder, monkeypatch):
    monkeypatch.setenv("IMGFAB_PIP_TIMEOUT", "5\nindex-url = https://evil.example")
    with pytest.raises(RecipeError):
        build_recipe(str(RECIPE), BuildOptions(pip_index_url="https://pypi.example/simple"),
                     context_dir=tmp_path / "ctx")
    assert "pip_conf" not in recorder


def test_bad_pip_index_url_error_never_shows_the_password(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "from imgfab.cli import main; main()", "build", str(RECIPE),
         "--pip-index-url", f"ftp://ci:{PASSWORD}@pypi.corp.example/simple"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("IMGFAB_")})
    assert result.returncode == 2, result.stderr
    assert PASSWORD not in result.stderr + result.stdout
    assert result.stderr.count("\n") == 1


def test_json_report_and_messages_are_redacted():
    built = BuiltImage(recipe="r", context="c", image_id="i", tags=[], size_bytes=0,
                       duration_s=0.0, steps=0, cached_steps=0, cached_by_stage={},
                       base_images={}, verify={"notes": [f"pip from https://u:{PASSWORD}@h/s"]},
                       notes=[f"Looking in indexes: https://u:{PASSWORD}@h/simple"])
    text = json.dumps(built.to_dict())
    assert PASSWORD not in text and "https://u:***@h/simple" in text
    error = RecipeError(f"cannot reach https://u:{PASSWORD}@h/simple", field="x")
    assert PASSWORD not in error.one_line()


def test_build_log_lines_are_redacted(capsys):
    progress = build_module.BuildProgress("r", rich_ui=False)
    progress.line(f"#5 0.1 Looking in indexes: https://ci:{PASSWORD}@pypi.corp.example/simple")
    assert PASSWORD not in capsys.readouterr().err


def test_image_registry_of_the_recipe_is_used(tmp_path, recorder, monkeypatch):
    data = yaml.safe_load(RECIPE.read_text())
    data = copy.deepcopy(data)
    data["image"]["registry"] = "registry.example:5000"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(data))
    lock = RECIPE.with_name(f"{data['name']}.lock")  # the payload lock sits next to its recipe
    (tmp_path / lock.name).write_text(lock.read_text())
    _through_verify(monkeypatch, recorder)
    _build(tmp_path, recipe=recipe)
    assert any(t.startswith("registry.example:5000/") for t in recorder["tags"]), recorder["tags"]
    _build(tmp_path, recipe=recipe, registry="other.example")
    assert not any(t.startswith("registry.example:5000/") for t in recorder["tags"])


def _through_verify(monkeypatch, recorder):
    """The build passes verify and the payload check; the tags it gives the verified image
    (engine.add_labels) are recorded, then it stops."""
    from types import SimpleNamespace

    from imgfab.docker import verify
    from imgfab.payload import measure

    def labelled(image, labels, tags, **_):
        recorder["tags"] = list(tags)
        raise EngineError("stopped by the test")

    monkeypatch.setattr(engine, "build", lambda *a, **k: engine.BuildResult("sha256:" + "a" * 64, 1.0))
    monkeypatch.setattr(build_module, "_base_diff_ids", lambda ref: ())
    monkeypatch.setattr(verify, "verify_image", lambda ref, policy: SimpleNamespace(notes=[]))
    monkeypatch.setattr(measure, "check_image", lambda *a, **k: SimpleNamespace(labels={}, notes=[]))
    monkeypatch.setattr(engine, "add_labels", labelled)


@pytest.mark.parametrize("url", ["https://pypi.example/simple\n", "https://pypi.example/\rsimple",
                                 "https://pypi.example/sim\tple", "https://pypi.example/\x1b[2Jsimple",
                                 "https://pypi.example/simple\x00", "file:///etc/passwd", "https:///simple"])
def test_index_url_check_refuses_control_characters_and_non_http(url):
    with pytest.raises(RecipeError) as caught:
        build_module.check_pip_index_url(url)
    assert caught.value.field == "--pip-index-url"


@pytest.mark.parametrize("settings", [{"index-url": "https://a/simple\n[global]"},
                                      {"index-url": "https://a/simple\rx"},
                                      {"timeout": "5\x00"}, {"index-url": " https://a/simple"},
                                      {"bad key": "1"}, {"[global]\nx": "1"}])
def test_pip_conf_serializer_refuses_what_would_start_another_line(settings):
    with pytest.raises(RecipeError):
        build_module.pip_conf_text(settings)


def test_pip_conf_serializer_writes_one_line_per_setting():
    text = build_module.pip_conf_text({"index-url": "https://u:p@a/simple", "timeout": "5"})
    assert text == "[global]\nindex-url = https://u:p@a/simple\ntimeout = 5\n"
