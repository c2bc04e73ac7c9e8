"""The renderer's escaping filters (issue 12): a value with a line break, carriage return or
NUL never reaches a Dockerfile or a script, and quoted values survive a shell round trip."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgfab.errors import RecipeError
from imgfab.render.context import dockerfile_value, shell_words

from conftest import RECIPES


@pytest.mark.parametrize("bad", ["a\n", "\nRUN id", "a\rb", "a\x00b", "ok\n\n"])
def test_shell_words_refuses_line_breaks_and_nul(bad):
    with pytest.raises(RecipeError):
        shell_words(["vllm", "serve", bad])


@pytest.mark.parametrize("bad", ["a\n", "\nRUN id", "a\rb", "a\x00b"])
def test_dockerfile_value_refuses_line_breaks_and_nul(bad):
    with pytest.raises(RecipeError):
        dockerfile_value(bad)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\n\r\x00"), max_size=30),
                min_size=1, max_size=6))
def test_shell_words_round_trips(argv):
    assert shlex.split(shell_words(argv)) == argv


def test_rendered_files_hold_no_control_characters(matrix):
    from imgfab.recipe import load_recipe
    from imgfab.render.context import render_context
    from imgfab.stack.resolve import resolve

    for path in RECIPES:
        recipe = load_recipe(path)
        files = render_context(recipe, resolve(recipe, matrix).stack, matrix)
        for name, text in files.items():
            bad = {ch for ch in text if ord(ch) < 32 and ch not in "\n\t"}
            assert not bad, (path.name, name, bad)
