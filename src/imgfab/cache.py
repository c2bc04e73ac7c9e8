"""Where imgfab keeps what it can compute again: one root for every cache.

``$IMGFAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/imgfab``, else ``~/.cache/imgfab``. Under it:
``jinja-<key>/`` (compiled templates, :mod:`imgfab.render.templating`), ``verify/`` (per-layer
scan results, :mod:`imgfab.docker.verify`), ``wheels/`` (members read from remote wheels,
:mod:`imgfab.matrix.wheelzip`) and ``pip-source.key`` (:func:`imgfab.docker.build.pip_source_key`).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$IMGFAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/imgfab``, else ``~/.cache/imgfab`` (an empty
    variable counts as unset). Only the path: each cache makes its own directory when it writes."""
    if os.environ.get("IMGFAB_CACHE_DIR"):
        return Path(os.environ["IMGFAB_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "imgfab"


__all__ = ["cache_root"]
