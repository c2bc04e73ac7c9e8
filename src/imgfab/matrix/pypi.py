"""Reading PyPI: the project JSON, one wheel's core metadata (PEP 658 .metadata, else METADATA
read from the wheel by HTTP range requests, else a small sdist's PKG-INFO), and the pure
parsing of what comes back (Requires-Dist, release files, wheel tags). The only network I/O of
`imgfab compat refresh` besides the wheels' GPU code (imgfab.matrix.wheels).
"""

from __future__ import annotations

import io
import re
import tarfile
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from typing import Any, Iterable
from urllib.parse import urljoin

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import parse_wheel_filename

from imgfab.errors import NetworkError


# Requirement markers are evaluated for the platform imgfab builds: Linux x86_64, CPython 3.12.
LINUX_X86_64 = {
    "os_name": "posix", "sys_platform": "linux", "platform_system": "Linux",
    "platform_machine": "x86_64", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "python_version": "3.12",
    "python_full_version": "3.12.0", "extra": "",
}
PYPI_PROJECT_URL = "https://pypi.org/pypi/{project}/json"


PYPI_RELEASE_PAGE = "https://pypi.org/project/{project}/{version}/"


TIMEOUT_S = 30


MAX_SDIST_BYTES = 8 * 1024 * 1024  # wheel-stub sdists (tensorrt, tensorrt-llm) are < 1 MB


# The index a torch row comes from. Rows from any other index (the PyTorch cu130 index that
# TensorRT-LLM 1.2 asks for) cannot be read from PyPI; refresh keeps them as they are.
PYPI_INDEX = "https://pypi.org/simple"


def _session():
    import requests  # imported here: `imgfab --help` stays fast

    return requests


def fetch_json(url: str) -> dict:
    """GET ``url`` and decode JSON. Raises NetworkError on any transport or HTTP failure."""
    requests = _session()
    try:
        response = requests.get(url, timeout=TIMEOUT_S)
        response.raise_for_status()
        return response.json()
    except (requests.RequestException, ValueError) as exc:
        raise NetworkError(f"could not read {url}: {exc}", field="pypi",
                           fix="check the network or proxy and run `imgfab compat refresh` again") from None


def fetch_metadata(url: str, filename: str) -> str:
    """Core metadata text of the distribution file at ``url``.

    Wheels: the PEP 658 ``<url>.metadata`` file, else ``*.dist-info/METADATA`` read from the
    wheel with HTTP range requests (never the whole wheel). Sdists: ``PKG-INFO`` from the
    tarball, refused above MAX_SDIST_BYTES. Raises NetworkError.
    """
    requests = _session()
    try:
        if filename.endswith(".whl"):
            response = requests.get(url + ".metadata", timeout=TIMEOUT_S)
            if response.status_code == 200:
                return response.content.decode("utf-8")
            with zipfile.ZipFile(_HttpRangeFile(url, requests)) as wheel:
                name = next(n for n in wheel.namelist()
                            if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
                return wheel.read(name).decode("utf-8")
        response = requests.get(url, timeout=TIMEOUT_S, stream=True)
        response.raise_for_status()
        data = response.raw.read(MAX_SDIST_BYTES + 1, decode_content=True)
        if len(data) > MAX_SDIST_BYTES:
            raise NetworkError(f"{filename} is larger than {MAX_SDIST_BYTES} bytes", field="pypi",
                               fix="read this release's metadata from a wheel instead")
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as sdist:
            member = next(m for m in sdist.getmembers() if m.name.count("/") == 1
                          and m.name.endswith("/PKG-INFO"))
            return sdist.extractfile(member).read().decode("utf-8")
    except (requests.RequestException, zipfile.BadZipFile, tarfile.TarError, StopIteration,
            OSError) as exc:
        raise NetworkError(f"could not read the metadata of {filename} ({url}): {exc!r}",
                           field="pypi", fix="run `imgfab compat refresh` again") from None


class _HttpRangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file, fetched in blocks with Range requests."""

    BLOCK = 256 * 1024

    def __init__(self, url: str, requests: Any):
        super().__init__()
        self.url, self.requests, self.pos, self.blocks = url, requests, 0, {}
        head = requests.head(url, timeout=TIMEOUT_S, allow_redirects=True)
        head.raise_for_status()
        self.size = int(head.headers["Content-Length"])

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _block(self, index: int) -> bytes:
        if index not in self.blocks:
            start = index * self.BLOCK
            end = min(start + self.BLOCK, self.size) - 1
            response = self.requests.get(self.url, headers={"Range": f"bytes={start}-{end}"},
                                         timeout=TIMEOUT_S)
            response.raise_for_status()
            if response.status_code != 206:
                raise OSError(f"{self.url} ignored the Range header")
            self.blocks[index] = response.content
        return self.blocks[index]

    def readinto(self, buffer: Any) -> int:
        end = min(self.pos + len(buffer), self.size)
        chunks = []
        position = self.pos
        while position < end:
            block = self._block(position // self.BLOCK)
            offset = position % self.BLOCK
            piece = block[offset:offset + end - position]
            chunks.append(piece)
            position += len(piece)
        data = b"".join(chunks)
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


@dataclass(frozen=True)
class CoreMetadata:
    name: str
    version: str
    requires_python: str
    requires_dist: tuple[str, ...]
    classifiers: tuple[str, ...]


@dataclass(frozen=True)
class DistFile:
    filename: str
    url: str
    uploaded: str = ""  # PyPI's upload_time_iso_8601, to the second: "2026-04-18T05:50:15Z"


def parse_core_metadata(text: str) -> CoreMetadata:
    """Parse a METADATA / PKG-INFO document (RFC 822 headers; the body is ignored)."""
    headers = HeaderParser().parsestr(text, headersonly=True)
    return CoreMetadata(
        name=str(headers.get("Name", "")), version=str(headers.get("Version", "")),
        requires_python=" ".join(str(headers.get("Requires-Python", "")).split()),
        requires_dist=tuple(str(v) for v in headers.get_all("Requires-Dist") or ()),
        classifiers=tuple(str(v) for v in headers.get_all("Classifier") or ()))


def requirement(meta: CoreMetadata, *names: str) -> Requirement | None:
    """The first Requires-Dist on one of ``names`` that applies to Linux x86_64 (no extra)."""
    wanted = {_canonical(n) for n in names}
    for line in meta.requires_dist:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if _canonical(req.name) in wanted and (req.marker is None or req.marker.evaluate(LINUX_X86_64)):
            return req
    return None


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def release_files(index: dict, version: str, base_url: str) -> list[DistFile]:
    """Non-yanked files of one release from a project index, with absolute URLs."""
    rows = (index.get("releases") or {}).get(version) or []
    return [DistFile(row["filename"], urljoin(base_url, row["url"]), _second(row.get("upload_time_iso_8601")))
            for row in rows if not row.get("yanked")]


_UPLOAD_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d+)?Z$")


def _second(value: Any) -> str:
    """``2026-04-18T05:50:15.143159Z`` → ``2026-04-18T05:50:15Z``; "" when absent or not that shape."""
    match = _UPLOAD_TIME.match(str(value or ""))
    return f"{match.group(1)}Z" if match else ""


def release_uploaded(files: Iterable[DistFile]) -> str:
    """When a release was complete on the index: the latest upload time of its non-yanked
    files (a wheel uploaded a day after the sdist still belongs to the release), "" when the
    index gives none. A lock bounded by it can always install the release itself.

    >>> release_uploaded([DistFile("a.whl", "u", "2026-04-18T05:49:16Z"),
    ...                   DistFile("a.tar.gz", "u", "2026-04-18T05:50:15Z")])
    '2026-04-18T05:50:15Z'
    """
    return max((f.uploaded for f in files if f.uploaded), default="")


def _wheel_parts(filename: str) -> tuple[int, str]:
    """(build number, 'python-abi-platform' as published) of a wheel file name."""
    _, _, build, _ = parse_wheel_filename(filename)
    stem = filename[:-len(".whl")].split("-")
    return (build[0] if build else 0), "-".join(stem[-3:])


def wheel_tags(files: Iterable[DistFile]) -> list[str]:
    """Sorted, de-duplicated tag triples of every Linux wheel, as in the file names."""
    return sorted({_wheel_parts(f.filename)[1] for f in files
                   if f.filename.endswith(".whl") and "linux" in f.filename})


def metadata_file(files: list[DistFile]) -> DistFile | None:
    """The file whose metadata stands for the release on Linux x86_64.

    The x86_64 Linux CPython wheel with the highest build number (what pip installs; a
    free-threaded ``cp313t`` build is skipped), else the sdist. Ties break on the file name.
    """
    wheels = []
    for f in files:
        if f.filename.endswith(".whl") and "linux" in f.filename and "x86_64" in f.filename:
            build, tag = _wheel_parts(f.filename)
            if not tag.split("-")[1].endswith("t"):
                wheels.append((build, f.filename, f))
    if wheels:
        return max(wheels, key=lambda w: (w[0], w[1]))[2]
    sdists = sorted((f for f in files if f.filename.endswith((".tar.gz", ".zip"))),
                    key=lambda f: f.filename)
    return sdists[0] if sdists else None
