"""Typed errors, caught once in the CLI.

Exit codes: 2 for bad user input (the recipe, a flag), 1 for the environment (Docker, a
registry, the network). Each error renders as one line: ``<field>: <what>; <fix>``.
"""

from __future__ import annotations

import re
from typing import Any

# C0/C1 control characters and DEL: a message never carries a terminal escape.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# What printable() removes: a terminal's escape sequences whole (CSI, OSC to its BEL or ST,
# any other ESC and its final byte), then the controls left but tab and newline.
_ESCAPE_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[ -/]*[0-~])")
_TERMINAL_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# The password of a URL's user info: scheme://user:PASSWORD@host (to the last @ of the
# authority, so a raw @ in the password does not leave its tail behind).
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:)[^\s/?#]+@")
# The other shapes a secret takes in a value someone typed or a server sent:
_SECRETS = (
    # user:PASSWORD@host without a scheme ('alice:S3CRET@pypi.corp.example/simple'), at the
    # start of a word or value; not repo:tag@sha256:… (an image reference).
    (re.compile(r"""(?<![^\s'"(<\[{=,;])([^\s/?#@:'"]+:)[^\s/?#]+@(?!sha(?:256|512):)(?=[\w\[])"""),
     r"\1***@"),
    # scheme://TOKEN@host: a long user name alone is a token (https://ghp_…@github.com).
    (re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#@:]{16,}@"), r"\1***@"),
    # ?token=…, &password=…, X-Amz-Signature=…, --password=…; a quoted value (password="a \"b c",
    # api_key='…') to its closing quote, then to the end of the word; a backslash escapes the
    # character after it (password=\"x\" is one value).
    (re.compile(r"(?i)(?<![\w])((?:access_|refresh_|id_|auth_|private_)?token|password|passwd|"
                r"pwd|secret|client_secret|api[_-]?key|sig|signature|x-amz-signature|"
                r"x-amz-security-token|x-amz-credential|credential)="
                r"""(?:(?:"(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?)(?:\\.|[^&\s#'"\\])*"""
                r"""|(?:\\.|[^&\s#'"\\])+)"""), r"\1=***"),
    # Authorization header values: Bearer <token>, Basic <base64>.
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 ***"),
)


def redact(text: str) -> str:
    """``text`` with every secret-shaped part replaced by ``***``: the password of a
    ``scheme://user:password@`` URL, a scheme-less ``user:password@host``, a token used as a
    URL's user name, a ``token=``/``password=``/signature query value and a Bearer or Basic
    credential. Applied to every error line, every build log line shown and every ``--json``
    report."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return _URL_PASSWORD.sub(r"\1***@", text)


def redact_values(value: Any) -> Any:
    """``value`` (what ``json.dumps`` takes) with every string in it, dictionary keys included,
    :func:`redact`-ed; any other object becomes its redacted ``str`` (as ``default=str`` would
    print it). Redact the values, then serialize: a pattern run over serialized JSON can cut an
    escaping backslash out of a string (``password=\\"…``) and leave invalid JSON."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(key) if isinstance(key, str) else key: redact_values(item)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_values(item) for item in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return redact(str(value))


def printable(text: str) -> str:
    """``text`` as a terminal may show it: every escape sequence (CSI ``ESC [ … m``, OSC
    ``ESC ] … BEL``, two-byte ``ESC x``) removed whole, then every other C0 control but tab
    and newline, DEL and every C1 control removed. For every untrusted string imgfab prints
    for a person: a recipe's file name, a registry's tags and labels, a server's answer.

    >>> printable("recipes/\\x1b[31mred\\r.yaml")
    'recipes/red.yaml'
    """
    return _TERMINAL_CONTROL.sub("", _ESCAPE_SEQUENCE.sub("", text))


def shown(value: object, limit: int = 200) -> str:
    """A rejected ``value`` as an error message quotes it: its ``repr`` (so control characters
    are escaped), :func:`redact`-ed, and only then cut to ``limit`` characters, so a cut can
    never leave the head of a password behind a missing ``@``."""
    text = redact(repr(value))
    return text if len(text) <= limit else text[:limit] + "…"


class ImgfabError(Exception):
    """Base class. ``field`` names what was wrong, ``fix`` says what to do about it."""

    exit_code = 1
    step: str | None = None  # the step of a multi-step command that failed (build's), if known

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.fix = fix

    def one_line(self) -> str:
        """The single line the CLI prints: never a newline, never a traceback."""
        text = f"{self.field}: {self.message}" if self.field else self.message
        if self.fix:
            text = f"{text}; fix: {self.fix}"
        return redact(" ".join(_CONTROL.sub(" ", text).split()))


class RecipeError(ImgfabError):
    """The recipe (or a CLI value standing in for a recipe field) is invalid.

    ``problems`` holds every failing field of a recipe as ``(field, message, fix)`` when the
    schema found several (the first is the error's own field and message)."""

    exit_code = 2
    problems: tuple[tuple[str, str, str | None], ...] = ()


class CompatibilityError(ImgfabError):
    """No stack in the matrix satisfies the recipe and host.

    ``rejections`` lists ``(candidate, reason)`` for every candidate considered; ``rejected``
    the same candidates as ``--json`` carries them (``candidate``, ``constraint``, ``reason``,
    ``fix``), where the resolver knows them.
    """

    exit_code = 2

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None,
                 rejections: list[tuple[str, str]] | None = None,
                 rejected: list[dict[str, str]] | None = None):
        super().__init__(message, field=field, fix=fix)
        self.rejections = rejections or []
        self.rejected = rejected or []


class MatrixError(ImgfabError):
    """The compat data itself is malformed (a bug in compat/*.yaml, not in the recipe)."""

    exit_code = 1


class EngineError(ImgfabError):
    """The Docker engine failed or is unreachable."""

    exit_code = 1


class RegistryError(ImgfabError):
    """A registry refused, failed or is unreachable."""

    exit_code = 1


class NetworkError(ImgfabError):
    """An upstream (PyPI, a registry API) could not be reached."""

    exit_code = 1


class ValidationFailed(ImgfabError):
    """A built image broke a rule (root user, weights in a layer, undeclared build tools)."""

    exit_code = 1


class HostError(ImgfabError):
    """This machine failed imgfab: a cache directory that cannot be written, a damaged key file."""

    exit_code = 1
