"""BuildKit cache specs as ``imgfab build`` passes them to buildx and ``imgfab bake`` writes
them into each target (issue 37). Pure: :mod:`imgfab.docker.buildcache` says why each rule.

A spec is ``key=value`` pairs separated by commas (docs.docker.com/build/cache/backends/):
``registry``, ``local`` and ``inline`` (to only) are passed; a registry cache names its
``ref``, a local one its ``src``/``dest``; a credential key is refused without its value;
``{recipe}`` becomes the recipe's name, and a ``--cache-to`` for several recipes must hold it.
"""

from __future__ import annotations

import re

from imgfab.errors import RecipeError

TYPES_FROM = ("registry", "local")
TYPES_TO = ("registry", "local", "inline")
SECRET_KEYS = ("secret_access_key", "session_token", "access_key_id", "token", "account_key")
PLACEHOLDER = "{recipe}"
_KEY = re.compile(r"[a-z][a-z0-9_-]{0,39}")
# A value: what a registry ref, a path or a mode needs; no comma, quote, space or control.
_VALUE = re.compile(r"[A-Za-z0-9._:/@+{}=-]{1,300}")
_BUILDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
SPEC_FIX = ("give TYPE and its settings as KEY=VALUE pairs separated by commas, e.g. "
            "type=registry,ref=registry.example/team/cache:{recipe},mode=max")


def check_cache_spec(spec: str, *, field: str) -> str:
    """``spec`` when it is a cache spec imgfab passes on (see the module), else RecipeError
    naming ``field`` (``--cache-from`` / ``--cache-to``) and the first thing that is wrong."""
    types = TYPES_TO if field == "--cache-to" else TYPES_FROM
    pairs: dict[str, str] = {}
    for part in spec.split(","):
        key, equals, value = part.partition("=")
        if not equals or not _KEY.fullmatch(key):
            raise RecipeError(f"cache spec part {len(pairs) + 1} is not KEY=VALUE", field=field,
                              fix=SPEC_FIX)
        if key in SECRET_KEYS:
            raise RecipeError(f"cache spec key {key!r} carries a credential, which would reach the "
                              "process list and the bake file", field=field,
                              fix="use a registry cache: the engine logs in with docker login's "
                                  "credentials")
        if not _VALUE.fullmatch(value):
            raise RecipeError(f"cache spec key {key!r}: its value is empty, over 300 characters or "
                              "holds a character outside [A-Za-z0-9._:/@+{}=-]", field=field,
                              fix=SPEC_FIX)
        if key in pairs:
            raise RecipeError(f"cache spec key {key!r} is given twice", field=field, fix=SPEC_FIX)
        pairs[key] = value
    kind = pairs.get("type")
    if kind not in types:
        raise RecipeError(f"cache type {kind!r} is not one imgfab passes to buildx" if kind
                          else "the cache spec names no type=", field=field,
                          fix=f"type={' or type='.join(types)} (gha, s3 and azblob read tokens "
                              "from buildx's environment, which imgfab does not pass)")
    needed = {"registry": "ref", "local": "dest" if field == "--cache-to" else "src"}.get(kind)
    if needed and needed not in pairs:
        raise RecipeError(f"a {kind} cache names its {needed}=", field=field, fix=SPEC_FIX)
    return spec


def spec_settings(spec: str) -> dict[str, str]:
    """``{key: value}`` of a spec :func:`check_cache_spec` accepted (``type``, ``ref``, …)."""
    return dict(part.partition("=")[::2] for part in spec.split(","))


def check_cache_specs(cache_from: tuple[str, ...] | list[str], cache_to: tuple[str, ...] | list[str],
                      recipes: int) -> None:
    """Each spec checked; a ``--cache-to`` shared by several recipes must hold ``{recipe}``."""
    for spec in cache_from:
        check_cache_spec(spec, field="--cache-from")
    for spec in cache_to:
        check_cache_spec(spec, field="--cache-to")
        if recipes > 1 and PLACEHOLDER not in spec and spec_settings(spec).get("type") != "inline":
            raise RecipeError(f"one --cache-to for {recipes} recipes: each would overwrite the "
                              "cache the others exported", field="--cache-to",
                              fix=f"put {PLACEHOLDER} in the ref, e.g. "
                                  "type=registry,ref=registry.example/cache:{recipe},mode=max")


def for_recipe(specs: tuple[str, ...] | list[str], name: str) -> list[str]:
    """``specs`` with ``{recipe}`` replaced by the recipe's ``name``."""
    return [spec.replace(PLACEHOLDER, name) for spec in specs]


def check_builder_name(name: str) -> str:
    """A buildx builder name (``[A-Za-z0-9._-]``), else RecipeError."""
    if not _BUILDER.fullmatch(name):
        raise RecipeError("the builder name is not [A-Za-z0-9._-] starting with a letter or digit",
                          field="--builder", fix="give a name `docker buildx ls` lists")
    return name
