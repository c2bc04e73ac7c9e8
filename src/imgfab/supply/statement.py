"""The in-toto Statement layer (v1): its structural check and the subject-digest check that
``select`` applies to every attestation it reads (an attestation about another digest is not
about this image, whatever it says).

Field names and rules from in-toto/attestation@v1.1.2: spec/v1/statement.md (``_type``,
``subject``, ``predicateType``, ``predicate``), spec/v1/resource_descriptor.md (one of
``uri``, ``digest``, ``content`` at least), spec/v1/digest_set.md (lowercase hex for the
standard algorithms), spec/v1/field_types.md (TypeURI, RFC 3339 UTC timestamps). There is no
official JSON schema for it (the repository has protobuf definitions and Go validators,
go/v1/statement.go and go/v1/resource_descriptor.go, which this check follows and tightens:
a digest here is ``sha256`` of 64 hex or ``gitCommit`` of 40 or 64 hex, nothing else).

Every check raises :class:`imgfab.errors.ValidationFailed` with one line.
"""

from __future__ import annotations

import re
from typing import Any

from imgfab.errors import ValidationFailed

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
_DIGESTS = {"sha256": re.compile(r"[0-9a-f]{64}"), "gitCommit": re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")}
_TYPE_URI = re.compile(r"[a-z][a-z0-9+.-]*:\S+")
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z")
_STATEMENT_FIELDS = ("_type", "subject", "predicateType", "predicate")
_RESOURCE_FIELDS = ("name", "uri", "digest", "content", "downloadLocation", "mediaType", "annotations")


def failed(message: str, fix: str = "fix the attestation builder") -> ValidationFailed:
    return ValidationFailed(message, field="attestation", fix=fix)


def check_fields(value: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    """No field of ``value`` outside ``known`` but extension fields (``vendor_name``: the
    specs' fields never hold an underscore, so an unknown one without is a misspelling)."""
    unknown = sorted(key for key in value if key not in known and "_" not in key)
    if unknown:
        raise failed(f"{where} has unknown field(s) {', '.join(unknown)} (known: {', '.join(known)})")


def check_type_uri(value: Any, where: str) -> None:
    if not isinstance(value, str) or not _TYPE_URI.fullmatch(value):
        raise failed(f"{where} is not a URI: {value!r}")


def check_timestamp(value: Any, where: str) -> None:
    if not isinstance(value, str) or not _TIMESTAMP.fullmatch(value):
        raise failed(f"{where} is not an RFC 3339 UTC time (…Z): {value!r}")


def check_digest_set(value: Any, where: str) -> None:
    if not isinstance(value, dict) or not value:
        raise failed(f"{where}.digest is empty")
    for algorithm, digest in value.items():
        pattern = _DIGESTS.get(algorithm)
        if pattern is None:
            raise failed(f"{where}.digest has an algorithm imgfab does not write: {algorithm!r}")
        if not isinstance(digest, str) or not pattern.fullmatch(digest):
            raise failed(f"{where}.digest.{algorithm} is not lowercase hex of the right length: {digest!r}")


def check_resource(value: Any, where: str) -> None:
    """A ResourceDescriptor: an object with ``uri`` or ``digest`` (imgfab never inlines
    ``content``); a ``digest`` that is there is checked; ``annotations`` is an object."""
    if not isinstance(value, dict):
        raise failed(f"{where} is not an object")
    check_fields(value, _RESOURCE_FIELDS, where)
    if not value.get("uri") and not value.get("digest"):
        raise failed(f"{where} has neither uri nor digest")
    for key in ("uri", "name"):
        if key in value and (not isinstance(value[key], str) or not value[key]):
            raise failed(f"{where}.{key} is not a non-empty string")
    if "digest" in value:
        check_digest_set(value["digest"], where)
    if "annotations" in value and not isinstance(value["annotations"], dict):
        raise failed(f"{where}.annotations is not an object")


def check_statement(statement: Any, predicate_type: str) -> None:
    """``statement`` (parsed JSON) is an in-toto Statement v1 whose ``predicateType`` is
    ``predicate_type``: a non-empty ``subject`` of descriptors each with a digest, and an
    object ``predicate``."""
    if not isinstance(statement, dict):
        raise failed("the statement is not a JSON object")
    check_fields(statement, _STATEMENT_FIELDS, "the statement")
    if statement.get("_type") != STATEMENT_TYPE:
        raise failed(f"_type is {statement.get('_type')!r}, not {STATEMENT_TYPE}")
    subjects = statement.get("subject")
    if not isinstance(subjects, list) or not subjects:
        raise failed("subject is empty: the statement is about no artifact")
    for index, subject in enumerate(subjects):
        check_resource(subject, f"subject[{index}]")
        if "digest" not in subject:
            raise failed(f"subject[{index}] has no digest (a v1 subject is matched by digest)")
    if statement.get("predicateType") != predicate_type:
        raise failed(f"predicateType is {statement.get('predicateType')!r}, not {predicate_type}")
    if not isinstance(statement.get("predicate"), dict):
        raise failed("predicate is not an object")


def subject_names(statement: Any, digest: str) -> bool:
    """True when one of ``statement``'s subjects is the artifact ``digest``
    (``sha256:<64 hex>``): its ``digest.sha256`` equals the hex part exactly. False for any
    other statement, including one that is not a statement at all."""
    algorithm, _, hex_part = digest.partition(":")
    if algorithm != "sha256" or not _DIGESTS["sha256"].fullmatch(hex_part):
        raise failed(f"{digest!r} is not a sha256 digest", fix="pass sha256:<64 hex>")
    subjects = statement.get("subject") if isinstance(statement, dict) else None
    if not isinstance(subjects, list):
        return False
    return any(isinstance(s, dict) and isinstance(s.get("digest"), dict)
               and s["digest"].get("sha256") == hex_part for s in subjects)
