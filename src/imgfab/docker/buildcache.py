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

A builder is a buildx builder by name (``docker buildx ls``): a BuildKit fleet (``remote``,
``kubernetes``, ``docker-container`` drivers) or the ``docker`` driver of a docker context.
:func:`builder_driver` asks buildx for its driver. Any driver but ``docker`` keeps its results
in its own cache, so imgfab's build exports the image to the engine it verifies with
(``type=docker``, the same compression settings: :func:`output_for_driver`). A ``docker``-driver
builder is its context's engine, which buildx uses only when that context is the current one
(measured: ``use `docker --context=NAME buildx` to switch``), so only the current context's is
taken (:func:`check_engine_builder`); another is one line at exit 1.
"""

from __future__ import annotations

import subprocess

from imgfab.errors import EngineError

from imgfab.render.cachespec import (PLACEHOLDER, SECRET_KEYS, TYPES_FROM, TYPES_TO,  # noqa: F401
                                     check_builder_name, check_cache_spec, check_cache_specs,
                                     for_recipe)

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


def check_engine_builder(cli: str, name: str, driver: str, env: dict[str, str]) -> None:
    """A ``docker``-driver builder is a docker context's engine: buildx builds on one only when
    that context is the current one (``use `docker --context=NAME buildx` ``, buildx says
    otherwise), and imgfab verifies on the current one. Another context's is EngineError."""
    if driver != "docker":
        return
    done = subprocess.run([cli, "context", "show"], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    current = done.stdout.strip()
    if done.returncode != 0 or current != name:
        raise EngineError(f"builder {name!r} is the engine of docker context {name!r}, not the "
                          f"engine imgfab builds and verifies on (context {current or 'unknown'!r})",
                          field="--builder",
                          fix="point DOCKER_HOST or DOCKER_CONTEXT at that engine, or give a BuildKit "
                              "builder (docker buildx create --driver remote|kubernetes|docker-container)")


def output_for_driver(output: str, driver: str) -> str:
    """The image exporter for a builder of ``driver``: ``output`` (``type=image,…``) on the
    ``docker`` driver, which stores into its engine; ``type=docker,…`` with the same settings on
    any other, which loads the image into the engine imgfab verifies (buildx ``--load``)."""
    if driver == "docker":
        return output
    kind, _, settings = output.partition(",")
    return f"type=docker,{settings}" if kind == "type=image" else output

