"""``imgfab lock --check --online``: every pinned hash compared with the index's own.

Offline, ``--check`` proves a lock was not edited since imgfab wrote it, but every input of
its fingerprint is public: a forger can write a consistent lock. Online, each pinned
``name==version`` is looked up on the index compat/payload.yaml names for it (PEP 691 JSON,
or the PEP 503 HTML page's ``#sha256=`` fragments when the index serves no JSON), and each of
its hashes must be one the index lists for a file of exactly that version.

Every request is bounded: a connect and read timeout, an overall deadline (a server trickling
one byte a second is given up on) and a size cap on the body.

Contract: :func:`check_online` — a bound :class:`~imgfab.payload.lockfile.Lock` → the number of
hashes compared, or :class:`~imgfab.errors.RecipeError` (exit 2: a hash or version the index
does not have; the lock must be rewritten) or :class:`~imgfab.errors.NetworkError` (exit 1:
the index did not answer, answered an error, too much or too slowly).
"""

from __future__ import annotations

import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

from imgfab.errors import NetworkError, RecipeError, redact
from imgfab.in_image import stage

MAX_PAGE = 64 * 1024 * 1024  # bytes: torch's page on download.pytorch.org is about 2 MB of HTML
CONNECT_TIMEOUT = 10.0  # seconds per connect
READ_TIMEOUT = 30.0  # seconds per read
DEADLINE = 120.0  # seconds for one page, however it trickles
_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class IndexFile:
    filename: str
    sha256: str


class _Anchors(HTMLParser):
    """The ``<a href>`` of a PEP 503 page: (file name, sha256 from the URL fragment)."""

    def __init__(self) -> None:
        super().__init__()
        self.files: list[IndexFile] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a":
            return
        href = dict(attrs).get("href") or ""
        url = urlsplit(href)
        match = re.fullmatch(r"sha256=([0-9a-f]{64})", url.fragment)
        if match:
            self.files.append(IndexFile(unquote(url.path.rsplit("/", 1)[-1]), match.group(1)))


def _fetch(url: str, *, max_bytes: int, deadline: float) -> tuple[str, bytes]:
    """``(content type, body)`` of ``url``, bounded. NetworkError for anything but 200 or 404
    (404: ``("", b"")``: the index has no such project)."""
    import requests  # noqa: PLC0415

    shown = redact(url)
    started = time.monotonic()
    try:
        with requests.get(url, headers={"Accept": _ACCEPT}, stream=True,
                          timeout=(CONNECT_TIMEOUT, READ_TIMEOUT),
                          verify=os.environ.get("IMGFAB_CA_CERT") or True) as response:
            if response.status_code == 404:
                return "", b""
            if response.status_code != 200:
                raise NetworkError(f"{shown} answered HTTP {response.status_code}", field="lock --online",
                                   fix="check the index, or pass --index-url MIRROR")
            declared = response.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise NetworkError(f"{shown} announced {int(declared)} bytes, over the {max_bytes} a "
                                   "project page may have", field="lock --online", fix="check the index")
            body = bytearray()
            for chunk in response.iter_content(chunk_size=65536):
                body += chunk
                if len(body) > max_bytes:
                    raise NetworkError(f"{shown} sent more than the {max_bytes} bytes a project page may have",
                                       field="lock --online", fix="check the index")
                if time.monotonic() - started > deadline:
                    raise NetworkError(f"{shown} took over {deadline:.0f} s to answer", field="lock --online",
                                       fix="check the network, or pass --index-url MIRROR")
            return response.headers.get("Content-Type", "").split(";")[0].strip(), bytes(body)
    except requests.RequestException as error:
        raise NetworkError(f"{shown} did not answer ({type(error).__name__})", field="lock --online",
                           fix="check the network, or pass --index-url MIRROR") from None


def index_files(index: str, name: str, *, max_bytes: int = MAX_PAGE, deadline: float = DEADLINE) -> list[IndexFile]:
    """The files (name, sha256) the index lists for project ``name``; [] when it has none."""
    url = f"{index.rstrip('/')}/{name}/"
    kind, body = _fetch(url, max_bytes=max_bytes, deadline=deadline)
    if not body:
        return []
    if kind.endswith("json"):
        try:
            data = json.loads(body)
            rows = data["files"] if isinstance(data, dict) else None
            if not isinstance(rows, list):
                raise ValueError("no files list")
            return [IndexFile(str(row["filename"]), str(row["hashes"]["sha256"]))
                    for row in rows if isinstance(row, dict) and isinstance(row.get("hashes"), dict)
                    and isinstance(row["hashes"].get("sha256"), str) and _SHA256.match(row["hashes"]["sha256"])]
        except (ValueError, KeyError, TypeError):
            raise NetworkError(f"{redact(url)} answered JSON that is not a PEP 691 project page",
                               field="lock --online", fix="check the index") from None
    parser = _Anchors()
    parser.feed(body.decode("utf-8", errors="replace"))
    return parser.files


def _version_of(filename: str, name: str) -> str:
    """The version a wheel or sdist file name gives for project ``name`` ("" when it is another's)."""
    for suffix in (".whl", ".tar.gz", ".zip"):
        if filename.endswith(suffix):
            stem = filename[: -len(suffix)]
            break
    else:
        return ""
    parts = stem.split("-") if filename.endswith(".whl") else stem.rsplit("-", 1)
    if len(parts) < 2 or stage.normalize(parts[0]) != name:
        return ""
    return parts[1]


def _same_version(a: str, b: str) -> bool:
    from packaging.version import InvalidVersion, Version  # noqa: PLC0415

    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def check_online(lock, *, index_url: str | None = None, workers: int = 8, max_bytes: int = MAX_PAGE,
                 deadline: float = DEADLINE, source: str = "lock") -> int:
    """Compare every pinned hash of ``lock`` (bound: :meth:`Lock.bind`) with its index's.

    ``index_url`` replaces every index (a mirror). Returns the number of hashes compared."""
    request = lock._bound()
    entries = sorted(lock.parsed.entries, key=lambda e: e.name)

    def one(entry) -> tuple[str, str]:
        index = index_url or request.index_of(entry.name)
        listed = {f.sha256 for f in index_files(index, entry.name, max_bytes=max_bytes, deadline=deadline)
                  if _same_version(_version_of(f.filename, entry.name), entry.version)}
        if not listed:
            return entry.name, f"{entry.name} {entry.version} (line {entry.line}) is not on {redact(index)}"
        unknown = [h for h in entry.hashes if h.split(":", 1)[1] not in listed]
        if unknown:
            return entry.name, (f"{entry.name} {entry.version} (line {entry.line}) pins {unknown[0][:19]}…, "
                                f"which {redact(index)} does not list for that version")
        return entry.name, ""

    with ThreadPoolExecutor(max_workers=workers) as pool:
        problems = [problem for _, problem in pool.map(one, entries) if problem]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RecipeError(f"{source}: {problems[0]}{more}", field="lock --online",
                          fix="run `imgfab lock RECIPE --upgrade` against the real index and review the diff")
    return sum(len(e.hashes) for e in entries)
