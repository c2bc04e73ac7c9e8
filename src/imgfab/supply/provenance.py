"""The provenance of a pushed image: an in-toto Statement v1 whose predicate is the SLSA v1.0
build provenance, and its structural check.

Field names from the specs, read at tags:

- slsa-framework/slsa@v1.1: docs/spec/v1.0/provenance.md and docs/spec/v1.0/schema/provenance.cue
  (``predicateType`` ``https://slsa.dev/provenance/v1``; ``buildDefinition`` {``buildType``,
  ``externalParameters``, ``internalParameters``, ``resolvedDependencies``}; ``runDetails``
  {``builder`` {``id``, ``builderDependencies``, ``version``}, ``metadata`` {``invocationId``,
  ``startedOn``, ``finishedOn``}, ``byproducts``}; extension fields are ``<vendor>_<name>``);
- in-toto/attestation@v1.1.2: spec/v1/statement.md, spec/v1/resource_descriptor.md (see
  :mod:`imgfab.supply.statement`).

Neither project publishes a JSON schema for either (SLSA has a CUE summary and a protobuf
file; in-toto has protobuf and Go validators, go/predicates/provenance/v1/provenance.go), so
:func:`check_provenance` is a small strict check of ours: the fields those validators require
(``buildType``, non-empty ``externalParameters``, ``builder.id``), the formats (URIs, UTC
timestamps, sha256/gitCommit digests), and no unknown field name unless it is an extension
(an underscore in it), which catches a misspelt field.

What goes where (the build type's contract: docs/build-type-v1.md):

- ``subject``: the pushed image, ``{name: REGISTRY/REPOSITORY, digest: {sha256: …}}``;
- ``externalParameters``: the recipe (path and sha256) and the build options as given: mirror,
  registry, network, pinDigests, push, compile, pipIndexUrl (user, password, query and
  fragment removed), compatDir, lock, and the names of the BuildKit secrets (never a value,
  a path or a file's contents);
- ``internalParameters``: imgfab's version;
- ``resolvedDependencies``: the source checkout (``git+URL@REV``, gitCommit), the lock (path,
  sha256), the installer it names (``pkg:pypi/uv@…``, the hashes it allows), the base images by
  digest (``REGISTRY/NAME@sha256:…``, named by their build argument), and the compat rows that
  decided the stack (file, ``<key> <version>``, their own ``source``).

Pure: the same inputs give the same bytes (sorted keys; times and ids are inputs).
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from imgfab import __version__
from imgfab.docker.registry_http import ImageRef
from imgfab.payload.lockfile import Lock
from imgfab.render.context import Source
from imgfab.render.source import public_url
from imgfab.supply.statement import (STATEMENT_TYPE, check_fields, check_resource, check_statement,
                                     check_timestamp, check_type_uri, failed)

PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/imgfab/imgfab/blob/main/docs/build-type-v1.md"
# builder.id of a build on a workstation: no trusted platform, SLSA Build L1 at most.
WORKSTATION_BUILDER = f"{BUILD_TYPE}#workstation"
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_INSTALLER = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)")
_MIN_PASSWORD = 6  # shorter ones would match by chance (as imgfab.docker.verify)

_PREDICATE_FIELDS = {
    "predicate": ("buildDefinition", "runDetails"),
    "buildDefinition": ("buildType", "externalParameters", "internalParameters", "resolvedDependencies"),
    "runDetails": ("builder", "metadata", "byproducts"),
    "builder": ("id", "builderDependencies", "version"),
    "metadata": ("invocationId", "startedOn", "finishedOn"),
}


@dataclass(frozen=True)
class SourceFile:
    """A file the build read: its ``path`` as given (relative to the source checkout's root when
    it is in one) and its bytes."""

    path: str
    content: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


@dataclass(frozen=True)
class BuildParameters:
    """The ``imgfab build`` options as given (``None``: not given, left out). ``secrets``: the
    names of the BuildKit secrets the build mounted (``ca-cert``, ``pip-conf``); a mapping
    (name → path, as the build holds them) gives its names, and nothing else of it is read."""

    mirror: str | None = None
    registry: str | None = None
    network: str | None = None
    pin_digests: bool = False
    push: bool = False
    compile: str = "auto"
    pip_index_url: str | None = None
    compat_dir: str | None = None
    lock: str | None = None
    secrets: Iterable[str] = ()


@dataclass(frozen=True)
class CompatRow:
    """A compat row that decided the stack: ``file`` (``compat/vllm.yaml``), ``key`` (``vllm``),
    ``version`` (``0.19.1``), its own ``source``, and the file's sha256 when the caller has it."""

    file: str
    key: str
    version: str
    source: str
    sha256: str = ""


def public_location(value: str) -> str:
    """``value`` (a URL, or ``HOST[:PORT][/PATH]``) without user info, query or fragment:
    ``https://u:p@pypi.example/simple?t=1`` → ``https://pypi.example/simple``."""
    url = "://" in value
    parts = urllib.parse.urlsplit(value if url else "//" + value)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", "")) if url else host + parts.path


def _digest_hex(ref: ImageRef, what: str) -> str:
    match = _DIGEST.fullmatch(ref.digest or "")
    if not match:
        raise failed(f"the {what} {ref.name} has no sha256 digest",
                     fix=f"pass the {what} as host/repository[:tag]@sha256:<64 hex>")
    return match.group(1)


def _external(recipe: SourceFile, parameters: BuildParameters) -> dict[str, Any]:
    given = {"mirror": parameters.mirror and public_location(parameters.mirror),
             "registry": parameters.registry and public_location(parameters.registry),
             "network": parameters.network,
             "pipIndexUrl": parameters.pip_index_url and public_location(parameters.pip_index_url),
             "compatDir": parameters.compat_dir, "lock": parameters.lock}
    return {"recipe": {"path": recipe.path, "digest": {"sha256": recipe.sha256}},
            "pinDigests": parameters.pin_digests, "push": parameters.push, "compile": parameters.compile,
            "secrets": sorted(parameters.secrets),
            **{key: value for key, value in given.items() if value}}


def _dependencies(lock: SourceFile, bases: Mapping[str, ImageRef], compat_rows: Iterable[CompatRow],
                  source: Source | None) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    url = public_url(source.url) if source and source.url else ""
    if url and source and source.revision:
        found.append({"name": "source", "uri": f"git+{url}@{source.revision}",
                      "digest": {"gitCommit": source.revision}})
    found.append({"name": "lock", "uri": lock.path, "digest": {"sha256": lock.sha256}})
    installer = Lock.parse(lock.content.decode("utf-8", errors="replace")).installer
    pin = _INSTALLER.match(installer)
    if pin:
        found.append({"name": "installer", "uri": f"pkg:pypi/{pin.group(1).lower()}@{pin.group(2)}",
                      "annotations": {"imgfab_hashes": sorted(re.findall(r"sha256:[0-9a-f]{64}", installer)),
                                      "imgfab_stage": "builder"}})
    for name, ref in sorted(bases.items()):
        hex_digest = _digest_hex(ref, f"base image {name}")
        base = {"name": name, "uri": f"{ref.name}@sha256:{hex_digest}", "digest": {"sha256": hex_digest}}
        if ref.tag:
            base["annotations"] = {"imgfab_tag": ref.tag}
        found.append(base)
    for row in sorted(compat_rows, key=lambda r: (r.file, r.key, r.version)):
        entry: dict[str, Any] = {"name": f"{row.key} {row.version}", "uri": row.file,
                                 "annotations": {"imgfab_source": row.source}}
        if row.sha256:
            entry["digest"] = {"sha256": row.sha256}
        found.append(entry)
    return found


def refuse_leaks(text: str, parameters: BuildParameters) -> None:
    """Raise when ``text`` holds the password of the pip index URL (raw or %-decoded)."""
    password = urllib.parse.urlsplit(parameters.pip_index_url or "").password or ""
    for candidate in {password, urllib.parse.unquote(password)}:
        if len(candidate) >= _MIN_PASSWORD and candidate in text:
            raise failed("the provenance would carry the pip index URL's password",
                         fix="strip user info from every URL it records")


def build_provenance(*, image: ImageRef, recipe: SourceFile, lock: SourceFile, parameters: BuildParameters,
                     bases: Mapping[str, ImageRef], compat_rows: Iterable[CompatRow], source: Source | None,
                     builder_id: str, invocation_id: str, started_on: str, finished_on: str,
                     imgfab_version: str = __version__) -> str:
    """The JSON text of the image's provenance statement, checked by :func:`check_provenance`.

    ``image``: the pushed image (``ImageRef.parse("host/repo:tag@sha256:…")``, digest required).
    ``recipe`` / ``lock``: the recipe and the payload lock as read. ``parameters``: the build
    options. ``bases``: build argument (``BUILDER_IMAGE``, ``RUNTIME_IMAGE``) → its ref pinned by
    digest. ``compat_rows``: the rows that decided the stack. ``source``: the checkout, when
    known (a dependency when it has a URL and a revision). ``builder_id``: the URI of the
    platform that ran the build (the SLSA trust boundary; the caller's to choose). ``invocation_id``,
    ``started_on``, ``finished_on`` (RFC 3339 UTC, ``…Z``): this run.

    ``cosign attest --type slsaprovenance1`` takes ``json.loads(text)["predicate"]``.
    Raises ValidationFailed (one line) for a missing digest, a statement the check rejects, or
    text that would carry the pip index URL's password.
    """
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": image.name, "digest": {"sha256": _digest_hex(image, "image")}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": _external(recipe, parameters),
                "internalParameters": {"imgfabVersion": imgfab_version},
                "resolvedDependencies": _dependencies(lock, bases, compat_rows, source),
            },
            "runDetails": {
                "builder": {"id": builder_id},
                "metadata": {"invocationId": invocation_id, "startedOn": started_on, "finishedOn": finished_on},
            },
        },
    }
    text = json.dumps(statement, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    refuse_leaks(text, parameters)
    check_provenance(json.loads(text))
    return text


def check_provenance(statement: Any) -> None:
    """``statement`` (parsed JSON) is an in-toto Statement v1 carrying a SLSA v1 build
    provenance predicate. Raises ValidationFailed naming the first field that is wrong."""
    check_statement(statement, PREDICATE_TYPE)
    predicate = statement["predicate"]
    check_fields(predicate, _PREDICATE_FIELDS["predicate"], "predicate")
    definition = _object(predicate.get("buildDefinition"), "buildDefinition", required=True)
    check_fields(definition, _PREDICATE_FIELDS["buildDefinition"], "buildDefinition")
    check_type_uri(definition.get("buildType"), "buildDefinition.buildType")
    if not _object(definition.get("externalParameters"), "buildDefinition.externalParameters", required=True):
        raise failed("buildDefinition.externalParameters is empty")
    _object(definition.get("internalParameters"), "buildDefinition.internalParameters")
    _resources(definition.get("resolvedDependencies"), "buildDefinition.resolvedDependencies")
    details = _object(predicate.get("runDetails"), "runDetails", required=True)
    check_fields(details, _PREDICATE_FIELDS["runDetails"], "runDetails")
    builder = _object(details.get("builder"), "runDetails.builder", required=True)
    check_fields(builder, _PREDICATE_FIELDS["builder"], "runDetails.builder")
    check_type_uri(builder.get("id"), "runDetails.builder.id")
    _resources(builder.get("builderDependencies"), "runDetails.builder.builderDependencies")
    versions = _object(builder.get("version"), "runDetails.builder.version")
    if not all(isinstance(v, str) for v in versions.values()):
        raise failed("runDetails.builder.version maps a name to a non-string")
    metadata = _object(details.get("metadata"), "runDetails.metadata")
    check_fields(metadata, _PREDICATE_FIELDS["metadata"], "runDetails.metadata")
    if "invocationId" in metadata and not isinstance(metadata["invocationId"], str):
        raise failed("runDetails.metadata.invocationId is not a string")
    for key in ("startedOn", "finishedOn"):
        if key in metadata:
            check_timestamp(metadata[key], f"runDetails.metadata.{key}")
    _resources(details.get("byproducts"), "runDetails.byproducts")


def _object(value: Any, where: str, *, required: bool = False) -> dict[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise failed(f"{where} is {'missing' if value is None else 'not an object'}")
    return value


def _resources(value: Any, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, list):
        raise failed(f"{where} is not a list")
    for index, item in enumerate(value):
        check_resource(item, f"{where}[{index}]")
