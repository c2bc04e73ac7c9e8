"""Typed errors, caught once in the CLI.

Exit codes: 2 for bad user input (the recipe, a flag), 1 for the environment (Docker, a
registry, the network). Each error renders as one line: ``<field>: <what>; <fix>``.
"""

from __future__ import annotations

import re

# C0/C1 control characters and DEL: a message never carries a terminal escape.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# The password of a URL's user info: scheme://user:PASSWORD@host
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*:)[^\s/@]+@")


def redact(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` URL replaced by
    ``***``. Applied to every error line, every build log line shown and every ``--json``
    report."""
    return _URL_PASSWORD.sub(r"\1***@", text)


class ImgfabError(Exception):
    """Base class. ``field`` names what was wrong, ``fix`` says what to do about it."""

    exit_code = 1

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
    """The recipe (or a CLI value standing in for a recipe field) is invalid."""

    exit_code = 2


class CompatibilityError(ImgfabError):
    """No stack in the matrix satisfies the recipe and host.

    ``rejections`` lists ``(candidate, reason)`` for every candidate considered.
    """

    exit_code = 2

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None,
                 rejections: list[tuple[str, str]] | None = None):
        super().__init__(message, field=field, fix=fix)
        self.rejections = rejections or []


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
