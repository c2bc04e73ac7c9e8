"""The values a generated workflow carries, checked before anything is rendered.

A GitHub Actions workflow evaluates ``${{ … }}`` wherever it appears (job and step names,
``with:``, ``env:``, the matrix itself) and hands ``run:`` to a shell, so every value that
reaches :func:`imgfab.render.ci.github_workflow` from the command line (the registry, each
recipe's path and file stem, the runner label, the Python version, the imgfab release, its
wheel's hash or its path, the compat directory, the GitHub repository) must match a strict pattern
of characters that can form neither an expression, a quote, a shell metacharacter nor a new
line. The patterns are ASCII-only and matched whole (:func:`re.fullmatch`: ``$`` would let a
trailing newline through).

A refusal is a :class:`~imgfab.errors.RecipeError` (exit 2) naming the option and the fix. It
names the first character or part that is wrong and never echoes the value itself: a value
typed in the wrong place may be a password (``user:secret@host``).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from imgfab.errors import RecipeError

# host: DNS labels (or an IPv4 address, which is DNS-shaped); path: OCI repository components.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_PORT = re.compile(r"[1-9][0-9]{0,4}")
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_REGISTRY_CHARS = re.compile(r"[A-Za-z0-9.:/_-]")
# A recipe file: a relative path of plain segments ending in .yaml/.yml. Its stem names jobs
# and artifacts; a first character that is neither a letter nor a digit could read as an option.
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")
_STEM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")
_RECIPE_CHARS = re.compile(r"[A-Za-z0-9._/-]")
_RUNNER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_PYTHON = re.compile(r"3\.[0-9]{1,2}(?:\.[0-9]{1,3})?")
MAX_REGISTRY = 255

REGISTRY_FIX = ("a registry HOST[:PORT][/PATH]: host of [A-Za-z0-9.-], port 1-65535, path of "
                "lower-case [a-z0-9._-] components, e.g. ghcr.io or registry.example:5000/team")
RECIPE_FIX = ("give each recipe as a path relative to the repository root of [A-Za-z0-9._-] "
              "segments ending in .yaml, e.g. recipes/qwen2-7b-h100.yaml (rename the file)")


def _bad_character(value: str, allowed: re.Pattern[str]) -> str | None:
    """``"character '$' at position 3"`` for the first character outside ``allowed``."""
    for position, character in enumerate(value, 1):
        if not allowed.fullmatch(character):
            return f"character {character!r} at position {position}"
    return None


def check_registry(value: str, *, field: str = "--registry") -> str:
    """``value`` when it is ``HOST[:PORT][/PATH]`` of safe characters, else RecipeError."""
    bad = _bad_character(value, _REGISTRY_CHARS)
    if bad is None and not value:
        bad = "it is empty"
    if bad is None and len(value) > MAX_REGISTRY:
        bad = f"it is {len(value)} characters long (at most {MAX_REGISTRY})"
    if bad is None:
        address, _, path = value.partition("/")
        host, colon, port = address.partition(":")
        if not _HOST.fullmatch(host):
            bad = "its host is not a DNS name of [A-Za-z0-9-] labels"
        elif colon and not (_PORT.fullmatch(port) and int(port) <= 65535):
            bad = "its port is not a number from 1 to 65535"
        elif ("/" in value) and not all(_COMPONENT.fullmatch(c) for c in path.split("/")):
            bad = "its path is not lower-case [a-z0-9._-] components separated by single slashes"
    if bad is not None:
        raise RecipeError(f"the registry is refused: {bad}", field=field, fix=REGISTRY_FIX)
    return value


def check_recipe_path(value: str, index: int) -> tuple[str, str]:
    """``(posix path, stem)`` of recipe argument number ``index`` (from 1), else RecipeError."""
    field = f"RECIPES (argument {index})"
    bad = _bad_character(value, _RECIPE_CHARS)
    path = PurePosixPath(value)
    if bad is None and value.startswith("/"):
        bad = "it is an absolute path, which the workflow's checkout does not have"
    if bad is None and not all(_SEGMENT.fullmatch(part) for part in value.split("/")):
        bad = "a segment is empty, '.', '..', starts with '.' or '-', or is over 100 characters"
    if bad is None and path.suffix not in (".yaml", ".yml"):
        bad = "it does not end in .yaml or .yml"
    if bad is None and not _STEM.fullmatch(path.stem):
        bad = "its file name's stem does not start with a letter or digit, or is over 80 characters"
    if bad is not None:
        raise RecipeError(f"the recipe file is refused: {bad}", field=field, fix=RECIPE_FIX)
    return path.as_posix(), path.stem


def check_recipe_stems(stems: list[str]) -> None:
    """Two recipes with one stem would share a job name and an artifact: refused."""
    seen: set[str] = set()
    for stem in stems:
        if stem in seen:
            raise RecipeError(f"two recipes have the file name stem {stem!r}", field="RECIPES",
                              fix="rename one: the stem names the job and its artifacts")
        seen.add(stem)


def check_runner_label(value: str) -> str:
    """A self-hosted runner label of ``[A-Za-z0-9._-]``, else RecipeError."""
    if not _RUNNER.fullmatch(value):
        bad = (_bad_character(value, re.compile(r"[A-Za-z0-9._-]"))
               or "it is empty, over 100 characters, or starts with '.' or '-'")
        raise RecipeError(f"the runner label is refused: {bad}", field="--gpu-runner",
                          fix="a self-hosted runner label of [A-Za-z0-9._-], e.g. gpu-h100")
    return value


def check_python(value: str) -> str:
    """A CPython version for actions/setup-python (``3.11``, ``3.12.4``), else RecipeError."""
    if not _PYTHON.fullmatch(value):
        raise RecipeError("the Python version is refused: it is not 3.MINOR[.PATCH]", field="python",
                          fix="give a CPython version such as 3.11")
    return value


# PEP 440 public versions (no local "+..." part), written the way PyPI lists them.
_VERSION = re.compile(r"(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?"
                      r"(?:\.dev[0-9]+)?")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# GitHub's owner and repository names; "." and ".." are no repository.
_REPOSITORY = re.compile(r"[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}")
INSTALL_FIX = ("name the imgfab the workflow installs, one way: --imgfab-version VERSION with "
               "--imgfab-sha256 HEX (the wheel's sha256, as PyPI lists it), or --imgfab-path PATH "
               "(a wheel or a source directory inside this repository)")


def check_install(version: str | None, sha256: str | None, path: str | None) -> None:
    """The imgfab a workflow installs: a released wheel (``version`` and its ``sha256``) or a
    ``path`` inside the repository, exactly one of the two; else RecipeError."""
    if (version is None and sha256 is None) == (path is None):
        which = "both a release and a path" if path is not None else "neither a release nor a path"
        raise RecipeError(f"the install of imgfab names {which}", field="--imgfab-version",
                          fix=INSTALL_FIX)
    if path is not None:
        check_relative_path(path, field="--imgfab-path")
        return
    if version is None or not _VERSION.fullmatch(version):
        raise RecipeError("the imgfab version is missing or not a PEP 440 public version",
                          field="--imgfab-version", fix="a release as PyPI lists it, e.g. 0.9.1")
    if sha256 is None or not _SHA256.fullmatch(sha256):
        raise RecipeError("the wheel's sha256 is missing or not 64 lower-case hex digits",
                          field="--imgfab-sha256",
                          fix="the sha256 PyPI lists for the imgfab wheel of that version")


def check_relative_path(value: str, *, field: str) -> str:
    """A path inside the repository: ``.``, or segments as a recipe's (no ``..``, no leading
    ``/`` or ``-``, no empty segment); else RecipeError."""
    bad = _bad_character(value, allowed=_RECIPE_CHARS)
    if bad is None and value[:1] == "/":
        bad = "it is an absolute path, which the workflow's checkout does not have"
    if bad is None and value != "." and not all(_SEGMENT.fullmatch(part) for part in value.split("/")):
        bad = "a segment is empty, '.', '..', starts with '.' or '-', or is over 100 characters"
    if bad is not None:
        raise RecipeError(f"the path is refused: {bad}", field=field,
                          fix="a path relative to the repository root of [A-Za-z0-9._-] segments, "
                              "e.g. vendor/imgfab or dist/imgfab-0.9.1-py3-none-any.whl")
    return value


def check_repository(value: str) -> str:
    """A GitHub ``OWNER/NAME``, else RecipeError."""
    if not _REPOSITORY.fullmatch(value) or any(part in (".", "..") for part in value.split("/")):
        bad = (_bad_character(value, re.compile(r"[A-Za-z0-9_./-]"))
               or "it is not one OWNER/NAME pair of [A-Za-z0-9_.-] names")
        raise RecipeError(f"the repository is refused: {bad}", field="--repository",
                          fix="the GitHub repository the workflow runs in, e.g. acme/models")
    return value
