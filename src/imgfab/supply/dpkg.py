"""What an image's OS says it holds: the packages of ``/var/lib/dpkg/status`` and the
distribution of ``/etc/os-release``, read from their text (the caller reads the files out of
the built image; nothing here touches a file or Docker).

``dpkg/status`` is a list of stanzas separated by blank lines, each ``Field: value`` lines
with continuation lines starting with a space (deb-control(5), dpkg-query(1)). ``Status`` is
``want error state``: a package is in the image when its state is ``installed`` (``want`` may
be ``install``, ``hold`` - the nvidia/cuda images hold libcublas and libnccl - or ``deinstall``
not yet acted on). ``config-files`` and ``not-installed`` leave no package behind and are
skipped; any other state (``unpacked``, ``half-configured``, ``triggers-pending`` ...) or an
error flag other than ``ok`` means the image's apt run did not finish, and is refused.

``os-release`` is ``KEY=value`` lines, values optionally quoted as in a shell (os-release(5)).

Errors raise :class:`imgfab.errors.ValidationFailed` with one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from imgfab.errors import ValidationFailed

_PRESENT = "installed"
_ABSENT = ("config-files", "not-installed")
_WANTS = ("unknown", "install", "hold", "deinstall", "purge")
_FIELD = re.compile(r"^([A-Za-z0-9][A-Za-z0-9-]*):[ \t]*(.*)$")
_OS_LINE = re.compile(r"^([A-Z0-9_]+)=(.*)$")


@dataclass(frozen=True)
class DebPackage:
    """One installed binary package: ``Package``, ``Version``, ``Architecture`` as dpkg wrote
    them (``libc6``, ``2.36-9+deb12u14``, ``amd64``; ``all`` for architecture-independent)."""

    name: str
    version: str
    arch: str


@dataclass(frozen=True)
class Distro:
    """The image's distribution: os-release ``ID`` (``ubuntu``, ``debian``), ``VERSION_ID``
    (``24.04``, ``12``) and ``VERSION_CODENAME`` (``noble``, ``bookworm``)."""

    id: str
    version_id: str
    codename: str = ""

    @property
    def qualifier(self) -> str:
        """The purl ``distro`` qualifier: ``ubuntu-24.04``, ``debian-12`` (``ID-VERSION_ID``,
        as the purl spec's rpm examples and syft/grype write it); ``ID-CODENAME`` when the
        release has no ``VERSION_ID`` (Debian testing/sid)."""
        return f"{self.id}-{self.version_id or self.codename}"


def _stanzas(text: str) -> list[dict[str, str]]:
    stanzas: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    last = ""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            if fields:
                stanzas.append(fields)
            fields, last = {}, ""
            continue
        if line[0] in " \t":
            if not last:
                raise ValidationFailed(f"dpkg status line {number} continues no field", field="dpkg status",
                                       fix="pass the text of the image's /var/lib/dpkg/status")
            fields[last] += "\n" + line[1:]
            continue
        match = _FIELD.match(line)
        if not match:
            raise ValidationFailed(f"dpkg status line {number} is not 'Field: value': {line[:60]!r}",
                                   field="dpkg status", fix="pass the text of the image's /var/lib/dpkg/status")
        last = match.group(1).lower()
        fields[last] = match.group(2).strip()
    if fields:
        stanzas.append(fields)
    return stanzas


def installed_packages(status_text: str) -> list[DebPackage]:
    """The installed packages of a ``/var/lib/dpkg/status`` text, sorted by (name, arch).

    A multi-arch package installed for two architectures (``libc6:amd64``, ``libc6:i386``) is
    two packages. Raises ValidationFailed for a stanza without Package/Status, an installed one
    without Version/Architecture, an unfinished state, one (name, arch) twice, or no package."""
    found: dict[tuple[str, str], DebPackage] = {}
    for fields in _stanzas(status_text):
        name = fields.get("package", "")
        words = fields.get("status", "").split()
        if not name or len(words) != 3 or words[0] not in _WANTS:
            raise ValidationFailed(f"dpkg status stanza {name or '(no Package)'} has no valid Status "
                                   f"({fields.get('status', '')!r})", field="dpkg status",
                                   fix="pass the text of the image's /var/lib/dpkg/status")
        _want, error, state = words
        if state in _ABSENT and error == "ok":
            continue
        if state != _PRESENT or error != "ok":
            raise ValidationFailed(f"dpkg package {name} is '{' '.join(words)}', not installed: the image's "
                                   "apt-get install did not finish", field="dpkg status",
                                   fix="rebuild the image; its OS layer is broken")
        version, arch = fields.get("version", ""), fields.get("architecture", "")
        if not version or not arch:
            raise ValidationFailed(f"dpkg package {name} is installed but has no Version or Architecture",
                                   field="dpkg status", fix="pass the text of the image's /var/lib/dpkg/status")
        if (name, arch) in found:
            raise ValidationFailed(f"dpkg package {name}:{arch} is listed twice", field="dpkg status",
                                   fix="pass the text of the image's /var/lib/dpkg/status")
        found[(name, arch)] = DebPackage(name, version, arch)
    if not found:
        raise ValidationFailed("dpkg status lists no installed package", field="dpkg status",
                               fix="pass the text of the image's /var/lib/dpkg/status")
    return [found[key] for key in sorted(found)]


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        inner = value[1:-1]
        return re.sub(r"\\([\\\"$`])", r"\1", inner) if value[0] == '"' else inner
    return value


def distro(os_release_text: str) -> Distro:
    """The :class:`Distro` of an ``/etc/os-release`` text. Raises ValidationFailed when ``ID``
    is missing or neither ``VERSION_ID`` nor ``VERSION_CODENAME`` is there."""
    values: dict[str, str] = {}
    for line in os_release_text.splitlines():
        match = _OS_LINE.match(line.strip())
        if match:
            values[match.group(1)] = _unquote(match.group(2).strip())
    ident = values.get("ID", "").lower()
    version_id = values.get("VERSION_ID", "")
    codename = values.get("VERSION_CODENAME", "")
    if not re.fullmatch(r"[a-z0-9._-]+", ident) or not (version_id or codename):
        raise ValidationFailed("os-release names no ID with a VERSION_ID or VERSION_CODENAME",
                               field="os-release", fix="pass the text of the image's /etc/os-release")
    return Distro(ident, version_id, codename)
