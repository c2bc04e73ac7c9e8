"""Load ``compat/payloads.yaml``: whether each backend release's payload installs cleanly, as
``imgfab compat refresh --payloads`` found by locking it (imgfab.payload.verdicts).

A row says, for one release and the image Python it was locked for, whether uv resolved the
payload under the release's era bound and the lock's checks passed (one CUDA major, no two
distributions writing one file, pins inside the backend's declared ranges); ``reason`` is the
refusal when not. The resolver rejects a release recorded as not installing (constraint
``payload``), so users learn it at ``resolve``, not after a lock. A malformed row raises
:class:`~imgfab.errors.MatrixError` naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imgfab.errors import MatrixError
from imgfab.matrix.records import Sourced, _read, _sourced, _tuple

PAYLOADS_FILE = "payloads.yaml"


@dataclass(frozen=True)
class PayloadCheck(Sourced):
    """vllm 0.33.0 for Python 3.12 (CUDA 13): installs, 199 distributions."""

    backend: str
    version: str
    python: str
    cuda_major: str
    installs: bool
    reason: str  # the lock's refusal when it does not install, else ""
    packages: int  # distributions in the payload ("0" when it did not resolve)
    constraints: tuple[str, ...]  # compat/payload.yaml constraints the lock applied
    fingerprint: str  # the lock inputs' fingerprint (PayloadRequest.fingerprint): stale when it moves
    checked: str  # YYYY-MM-DD

    def label(self) -> str:
        return f"{self.backend} {self.version} (Python {self.python}, CUDA {self.cuda_major})"


def load_payload_checks(directory: Path) -> list[PayloadCheck]:
    """The rows of ``directory/payloads.yaml`` (none when the file is absent), in file order."""
    if not (directory / PAYLOADS_FILE).is_file():
        return []
    data = _read(directory, PAYLOADS_FILE)
    rows = data.get("checks") or []
    if not isinstance(rows, list):
        raise MatrixError(f"{PAYLOADS_FILE}: 'checks' must be a list", field="compat",
                          fix=f"regenerate it with `imgfab compat refresh --payloads`")
    found: list[PayloadCheck] = []
    seen: set[tuple[str, str, str]] = set()
    for index, row in enumerate(rows):
        where = f"{PAYLOADS_FILE} checks[{index}]"
        if not isinstance(row, dict):
            raise MatrixError(f"{where} is not a mapping", field="compat",
                              fix="regenerate it with `imgfab compat refresh --payloads`")
        try:
            check = PayloadCheck(backend=str(row["backend"]), version=str(row["version"]),
                                 python=str(row["python"]), cuda_major=str(row["cuda_major"]),
                                 installs=row["installs"], reason=str(row.get("reason") or ""),
                                 packages=int(row.get("packages") or 0),
                                 constraints=_tuple(row.get("constraints")),
                                 fingerprint=str(row["fingerprint"]), checked=str(row["checked"]),
                                 **_sourced(row))
        except KeyError as missing:
            raise MatrixError(f"{where} has no {missing.args[0]!r}", field="compat",
                              fix="regenerate it with `imgfab compat refresh --payloads`") from None
        if not isinstance(check.installs, bool):
            raise MatrixError(f"{where} ({check.label()}): installs must be true or false", field="compat",
                              fix="regenerate it with `imgfab compat refresh --payloads`")
        if not check.installs and not check.reason:
            raise MatrixError(f"{where} ({check.label()}) does not install and gives no reason",
                              field="compat", fix="regenerate it with `imgfab compat refresh --payloads`")
        if not check.source:
            raise MatrixError(f"{where} ({check.label()}) has no source", field="compat",
                              fix="regenerate it with `imgfab compat refresh --payloads`")
        key = (check.backend, check.version, check.python)
        if key in seen:
            raise MatrixError(f"{where}: a second row for {check.label()}", field="compat",
                              fix="keep one row per backend release and Python")
        seen.add(key)
        found.append(check)
    return found
