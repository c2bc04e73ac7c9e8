"""BuildKit cache specs and builders for ``imgfab build`` and ``imgfab bake`` (issue 37).

A cache spec is what buildx's ``--cache-from`` / ``--cache-to`` take: ``key=value`` pairs
separated by commas, ``type=`` first or anywhere (docs.docker.com/build/cache/backends/). imgfab
passes it to buildx (``build``) or writes it into the bake target (``bake``) after checking it
here, so that a typo is one line at exit 2 instead of a failure minutes into a build:

- the types are ``registry`` (the one a fleet shares: GitHub's ``gha`` cache is capped at 10 GB,
  less than one CUDA image), ``local`` (a directory) and ``inline`` (in the image, ``--cache-to``
  only): the types that need no credentials in buildx's environment. ``gha``, ``s3`` and
  ``azblob`` read tokens from it, which imgfab never passes to docker (:mod:`imgfab.docker.toolenv`);
- a registry cache names its ``ref``, a local one its ``src`` (from) or ``dest`` (to);
- a key that carries a credential (``secret_access_key``, ``session_token``, ``access_key_id``,
  ``token``, ``account_key``) is refused without echoing its value: a spec lands in the process
  list and in the bake file;
- ``{recipe}`` in a spec becomes the recipe's name, so that one spec gives each recipe of a
  fleet its own cache ref; a ``--cache-to`` for several recipes must contain it (two recipes
  exporting to one ref overwrite each other's cache).

A builder is a buildx builder by name (``docker buildx ls``): the ``docker`` driver of a docker
context, or a BuildKit fleet (``remote``, ``kubernetes``, ``docker-container`` drivers).
:func:`builder_driver` asks buildx for its driver. A builder of the ``docker`` driver writes the
image into its engine's store, as the default builder does; any other driver keeps its results
in its own cache, so imgfab's build exports the image to the engine it verifies with
(``type=docker``, the same compression settings: :func:`output_for_driver`).
"""

from __future__ import annotations

import re
import subprocess

from imgfab.errors import EngineError, RecipeError

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


def check_cache_specs(cache_from: tuple[str, ...] | list[str], cache_to: tuple[str, ...] | list[str],
                      recipes: int) -> None:
    """Each spec checked; a ``--cache-to`` shared by several recipes must hold ``{recipe}``."""
    for spec in cache_from:
        check_cache_spec(spec, field="--cache-from")
    for spec in cache_to:
        check_cache_spec(spec, field="--cache-to")
        if recipes > 1 and PLACEHOLDER not in spec and "type=inline" not in spec.split(","):
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


def builder_driver(cli: str, name: str, env: dict[str, str]) -> str:
    """The driver of buildx builder ``name`` (``docker``, ``remote``, ``kubernetes``, …), read
    from ``docker buildx inspect NAME``; EngineError (exit 1) when buildx does not know it."""
    try:
        done = subprocess.run([cli, "buildx", "inspect", check_builder_name(name)], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineError(f"docker buildx inspect {name} did not answer: {type(exc).__name__}",
                          field="--builder", fix="check the docker CLI and its buildx plugin") from None
    driver = next((line.split(":", 1)[1].strip() for line in done.stdout.splitlines()
                   if line.startswith("Driver:")), "")
    if done.returncode != 0 or not driver:
        raise EngineError(f"buildx has no builder {name!r}", field="--builder",
                          fix="create it (docker buildx create --name NAME …) or pick one from "
                              "`docker buildx ls`")
    return driver


def output_for_driver(output: str, driver: str) -> str:
    """The image exporter for a builder of ``driver``: ``output`` (``type=image,…``) on the
    ``docker`` driver, which stores into its engine; ``type=docker,…`` with the same settings on
    any other, which loads the image into the engine imgfab verifies (buildx ``--load``)."""
    if driver == "docker":
        return output
    kind, _, settings = output.partition(",")
    return f"type=docker,{settings}" if kind == "type=image" else output
