"""The one ``--json`` contract every command keeps (issue 23).

Each ``--json`` output is one JSON object on stdout::

    {"schema_version": 1, "command": "resolve", "ok": false, "exit_code": 2,
     "error": {"message": "...", "field": "...", "fix": "...", "line": "...", "step": null},
     ...the command's own fields...}

``ok`` is true exactly when the command exits 0; ``exit_code`` is the code it exits with
(unchanged by ``--json``); ``error`` is present exactly when ``ok`` is false and names the
failing ``step`` where a command has steps (``build``). The published JSON Schema,
``_data/schemas/output.schema.json`` (``imgfab schema --output FILE --of output``), defines
every command's fields; the tests validate each command's output against it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from imgfab.errors import ImgfabError, redact, redact_values

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).parent / "_data" / "schemas" / "output.schema.json"


def error_object(error: ImgfabError, *, step: str | None = None) -> dict[str, Any]:
    """An error as the contract carries it: its parts, the one line stderr shows, the step."""
    line = error.one_line()
    return {"message": redact(" ".join(str(error.message).split())), "field": error.field,
            "fix": redact(" ".join(error.fix.split())) if error.fix else None, "line": line,
            "step": step or getattr(error, "step", None)}


def document(command: str, *, exit_code: int = 0, error: dict[str, Any] | None = None,
             **fields: Any) -> dict[str, Any]:
    """One output object for ``command``: the envelope first, then the command's fields."""
    if (error is None) != (exit_code == 0):
        raise ValueError("an output has an error exactly when its exit code is not 0")
    head: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "command": command,
                            "ok": exit_code == 0, "exit_code": exit_code}
    if error is not None:
        head["error"] = error
    return {**head, **fields}


def dumps(doc: dict[str, Any]) -> str:
    """The text printed: sorted keys, two-space indent, every secret-shaped value redacted
    before it is serialized (:func:`imgfab.errors.redact_values`), so the text is always one
    valid JSON object; ASCII only, so no control character reaches a terminal raw."""
    return json.dumps(redact_values(doc), indent=2, sort_keys=True)


def output_schema() -> dict[str, Any]:
    """The published JSON Schema (draft 2020-12) of every command's ``--json`` object."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def write_atomically(path: Path, text: str, *, replace: bool = True) -> None:
    """Write ``text`` to ``path`` in one step: a temporary file in the same directory, then a
    rename (``replace``) or a hard link that fails when ``path`` exists (not ``replace``).
    A failure leaves no partial file and the old one whole. Raises ``FileExistsError`` when
    ``path`` exists and not ``replace``; other ``OSError`` as the system reports it."""
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
