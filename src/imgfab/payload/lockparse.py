"""The lock's grammar: ``recipes/<name>.lock`` read into typed entries and header fields, and
the builder's ``requirements.lock`` written back from those entries only.

The lock is data, never a requirements file handed on. A line uv would obey beyond
``name==version`` and its hashes (``--extra-index-url``, ``--find-links``, an ``-r``/``-c``
include, ``name @ http://…``, a path or a wheel file) is refused here, naming the file, the
line number and the fix; so is a header line the lock format does not have.

Contract:

- :func:`parse_lock` — text → :class:`ParsedLock`, or :class:`~imgfab.errors.RecipeError`
  (exit 2) naming ``<source>:<line>``. Pure.
- :func:`requirements_text` — a :class:`ParsedLock` plus what compat/payload.yaml and the recipe
  decide (the served GPUs, the reviewed collisions) → the file uv and imgfab-stage read in the
  builder: a short header imgfab writes and ``name==version \\`` + ``--hash=sha256:…`` lines.

Example::

    >>> lock = parse_lock("# fingerprint: ab\\n\\nsix==1.17.0 \\\\\\n    --hash=sha256:" + "a" * 64 + "\\n")
    >>> lock.entries[0].name, lock.entries[0].version
    ('six', '1.17.0')
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from imgfab.errors import RecipeError

# The header keys imgfab lock writes (lockfile.format_lock), each once but for those listed
# in _REPEATED. ``layer`` lines have their own shape (_LAYER).
_KEYS = frozenset({"fingerprint", "stack", "target", "requested", "index", "installer", "resolver",
                   "exclude-newer", "constraints", "refused", "installed", "serves", "cubins-cut", "cut", "collisions-cut", "kept"})
_REPEATED = frozenset({"index", "cut"})
_TITLE = re.compile(r"^# imgfab lock for recipe [a-z0-9][a-z0-9-]*: written by `imgfab lock`, do not edit\.$"
                    # the builder's requirements.lock, which requirements_text writes
                    r"|^# requirements of recipe [a-z0-9][a-z0-9-]*, written by imgfab from its lock "
                    r"\(fingerprint [0-9a-f]*\): name==version with its hashes, nothing else$")
_HEADER = re.compile(r"^# ([a-z-]+): (.*)$")
_LAYER = re.compile(r"^# layer ([a-z]+-[0-9]+) \(([0-9]+(?:\.[0-9]+)? (?:B|MB|GB)"
                    r"(?: single package over the limit)?)\): ([a-z0-9 -]*)$")
# PEP 503 names as imgfab writes them, and versions without anything uv could read as a URL,
# a path or an option (no '/', ':', '@', ';', whitespace).
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.!+_-]{0,63}$")
_ENTRY = re.compile(r"^(?P<name>[^=\s]+)==(?P<version>[^\s\\]+)(?P<rest>.*)$")
_UNHASHED = "# unhashed: index unreachable"
_HASH = re.compile(r"^ +--hash=(sha256:[0-9a-f]{64})( \\)?$")
_SERVES = re.compile(r"^([0-9]+\.[0-9]+(?: [0-9]+\.[0-9]+)*)(?: \(.*\))?$")
_CUBINS = re.compile(r"^(sm[0-9]{2,3}[af]?(?: sm[0-9]{2,3}[af]?)*)(?: \(.*\))?$")
_COLLISIONS = re.compile(r"^(\S+(?: \S+)*?)(?: \(.*\))?$")
_SITE_PATH = re.compile(r"^(?!/)(?!.*(?:^|/)\.\.(?:/|$))[A-Za-z0-9._+-]+(?:/[A-Za-z0-9._+-]+)*$")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff]")
_INCLUDES = ("-r", "--requirement", "-c", "--constraint")
_EDITABLE = ("-e", "--editable")

FIX = "run `imgfab lock RECIPE` to rewrite it (a lock holds only name==version lines with their --hash lines)"
# The largest committed lock is under 30 kB; a file over a hundred times that is no lock.
MAX_LOCK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class LockEntry:
    """One pinned distribution: PEP 503 ``name``, exact ``version``, ``sha256:…`` hashes."""

    name: str
    version: str
    hashes: tuple[str, ...]
    line: int  # where its name==version line is, for messages


@dataclass(frozen=True)
class LayerLine:
    group: str  # "cuda-1"
    size: str  # "1.90 GB", as planned
    names: tuple[str, ...]
    line: int = 0


@dataclass
class ParsedLock:
    """The fields of a lock. ``header`` maps each key to its values in file order (``index``
    and ``cut`` may repeat); ``lines`` maps each key to the line number of its first value."""

    header: dict[str, list[str]] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    layers: list[LayerLine] = field(default_factory=list)
    entries: list[LockEntry] = field(default_factory=list)

    def first(self, key: str) -> str:
        return (self.header.get(key) or [""])[0]

    @property
    def serves(self) -> tuple[str, ...]:
        match = _SERVES.match(self.first("serves"))
        return tuple(match.group(1).split()) if match else ()

    @property
    def cubins_cut(self) -> tuple[str, ...]:
        match = _CUBINS.match(self.first("cubins-cut"))
        return tuple(match.group(1).split()) if match else ()

    @property
    def collisions(self) -> tuple[str, ...]:
        match = _COLLISIONS.match(self.first("collisions-cut"))
        return tuple(match.group(1).split()) if match else ()


def _refuse(source: str, number: int, what: str) -> RecipeError:
    return RecipeError(f"{source}:{number}: {what}", field="lock", fix=FIX)


def _shown(token: str) -> str:
    """A token of a refused line as a message may show it: short, and never past an '@' or a
    ':' (a password in ``user:pw@host`` or ``scheme://user:pw@host`` is not echoed)."""
    token = re.split(r"[@:=]", token, maxsplit=1)[0]
    return token[:40] if re.fullmatch(r"[A-Za-z0-9._+-]*", token[:40]) else "?"


def _what_is_wrong(line: str) -> str:
    """Why ``line`` is not an entry: the refusal, most specific first."""
    stripped = line.strip()
    first = stripped.split()[0] if stripped else ""
    option = first.split("=", 1)[0]
    if option in _INCLUDES:
        return f"an include ({option}) reads another requirements file"
    if option in _EDITABLE:
        return f"an editable requirement ({option}) installs from a path or URL"
    if option == "--hash":
        return "a --hash line with no pin ending in '\\' above it"
    if stripped.startswith("-"):
        shown = option if re.fullmatch(r"-{1,2}[A-Za-z][A-Za-z-]{0,30}", option) else "-…"
        return f"an option line ({shown}) is an instruction to the installer, not a pin"
    if "@" in stripped or "://" in stripped:
        return f"a URL requirement ({_shown(first)} @ …) names where to download from"
    if ";" in stripped:
        return "an environment marker (;) is not in imgfab's lock format"
    if "/" in stripped or "\\" in stripped.rstrip("\\").rstrip() or stripped.startswith(".") \
            or re.search(r"\.(whl|zip|tar\.gz|tgz|tar\.bz2)\b", stripped):
        return "a path or archive requirement installs a local file"
    return "not a name==version line"


def read_lock_text(path: Path) -> str:
    """The text of the lock file at ``path``. Raises RecipeError (exit 2) naming the file when
    it cannot be read, is larger than :data:`MAX_LOCK_BYTES` or is not UTF-8."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_LOCK_BYTES + 1)
    except OSError as exc:
        raise RecipeError(f"{path} cannot be read: {exc.strerror or type(exc).__name__}",
                          field="lock", fix=FIX) from None
    if len(raw) > MAX_LOCK_BYTES:
        raise RecipeError(f"{path} is larger than {MAX_LOCK_BYTES} bytes, the bound for a lock",
                          field="lock", fix=FIX)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: byte {exc.start + 1} is not UTF-8 (a lock is UTF-8 text)",
                          field="lock", fix=FIX) from None


def parse_lock(text: str, source: str = "lock") -> ParsedLock:
    """Parse ``text`` strictly. ``source`` names the file in messages (``qwen2-7b-h100.lock``).

    Raises RecipeError (exit 2): ``<source>:<n>: <what>; fix: run `imgfab lock RECIPE` …``."""
    parsed = ParsedLock()
    open_entry: tuple[str, str, list[str], int] | None = None  # awaiting --hash lines
    in_body = False

    def close() -> None:
        nonlocal open_entry
        if open_entry is not None:
            name, version, hashes, number = open_entry
            parsed.entries.append(LockEntry(name, version, tuple(hashes), number))
            open_entry = None

    seen: dict[str, int] = {}
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, raw in enumerate(lines, start=1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if _CONTROL.search(line) or "\r" in line:
            raise _refuse(source, number, "a control character (the lock is plain text lines)")
        if open_entry is not None:
            match = _HASH.match(line)
            if not match:
                raise _refuse(source, number, f"the pin on line {open_entry[3]} ends in '\\' but this is "
                                              "not a '    --hash=sha256:<64 hex>' line")
            open_entry[2].append(match.group(1))
            if not match.group(2):
                close()
            continue
        if not line.strip():
            continue
        if line.startswith("#"):
            if in_body:
                raise _refuse(source, number, "a comment below the pins (the header is the lines above them)")
            _header_line(parsed, line, number, source)
            continue
        in_body = True
        entry = _ENTRY.match(line)
        if not entry or not _NAME.match(entry.group("name")) or not _VERSION.match(entry.group("version")):
            raise _refuse(source, number, _what_is_wrong(line))
        rest = entry.group("rest")
        name = re.sub(r"[-_.]+", "-", entry.group("name")).lower()
        if name in seen:
            raise _refuse(source, number, f"{name} is pinned twice (first on line {seen[name]})")
        seen[name] = number
        if rest == " \\":
            open_entry = (name, entry.group("version"), [], number)
        elif rest in ("", "  " + _UNHASHED):
            parsed.entries.append(LockEntry(name, entry.group("version"), (), number))
        else:
            raise _refuse(source, number, f"text after the pin ({_what_is_wrong(rest)}); imgfab writes "
                                          "each --hash on a line of its own" if rest.strip() else
                          "trailing spaces after the pin")
    if open_entry is not None:
        raise _refuse(source, open_entry[3], "the pin ends in '\\' but no --hash line follows")
    _check_layers(parsed, source)
    return parsed


def _header_line(parsed: ParsedLock, line: str, number: int, source: str) -> None:
    if _TITLE.match(line):
        if "title" in parsed.lines:
            raise _refuse(source, number, "a second title line")
        parsed.lines["title"] = number
        return
    if line.startswith("# layer "):
        layer = _LAYER.match(line)
        if not layer:
            raise _refuse(source, number, "a '# layer' line not of the form '# layer <group>-<n> (<size>): names'")
        parsed.layers.append(LayerLine(layer.group(1), layer.group(2), tuple(layer.group(3).split()), number))
        return
    match = _HEADER.match(line)
    key = match.group(1) if match else ""
    if key not in _KEYS:
        raise _refuse(source, number, f"an unknown header line ('# {_shown(key) if key else '…'}') "
                                      "is not in imgfab's lock format")
    if key in parsed.header and key not in _REPEATED:
        raise _refuse(source, number, f"a second '# {key}:' line (the first is line {parsed.lines[key]})")
    value = match.group(2)  # type: ignore[union-attr]
    checks = {"serves": _SERVES, "cubins-cut": _CUBINS}
    if key in checks and not checks[key].match(value):
        raise _refuse(source, number, f"the '# {key}:' line is not a list of "
                                      f"{'compute capabilities' if key == 'serves' else 'sm architectures'}")
    if key == "collisions-cut":
        paths = _COLLISIONS.match(value)
        if not paths or not all(_SITE_PATH.match(p) for p in paths.group(1).split()):
            raise _refuse(source, number, "the '# collisions-cut:' line names a path outside site-packages")
    parsed.header.setdefault(key, []).append(value)
    parsed.lines.setdefault(key, number)


def _check_layers(parsed: ParsedLock, source: str) -> None:
    """Every name in a ``# layer`` line is a pinned one, in one layer only."""
    pinned = {e.name for e in parsed.entries}
    placed: dict[str, str] = {}
    groups = set()
    for layer in parsed.layers:
        number = layer.line
        if layer.group in groups:
            raise _refuse(source, number, f"layer {layer.group} is named twice")
        groups.add(layer.group)
        for name in layer.names:
            if name not in pinned:
                raise _refuse(source, number, f"layer {layer.group} names {_shown(name)}, which the lock does not pin")
            if name in placed:
                raise _refuse(source, number, f"{name} is in layers {placed[name]} and {layer.group}")
            placed[name] = layer.group


def requirements_text(parsed: ParsedLock, *, recipe: str, fingerprint: str, serves: tuple[str, ...],
                      collisions_allowed: tuple[str, ...]) -> str:
    """The builder's ``requirements.lock``, written from ``parsed``'s entries only.

    ``serves`` (the recipe's compute capabilities) and ``collisions_allowed`` (the paths
    compat/payload.yaml reviews) come from the caller, never from the lock's header: a
    ``# collisions-cut:`` path that is not reviewed there is refused."""
    unreviewed = [p for p in parsed.collisions if p not in collisions_allowed]
    if unreviewed:
        raise RecipeError(f"the lock's '# collisions-cut:' line names {' '.join(unreviewed)}, which "
                          "compat/payload.yaml file_collisions_allowed does not review", field="lock", fix=FIX)
    head = [f"# requirements of recipe {recipe}, written by imgfab from its lock (fingerprint {fingerprint}): "
            "name==version with its hashes, nothing else"]
    if serves:
        head.append(f"# serves: {' '.join(serves)}")
    if parsed.collisions:
        head.append(f"# collisions-cut: {' '.join(parsed.collisions)}")
    head += [f"# layer {layer.group} ({layer.size}): {' '.join(layer.names)}" for layer in parsed.layers]
    body = []
    for entry in sorted(parsed.entries, key=lambda e: e.name):
        hashes = " \\\n".join(f"    --hash={h}" for h in entry.hashes)
        body.append(f"{entry.name}=={entry.version} \\\n{hashes}" if entry.hashes
                    else f"{entry.name}=={entry.version}")
    return "\n".join(head) + "\n\n" + "\n".join(body) + "\n"
