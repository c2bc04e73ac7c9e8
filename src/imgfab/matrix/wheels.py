"""The GPU code inside a wheel on PyPI, read without downloading the wheel.

For ``imgfab compat refresh``: which SASS and PTX architectures a CUDA library in a wheel
carries (``torch/lib/libtorch_cuda_linalg.so``, ``vllm/_C.abi3.so``), read from its ELF
``.nv_fatbin`` section (:mod:`imgfab.in_image.fatbin`).

How the bytes are fetched, bounded:

1. the zip central directory, by HTTP range requests at the end of the wheel (a few hundred KB);
2. the one member's compressed bytes, streamed by one range request and inflated on the fly;
   every fat binary is read (no count bound: torch 2.11-2.14's ``libtorch_cuda.so`` carries
   sm_89, sm_103 and sm_121 code only past the 64th), and the scan stops where the run of fat
   binaries ends or after ``MAX_COMPRESSED_BYTES`` (1.5 GiB) of compressed data, whichever is
   first; the connection is then closed. ``.nv_fatbin`` follows ``.text``: torch 2.10.0's
   ``libtorch_cuda.so`` is 681 MB compressed, so one torch wheel costs at most its member once,
   then the cache. A read the byte bound cut short says so in its ``fatbin_source``.

Results are cached as JSON under ``cache_dir`` keyed by wheel file name and the scan's
:data:`SCAN_VERSION` (git-ignored ``.cache/``), so a refresh re-reads nothing it has read
before, and a read made under older bounds (the first 64 fat binaries) is not reused.
"""

from __future__ import annotations

import datetime
import json
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgfab.errors import NetworkError
from imgfab.in_image.fatbin import FatbinScanner, sorted_archs

TIMEOUT_S = 60
MAX_BLOBS: int | None = None  # every fat binary; a count bound is for tests only
MAX_COMPRESSED_BYTES = 1536 * 1024 * 1024
SCAN_VERSION = 2  # 1: the first 64 fat binaries or 96 MB compressed
_CHUNK = 1 << 20

# Members read per project, first one present wins. torch/lib/libtorch_cuda_linalg.so is smaller
# but is not built with torch's full list (torch 2.11.0: no sm_75 there, sm_75 in libtorch_cuda.so).
MEMBERS = {
    "torch": ("torch/lib/libtorch_cuda.so",),
    "vllm": ("vllm/_C.abi3.so", "vllm/_C_stable_libtorch.abi3.so"),  # renamed in 0.24.0
}


@dataclass(frozen=True)
class MemberArchs:
    """What one member of one wheel carries, and how much of it was read."""

    wheel: str
    member: str
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    blobs: int
    complete: bool
    url: str = ""
    read_on: str = ""  # ISO date of the read
    bound: str = ""  # why an incomplete read stopped, e.g. "the 1536 MiB compressed-byte bound"

    def describe(self) -> str:
        """Provenance text for a compat row's ``fatbin_source``."""
        extent = "every fat binary" if self.complete else f"the first {self.blobs} fat binaries" + (
            f", stopped at {self.bound}" if self.bound else "")
        return f"{self.url or self.wheel} {self.member} .nv_fatbin ({extent}), read {self.read_on}"


def _zip_directory(url: str, requests: Any) -> list[zipfile.ZipInfo]:
    from imgfab.matrix.pypi import _HttpRangeFile

    with zipfile.ZipFile(_HttpRangeFile(url, requests)) as wheel:
        return wheel.infolist()


def _member_data_offset(url: str, info: zipfile.ZipInfo, requests: Any) -> int:
    """Where the member's compressed bytes start: after its local header (name and extra)."""
    response = requests.get(url, headers={"Range": f"bytes={info.header_offset}-{info.header_offset + 29}"},
                            timeout=TIMEOUT_S)
    response.raise_for_status()
    local = response.content
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise OSError(f"no local file header for {info.filename}")
    name_len = int.from_bytes(local[26:28], "little")
    extra_len = int.from_bytes(local[28:30], "little")
    return info.header_offset + 30 + name_len + extra_len


def scan_member(url: str, wheel: str, members: tuple[str, ...], *, max_blobs: int | None = MAX_BLOBS,
                max_bytes: int = MAX_COMPRESSED_BYTES,
                on_bytes: Any = None) -> MemberArchs | None:
    """Architectures of the first of ``members`` present in the wheel at ``url``: every fat
    binary (``max_blobs`` None), read from at most ``max_bytes`` of compressed data;
    ``on_bytes(read, total)`` hears of each compressed chunk read (total: the member's size).

    None when the wheel has none of them. Raises NetworkError on a transport failure or a
    member that does not parse.
    """
    import requests

    try:
        infos = {i.filename: i for i in _zip_directory(url, requests)}
        info = next((infos[m] for m in members if m in infos), None)
        if info is None:
            return None
        start = _member_data_offset(url, info, requests)
        end = start + info.compress_size - 1
        if info.compress_type == zipfile.ZIP_DEFLATED:
            inflate = zlib.decompressobj(-15)
        elif info.compress_type == zipfile.ZIP_STORED:
            inflate = None
        else:
            raise OSError(f"{info.filename}: zip compression {info.compress_type} not supported")
        scanner = FatbinScanner(max_blobs)
        read = 0
        with requests.get(url, headers={"Range": f"bytes={start}-{end}"}, timeout=TIMEOUT_S,
                          stream=True) as response:
            response.raise_for_status()
            for chunk in response.iter_content(_CHUNK):
                read += len(chunk)
                if on_bytes is not None:
                    on_bytes(read, min(info.compress_size, max_bytes))
                scanner.feed(inflate.decompress(chunk) if inflate else chunk)
                if scanner.done or read >= max_bytes:
                    break
        if scanner.archs.blobs == 0:
            raise OSError(f"no fat binary in the first {read} compressed bytes of {info.filename}")
    except (requests.RequestException, zipfile.BadZipFile, zlib.error, OSError, ValueError) as exc:
        raise NetworkError(f"could not read the GPU code of {wheel} ({url}): {exc!r}", field="pypi",
                           fix="run `imgfab compat refresh` again") from None
    found = scanner.archs
    if found.complete:
        bound = ""
    elif max_blobs is not None and found.blobs >= max_blobs:
        bound = f"the {max_blobs}-fat-binary bound"
    elif read >= max_bytes:
        bound = f"the {max_bytes // (1024 * 1024)} MiB compressed-byte bound"
    else:
        bound = "the end of the member"
    return MemberArchs(wheel=wheel, member=info.filename, sass=tuple(sorted_archs(found.sass)),
                       ptx=tuple(sorted_archs(found.ptx)), blobs=found.blobs, complete=found.complete,
                       url=url, read_on=datetime.date.today().isoformat(), bound=bound)


class PayloadCache:
    """JSON files under ``directory``, one per (wheel, project): re-reads nothing already read.
    ``progress`` (:class:`imgfab.progress.Progress`) hears of each wheel read and its bytes."""

    def __init__(self, directory: Path, progress: Any = None):
        self.directory = Path(directory)
        self.progress = progress

    def archs(self, project: str, url: str, wheel: str) -> MemberArchs | None:
        path = self.directory / f"{wheel}.archs.v{SCAN_VERSION}.json"
        if path.exists():
            data = json.loads(path.read_text(encoding="utf-8"))
            return MemberArchs(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}) \
                if data else None
        on_bytes = None
        if self.progress is not None:
            self.progress.step(f"{project}: reading the GPU code of {wheel}")
            on_bytes = lambda read, total: self.progress.bytes(wheel, read, total)  # noqa: E731
        found = scan_member(url, wheel, MEMBERS[project], on_bytes=on_bytes)
        self.directory.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(found.__dict__ if found else {}, indent=1), encoding="utf-8")
        return found


__all__ = ["MemberArchs", "PayloadCache", "scan_member", "MEMBERS"]
