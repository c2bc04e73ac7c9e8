"""Defaults a user meets outside this repository (issue 23): the served model name clients
expect, and no message that points at a script only this repository has."""

from __future__ import annotations

import ast

import yaml

from conftest import REPO

SRC = REPO / "src" / "imgfab"


def _recipe(**serve):
    from imgfab.recipe import parse_recipe

    data = yaml.safe_load((REPO / "recipes/qwen2-7b-h100.yaml").read_text())
    data["serve"].pop("served_model_name", None)
    data["serve"].update(serve)
    return parse_recipe(data)


def test_vllm_serves_the_model_id_by_default(matrix):
    from imgfab.render.context import serve_commands
    from imgfab.stack.resolve import resolve

    recipe = _recipe()
    for argv in serve_commands(recipe, resolve(recipe, matrix).stack).values():
        assert argv[argv.index("--served-model-name") + 1] == recipe.model.id
    named = _recipe(served_model_name="qwen2-7b")
    for argv in serve_commands(named, resolve(named, matrix).stack).values():
        assert argv[argv.index("--served-model-name") + 1] == "qwen2-7b"


def test_the_schema_says_what_the_served_name_defaults_to():
    from imgfab.recipe import recipe_json_schema

    schema = recipe_json_schema()
    serve = next(d for n, d in schema.get("$defs", {}).items() if n == "ServeSpec")
    assert "model id" in serve["properties"]["served_model_name"]["description"]


def _strings_outside_docstrings(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_message_sends_users_to_a_script_of_this_repository():
    """doctor and the engine, registry, oras and cosign errors once said `scripts/local-stack.sh
    up`, which an installed imgfab does not have (the flag-table extractor, a matrix
    maintainer's tool, is named only after the user's own fix)."""
    found = [f"{p.relative_to(REPO)}:{line}" for p in sorted(SRC.rglob("*.py"))
             for line, text in _strings_outside_docstrings(p) if "local-stack" in text]
    assert not found, found

