"""Registry credentials for the registry tools imgfab runs (cosign, oras): a private Docker
config, never a password on a command line.

:func:`private_docker_config` writes ``config.json`` with one ``auths`` entry per
:class:`imgfab.docker.credentials.Credentials` (mode 0600, in a fresh temporary directory,
removed afterwards) and yields that directory, for ``DOCKER_CONFIG`` (cosign) or
``--from/--to-registry-config`` (oras). Anonymous credentials add nothing; with none at all
the caller's own Docker config stays in force.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def private_docker_config(*credentials: Any) -> Iterator[Path | None]:
    """A directory holding ``config.json`` for ``credentials``; ``None`` when all are anonymous."""
    auths = {}
    for entry in credentials:
        if entry is None or entry.anonymous:
            continue
        if entry.identity_token:
            auths[entry.registry] = {"identitytoken": entry.identity_token}
        else:
            auths[entry.registry] = {"auth": base64.b64encode(
                f"{entry.username}:{entry.password}".encode()).decode()}
    if not auths:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="imgfab-auth-") as directory:
        config = Path(directory) / "config.json"
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump({"auths": auths}, handle)
        yield Path(directory)
