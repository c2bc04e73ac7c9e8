"""Where a build comes from: the git checkout a recipe lives in.

:func:`source_of` reads the repository's ``origin`` URL (credentials dropped, scp-like
``git@host:owner/repo`` written as ``https://host/owner/repo``), the ``HEAD`` commit, and the
time the build says it was made: ``SOURCE_DATE_EPOCH`` when set (the reproducible-builds
convention CI sets), else the commit's own time. A fixed input either way, so the same
checkout renders the same bytes. Outside a git checkout (or without git) every field is empty
and the labels are left out.
"""

from __future__ import annotations

import calendar
import os
import re
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path

from imgfab.render.context import Source

_SCP = re.compile(r"^(?:[A-Za-z0-9._-]+@)?([A-Za-z0-9.-]+):(?!//)(.+)$")


def public_url(url: str) -> str:
    """``url`` without credentials, as https for the scp-like form; '' for anything else."""
    url = url.strip()
    scp = _SCP.match(url)
    if scp and "://" not in url:
        return f"https://{scp.group(1)}/{scp.group(2).removesuffix('.git')}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("https", "http", "ssh", "git") or not parts.hostname:
        return ""
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    scheme = "https" if parts.scheme in ("ssh", "git") else parts.scheme
    return urllib.parse.urlunsplit((scheme, host, parts.path.removesuffix(".git"), "", ""))


def iso_time(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _git(directory: Path, *args: str) -> str:
    git = shutil.which("git")
    if git is None:
        return ""
    done = subprocess.run([git, "-C", str(directory), *args], capture_output=True, text=True,
                          timeout=30, check=False,
                          env={k: v for k, v in os.environ.items() if not k.startswith("GIT_")})
    return done.stdout.strip() if done.returncode == 0 else ""


def source_of(recipe_path: str | Path) -> Source:
    """The :class:`Source` of the checkout ``recipe_path`` is in (empty fields outside one).
    A ``SOURCE_DATE_EPOCH`` that is not a whole number is ignored."""
    directory = Path(recipe_path).resolve().parent
    revision = _git(directory, "rev-parse", "HEAD")
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        revision = ""
    url = public_url(_git(directory, "config", "--get", "remote.origin.url")) if revision else ""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    if not epoch.isdigit() and revision:
        epoch = _git(directory, "show", "-s", "--format=%ct", revision)
    created = iso_time(int(epoch)) if epoch.isdigit() else ""
    return Source(url=url, revision=revision, created=created)


def source_epoch(source: Source) -> int:
    """``SOURCE_DATE_EPOCH`` for a build of ``source``: its ``created`` time in seconds, 0 when
    it has none. The image config's and history's times; every layer's files are stamped with
    the epoch itself (0), so a layer depends only on what is in it."""
    return calendar.timegm(time.strptime(source.created, "%Y-%m-%dT%H:%M:%SZ")) if source.created else 0
