"""The one Jinja2 environment every rendered artifact comes from: StrictUndefined, the escaping
filters a caller adds, and compiled templates cached between processes.

Compiling the templates is the largest single cost of a cold ``imgfab render`` (95 ms of 0.5 s
under cProfile, 2026-12-03). Jinja2's :class:`~jinja2.FileSystemBytecodeCache` keys a template by
its name and checks its source's checksum and Jinja2's own magic before it uses the cached code,
so an edited template is compiled again. What it does not key is the environment's options
(``trim_blocks`` and the rest change the compiled code): the cache directory is therefore named
after a digest of those options, and of imgfab's version. The cache lives under
:func:`imgfab.cache.cache_root` (``$IMGFAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/imgfab``); where it cannot
be created, templates are compiled in memory as before, never an error.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2

from imgfab import __version__
from imgfab.cache import cache_root

# The options every environment is made with; their digest names the cache directory.
OPTIONS: dict[str, Any] = {"undefined": jinja2.StrictUndefined, "keep_trailing_newline": True,
                           "trim_blocks": True, "lstrip_blocks": True, "autoescape": False}


def _options_key() -> str:
    described = sorted((name, value.__name__ if isinstance(value, type) else repr(value))
                       for name, value in OPTIONS.items())
    text = f"imgfab {__version__} jinja2 {jinja2.__version__} {described}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    directory = cache_root() / f"jinja-{_options_key()}"
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    if not os.access(directory, os.W_OK | os.X_OK):
        return None
    return jinja2.FileSystemBytecodeCache(str(directory))


def environment(templates: Path, filters: dict[str, Callable[..., Any]]) -> jinja2.Environment:
    """An environment over the ``templates`` directory with ``filters`` and the bytecode cache."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates)),
                             bytecode_cache=_bytecode_cache(), **OPTIONS)
    env.filters.update(filters)
    return env


__all__ = ["OPTIONS", "environment"]
