"""Every rejected value is redacted before it is printed, whatever its shape (issue 21): a URL
without a scheme (``alice:S3CRET@host``), a raw ``@`` inside a password, a token as a URL's user
name, a ``?token=`` query, a Bearer credential; and a value cut for length is redacted first.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from imgfab.docker import build as build_module
from imgfab.errors import RecipeError, RegistryError, redact
from imgfab.recipe import excerpt

from conftest import RECIPES

RECIPE = next(p for p in RECIPES if p.name == "qwen2-7b-h100.yaml")
SECRET = "S3CRET-hunter2"


@pytest.mark.parametrize("text", [
    f"alice:{SECRET}@pypi.corp.example/simple",
    f"'alice:{SECRET}@pypi.corp.example/simple' is not an http(s) URL",
    f"--pip-index-url=alice:{SECRET}@10.0.0.1:8080/simple",
    f"https://alice:p@{SECRET}@pypi.corp.example/simple",
    f"https://ghp_{SECRET}0123456789@github.com/o/r.git",
    f"https://h/v2/token?scope=repository:a:pull&access_token={SECRET}&x=1",
    f"https://bucket.s3.example/blob?X-Amz-Signature={SECRET}",
    f"cannot log in with --password={SECRET}",
    f"Authorization: Bearer {SECRET}.eyJzdWIiOiJ4In0",
])
def test_every_shape_of_secret_is_redacted(text):
    assert SECRET not in redact(text)
    assert SECRET not in RecipeError(text, field="x").one_line()


@pytest.mark.parametrize("text", [
    "busybox:1.36@sha256:" + "a" * 64,
    "127.0.0.1:5000/llm/x:v1@sha256:" + "b" * 64,
    "registry 127.0.0.1:5000 refused the credentials for user u (401)",
    "ssh://git@github.com/o/r",
    'Basic realm="registry"',
])
def test_what_is_no_secret_is_left_alone(text):
    assert redact(text) == text


def test_the_issues_scheme_less_index_url_is_refused_without_its_password():
    with pytest.raises(RecipeError) as caught:
        build_module.check_pip_index_url(f"alice:{SECRET}@pypi.corp.example/simple")
    line = caught.value.one_line()
    assert caught.value.field == "--pip-index-url" and SECRET not in line
    assert "alice:***@pypi.corp.example" in line


def test_a_long_value_is_redacted_before_it_is_cut():
    url = "alice:" + "P" * 400 + "@pypi.corp.example/simple"
    with pytest.raises(RecipeError) as caught:
        build_module.check_pip_index_url(url)
    assert "PPPP" not in caught.value.one_line()
    assert "PPPP" not in excerpt("https://u:" + "P" * 400 + "@h/simple")


def test_registry_errors_are_redacted_too():
    error = RegistryError(f"token server h answered for ci:{SECRET}@registry.corp.example")
    assert SECRET not in error.one_line()


def test_build_cli_refuses_a_scheme_less_index_url_in_one_line_without_the_password(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "from imgfab.cli import main; main()", "build", str(RECIPE),
         "--pip-index-url", f"alice:{SECRET}@pypi.corp.example/simple"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("IMGFAB_")})
    assert result.returncode == 2, result.stderr
    assert SECRET not in result.stderr + result.stdout
    assert result.stderr.count("\n") == 1
