"""The Sigstore policy-controller ``ClusterImagePolicy`` of an image repository.

:func:`cluster_image_policy` is pure and deterministic (same inputs, same bytes): it renders
``templates/clusterimagepolicy.yaml.j2`` for one repository and one signer, a public key
(:class:`KeyAuthority`) or a Fulcio identity (:class:`KeylessAuthority`). A pod whose image is
in that repository is then admitted only if the image digest is signed by that signer and
carries, signed by the same signer, a CycloneDX SBOM attestation and a SLSA v1 provenance
attestation.

Every field and rule here is read from sigstore/policy-controller@v0.15.1 (the newest release
tag); paths below are in that repository at that tag:

- Authorities are alternatives (``pkg/webhook/validator.go`` ``ValidatePolicy``: one passing
  authority admits the image), and an authority with ``attestations`` verifies only those
  attestations, not the image's signature. So the policy has two authorities with the same
  signer, ``signature`` and ``attestations``, and a CIP-level ``policy`` (rego) that requires a
  match from each, and from each of the two attestations.
- A key authority without ``ctlog`` verifies without the transparency log
  (``checkOptsFromAuthority``: no Rekor client and no Rekor keys, so ``IgnoreTlog``); there is
  no ``insecureIgnoreTlog`` field in the CRD. Our signatures carry no Rekor entry
  (``cosign sign --tlog-upload=false``), so a key authority never gets a ``ctlog``.
- A key authority verifies the legacy signature format only (``signatureFormat: bundle``
  "must be keyless"): the signer must use ``cosign sign/attest --new-bundle-format=false``
  (cosign v3 defaults to the bundle format).
- ``predicateType`` is compared with the in-toto statement's ``predicateType`` (cosign
  v3.0.5 ``pkg/policy/attestation.go``); the URIs are those cosign's ``--type cyclonedx`` and
  ``--type slsaprovenance1`` write. Short forms such as ``cyclonedx`` are deprecated there.
- The image globs follow ``pkg/apis/glob/glob.go``: the webhook matches the reference's
  go-containerregistry ``Name()``, ``REGISTRY/REPO@sha256:...`` for a digest (a tag the
  mutating webhook resolved is dropped from it) and ``REGISTRY/REPO:TAG`` for a tag; ``*``
  matches no ``/``. ``REPO@*`` and ``REPO:*`` match exactly this repository, where ``REPO**``
  would also match ``REPO-other`` and ``REPO/sub``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import jinja2

from imgfab import __version__
from imgfab.errors import RecipeError
from imgfab.render.context import templates_dir, yaml_value
from imgfab.render.templating import environment

TEMPLATE = "clusterimagepolicy.yaml.j2"
# The CRD's group, the newer of its two served versions, and its kind
# (config/300-clusterimagepolicy.yaml).
API_VERSION = "policy.sigstore.dev/v1beta1"
KIND = "ClusterImagePolicy"
# What the CRD's defaulting writes for a keyless authority without url or ca-cert
# (pkg/apis/policy/v1beta1/clusterimagepolicy_defaults.go).
FULCIO_URL = "https://fulcio.sigstore.dev"
# (attestation name, predicateType): cosign v3.0.5 options.PredicateTypeMap "cyclonedx" and
# "slsaprovenance1", i.e. in-toto-golang v0.9.0 PredicateCycloneDX and slsa v1
# PredicateSLSAProvenance.
ATTESTATIONS = (("sbom", "https://cyclonedx.org/bom"),
                ("provenance", "https://slsa.dev/provenance/v1"))
# The two authorities, one verifying the image signature and one the attestations; the CIP
# policy names them (rego identifiers: no dashes).
SIGNATURE_AUTHORITY = "signature"
ATTESTATION_AUTHORITY = "attestations"
# pkg/apis/signaturealgo/signature_digest.go supportedSignatureAlgorithms.
HASH_ALGORITHMS = ("sha224", "sha256", "sha384", "sha512")
# The Authority.signatureFormat values (clusterimagepolicy_types.go).
SIGNATURE_FORMATS = ("bundle", "legacy")
DOCKER_HUB = "index.docker.io"

# The distribution reference grammar for a path component, and a registry host[:port] whose
# characters the policy-controller's glob accepts (so no IPv6 literal).
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_REGISTRY = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?")
_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----\n((?:[A-Za-z0-9+/=]{1,76}\n)+)-----END \1-----\n")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class KeyAuthority:
    """A cosign public key: ``public_key`` is the PEM text of ``cosign.pub`` (one
    ``PUBLIC KEY`` block); ``hash_algorithm`` is one of :data:`HASH_ALGORITHMS`, or ``None``
    for the policy-controller's default (sha256)."""

    public_key: str
    hash_algorithm: str | None = None


@dataclass(frozen=True)
class KeylessAuthority:
    """A Fulcio certificate identity: the OIDC ``issuer`` and ``subject`` (exact matches), or
    instead of ``subject`` a ``subject_regexp`` (the CRD's ``subjectRegExp``, Go RE2 syntax,
    anchored with ``^`` and ``$``: an unanchored one matches any subject containing it), the
    Fulcio instance (``fulcio_url``) and how the signatures are stored: ``"bundle"`` (cosign
    v3's default, verified against the public-good trusted root) or ``"legacy"``.

    >>> KeylessAuthority("https://token.actions.githubusercontent.com",
    ...                  subject_regexp=r"^https://github\\.com/acme/models/.+@refs/tags/v.+$")  # doctest: +SKIP
    """

    issuer: str
    subject: str = ""
    fulcio_url: str = FULCIO_URL
    signature_format: str = "bundle"
    subject_regexp: str = ""


def repository_name(repository: str) -> str:
    """``repository`` as the policy-controller names it: go-containerregistry's
    ``Repository.Name()`` (``docker.io`` and no registry become ``index.docker.io``, a
    one-component Docker Hub name gets ``library/``).

    ``"127.0.0.1:5000/llm/qwen2-7b"`` stays as it is; ``"ubuntu"`` becomes
    ``"index.docker.io/library/ubuntu"``. Raises :class:`RecipeError` for a tag or digest,
    an invalid path (the distribution grammar: lowercase components), or ``localhost/...``
    without a port (go-containerregistry reads it as a Docker Hub repository).
    """
    field = "repository"
    if not isinstance(repository, str) or _CONTROL.search(repository) or not repository:
        raise RecipeError(f"{repository!r:.80} is not an image repository", field=field,
                          fix="e.g. 127.0.0.1:5000/llm/qwen2-7b")
    if "@" in repository:
        raise RecipeError(f"{repository!r} names a digest", field=field,
                          fix="give the repository alone (the policy covers every digest in it)")
    first, slash, rest = repository.partition("/")
    registry, path = (first, rest) if slash and ("." in first or ":" in first) else ("", repository)
    if ":" in path:
        raise RecipeError(f"{repository!r} names a tag", field=field,
                          fix="give the repository alone (the policy covers every tag in it)")
    if first == "localhost" and not registry:
        raise RecipeError(f"{repository!r}: the policy-controller reads localhost/... as a "
                          "Docker Hub repository", field=field,
                          fix="name the registry's port, e.g. localhost:5000/...")
    if registry and not _REGISTRY.fullmatch(registry):
        raise RecipeError(f"{registry!r} is not a registry host[:port]", field=field,
                          fix="e.g. 127.0.0.1:5000 or ghcr.io")
    components = path.split("/")
    if not all(_PATH_COMPONENT.fullmatch(part) for part in components) or not 2 <= len(path) <= 255:
        raise RecipeError(f"{path!r} is not a repository path", field=field,
                          fix="2 to 255 characters: lowercase letters, digits and . _ - "
                              "between slashes")
    registry = DOCKER_HUB if registry in ("", "docker.io") else registry
    if registry == DOCKER_HUB and len(components) == 1:
        path = f"library/{path}"
    return f"{registry}/{path}"


def image_globs(repository: str) -> tuple[str, str]:
    """The ``spec.images[].glob`` patterns of every digest and every tag in ``repository``,
    and of nothing else: ``("REPO@*", "REPO:*")`` with ``REPO`` from
    :func:`repository_name`."""
    name = repository_name(repository)
    return f"{name}@*", f"{name}:*"


def policy_name(repository: str) -> str:
    """The policy's ``metadata.name``: a DNS-1123 label (at most 63 characters) read from
    the repository path and made unique by a hash of the whole repository name.

    ``"127.0.0.1:5000/llm/qwen2-7b"`` → ``"imgfab-llm-qwen2-7b-"`` + 8 hex digits.
    """
    name = repository_name(repository)
    slug = re.sub(r"[^a-z0-9]+", "-", name.split("/", 1)[1]).strip("-")[:46].rstrip("-")
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    return "-".join(part for part in ("imgfab", slug, digest) if part)


def _pem_lines(public_key: str) -> list[str]:
    """The lines of one PEM ``PUBLIC KEY`` block; anything else is refused, a private key
    first of all (it would be published in a cluster-wide object)."""
    field = "key"
    if not isinstance(public_key, str):
        raise RecipeError("the public key is not text", field=field, fix="pass cosign.pub")
    if "PRIVATE KEY" in public_key:
        raise RecipeError("that is a private key", field=field,
                          fix="pass the public key (cosign.pub), never cosign.key")
    match = _PEM.fullmatch(public_key.strip("\n") + "\n")
    if not match or match.group(1) != "PUBLIC KEY":
        raise RecipeError("not one PEM 'PUBLIC KEY' block", field=field,
                          fix="pass cosign.pub as cosign generate-key-pair writes it")
    try:
        der = base64.b64decode(match.group(2).replace("\n", ""), validate=True)
    except binascii.Error as exc:
        raise RecipeError(f"the PEM body is not base64: {exc}", field=field,
                          fix="pass cosign.pub unchanged") from None
    if not der.startswith(b"\x30"):  # a SubjectPublicKeyInfo is a DER SEQUENCE
        raise RecipeError("the PEM body is not a DER public key", field=field,
                          fix="pass cosign.pub unchanged")
    return match.group(0).rstrip("\n").split("\n")


def _text(value: str, field: str, fix: str) -> str:
    if (not isinstance(value, str) or not value or value != value.strip()
            or _CONTROL.search(value)):
        raise RecipeError(f"{value!r:.80} is not one line of text without surrounding spaces "
                          "(it is matched exactly)", field=field, fix=fix)
    return value


def _signer(authority: KeyAuthority | KeylessAuthority) -> dict:
    """What the template writes for the signer, the same in both authorities."""
    if isinstance(authority, KeyAuthority):
        algorithm = authority.hash_algorithm
        if algorithm is not None and algorithm not in HASH_ALGORITHMS:
            raise RecipeError(f"hash algorithm {algorithm!r} is not one the policy-controller "
                              "supports", field="key.hash_algorithm",
                              fix=f"one of {', '.join(HASH_ALGORITHMS)}, or none for sha256")
        return {"key": {"lines": _pem_lines(authority.public_key), "hash_algorithm": algorithm},
                "keyless": None, "signature_format": "legacy"}
    if isinstance(authority, KeylessAuthority):
        url = _text(authority.fulcio_url, "keyless.fulcio_url", f"e.g. {FULCIO_URL}")
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise RecipeError(f"{url!r} is not an http(s) URL", field="keyless.fulcio_url",
                              fix=f"e.g. {FULCIO_URL}")
        if authority.signature_format not in SIGNATURE_FORMATS:
            raise RecipeError(f"signature format {authority.signature_format!r} is unknown",
                              field="keyless.signature_format",
                              fix=" or ".join(SIGNATURE_FORMATS))
        identity = {
            "issuer": _text(authority.issuer, "keyless.issuer", "the OIDC issuer URL, e.g. "
                            "https://token.actions.githubusercontent.com"),
            **_subject(authority)}
        return {"key": None, "keyless": {"url": url, "identities": [identity]},
                "signature_format": authority.signature_format}
    raise TypeError(f"authority must be a KeyAuthority or a KeylessAuthority, "
                    f"got {type(authority).__name__}")


def _subject(authority: KeylessAuthority) -> dict[str, str]:
    """``{"subject": ...}`` or ``{"subject_regexp": ...}``: exactly one, a regexp anchored."""
    if bool(authority.subject) == bool(authority.subject_regexp):
        raise RecipeError("a keyless identity names both or neither of subject and subject_regexp",
                          field="keyless.subject", fix="give one: the exact identity or an anchored regexp")
    if authority.subject:
        return {"subject": _text(authority.subject, "keyless.subject",
                                 "the certificate identity, e.g. a workflow URL or an e-mail")}
    fix = "an RE2 expression anchored with ^ and $, e.g. ^https://github\\.com/acme/models/.+$"
    pattern = _text(authority.subject_regexp, "keyless.subject_regexp", fix)
    try:
        re.compile(pattern)
    except re.error as exc:
        raise RecipeError(f"the subject regexp does not compile: {exc}", field="keyless.subject_regexp",
                          fix=fix) from None
    if not (pattern.startswith("^") and pattern.endswith("$")):
        raise RecipeError("the subject regexp is not anchored: it would match any subject "
                          "containing it", field="keyless.subject_regexp", fix=fix)
    return {"subject_regexp": pattern}


def _environment() -> jinja2.Environment:
    return environment(templates_dir(), {"yaml": yaml_value})


def cluster_image_policy(repository: str, authority: KeyAuthority | KeylessAuthority) -> str:
    """The ``ClusterImagePolicy`` YAML (one document) for every image in ``repository``.

    ``repository`` is a registry repository without tag or digest, e.g.
    ``"127.0.0.1:5000/llm/qwen2-7b"``; ``authority`` is who signs: a :class:`KeyAuthority`
    (``cosign.pub``; no transparency log: the signatures and attestations are made with
    ``--tlog-upload=false --new-bundle-format=false``) or a :class:`KeylessAuthority` (a Fulcio
    identity, public-good Fulcio and Rekor by default).

    The policy, named :func:`policy_name`, matches :func:`image_globs` and, in ``enforce``
    mode, admits an image only when it is signed by ``authority`` and has a CycloneDX SBOM
    (``cosign attest --type cyclonedx``) and a SLSA v1 provenance (``--type
    slsaprovenance1``) attestation signed by it. Raises :class:`RecipeError` for a bad
    repository, key or identity, ``TypeError`` for another kind of ``authority``.

    >>> text = cluster_image_policy("127.0.0.1:5000/llm/qwen2-7b",
    ...                             KeyAuthority(open("cosign.pub").read()))  # doctest: +SKIP
    """
    signer = _signer(authority)
    attestations = [{"name": name, "predicate_type": predicate} for name, predicate in ATTESTATIONS]
    context = {
        "imgfab_version": __version__,
        "repository": repository_name(repository),
        "api_version": API_VERSION,
        "kind": KIND,
        "name": policy_name(repository),
        "labels": {"app.kubernetes.io/managed-by": "imgfab"},
        "globs": list(image_globs(repository)),
        "signature_authority": SIGNATURE_AUTHORITY,
        "attestation_authority": ATTESTATION_AUTHORITY,
        "attestations": attestations,
        "authorities": [{"name": SIGNATURE_AUTHORITY, "attestations": []},
                        {"name": ATTESTATION_AUTHORITY, "attestations": attestations}],
        **signer,
    }
    return _environment().get_template(TEMPLATE).render(**context)
