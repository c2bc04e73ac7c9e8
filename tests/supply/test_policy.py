"""supply.policy: the ClusterImagePolicy against the policy-controller's own CRD schema, its
admission checks and its glob matching.

Sources, all in sigstore/policy-controller@v0.15.1 unless said otherwise:

- ``tests/fixtures/schemas/clusterimagepolicy.crd.yaml``: config/300-clusterimagepolicy.yaml,
  copied unchanged. Its served versions' ``openAPIV3Schema`` become JSON Schema the way the API
  server applies them (:func:`_json_schema`).
- pkg/apis/glob/glob.go (``Compile``, ``Match``), ported in :func:`_glob_compile` and
  :func:`_glob_match`; the reference name they match is go-containerregistry's
  ``ParseReference(image).Name()`` (google/go-containerregistry@v0.21.3:pkg/name, the version
  policy-controller's go.mod pins), ported in :func:`_reference_name`.
- pkg/apis/policy/v1beta1/clusterimagepolicy_validation.go: the admission webhook's checks that
  the schema does not express (one of key/keyless/static, identities, predicate types, ...),
  ported for the fields a policy can carry in :func:`_admission_errors`.
"""

from __future__ import annotations

import copy
import hashlib
import re
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO
from imgfab.errors import RecipeError
from imgfab.supply import policy
from imgfab.supply.policy import KeyAuthority, KeylessAuthority, cluster_image_policy

CRD = yaml.safe_load((REPO / "tests" / "fixtures" / "schemas" / "clusterimagepolicy.crd.yaml")
                     .read_text(encoding="utf-8"))
REPOSITORY = "127.0.0.1:5000/llm/qwen2-7b"
DIGEST = "sha256:" + hashlib.sha256(b"an image manifest").hexdigest()
# examples/keys/cosign.pub (an ECDSA P-256 key, as `cosign generate-key-pair` writes).
PUBLIC_KEY = """-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEOc6HkISHzVdUbtUsdjYtPuyPYBeg
4FCemyVurIM4KEORQk4OAu8ZNwxvGSoY3eAabYaFIPPQ8ROAjrbdPwNdJw==
-----END PUBLIC KEY-----
"""
ISSUER = "https://token.actions.githubusercontent.com"
SUBJECT = "https://github.com/acme/imgfab/.github/workflows/build.yml@refs/heads/main"
AUTHORITIES = {
    "key": KeyAuthority(PUBLIC_KEY),
    "key-sha512": KeyAuthority(PUBLIC_KEY, hash_algorithm="sha512"),
    "keyless": KeylessAuthority(ISSUER, SUBJECT),
    "keyless-legacy": KeylessAuthority(ISSUER, SUBJECT, fulcio_url="http://fulcio.fulcio-system.svc",
                                       signature_format="legacy"),
}


def _render(variant: str, repository: str = REPOSITORY) -> dict:
    return yaml.safe_load(cluster_image_policy(repository, AUTHORITIES[variant]))


# --- the CRD's schema, as the API server applies it ------------------------------------------

# The keywords the vendored schema uses; any other one fails the conversion instead of being
# silently dropped (a keyword we ignored could be one that rejects documents).
_OPENAPI_KEYWORDS = {"type", "properties", "items", "required", "description", "format"}


def _json_schema(node: dict) -> dict:
    """One OpenAPI v3 structural-schema node as JSON Schema.

    An object without ``x-kubernetes-preserve-unknown-fields: true`` gets
    ``additionalProperties: false``: the API server prunes unknown fields there, and with
    strict field validation (kubectl's default since Kubernetes 1.27) refuses them. ``format:
    int64`` is an annotation only (the type says integer); descriptions are kept."""
    unknown = set(node) - _OPENAPI_KEYWORDS - {"x-kubernetes-preserve-unknown-fields"}
    assert not unknown, f"the converter does not handle {sorted(unknown)}"
    out = {key: node[key] for key in ("type", "required", "description") if key in node}
    if "properties" in node:
        out["properties"] = {name: _json_schema(child) for name, child in node["properties"].items()}
    if "items" in node:
        out["items"] = _json_schema(node["items"])
    if node.get("type") == "object" and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _served_versions() -> list[dict]:
    return [version for version in CRD["spec"]["versions"] if version["served"]]


def _validator(version: dict) -> jsonschema.Draft202012Validator:
    """The document schema of one served version: the CRD's ``openAPIV3Schema`` for ``spec``
    and ``status``, and what the API server requires of every object at the root (the CRD
    leaves these implicit): ``apiVersion`` and ``kind`` of this CRD, ``metadata.name`` a
    DNS-1123 subdomain, labels string to string."""
    schema = _json_schema(version["schema"]["openAPIV3Schema"])
    metadata = {
        "type": "object", "required": ["name"],
        "properties": {
            "name": {"type": "string", "maxLength": 253,
                     "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }
    schema["properties"] = {
        "apiVersion": {"const": f"{CRD['spec']['group']}/{version['name']}"},
        "kind": {"const": CRD["spec"]["names"]["kind"]},
        "metadata": metadata,
        **schema["properties"],
    }
    schema["required"] = ["apiVersion", "kind", "metadata", *schema.get("required", [])]
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _as_version(document: dict, version: dict) -> dict:
    document = copy.deepcopy(document)
    document["apiVersion"] = f"{CRD['spec']['group']}/{version['name']}"
    return document


def _errors(document: dict, version: dict) -> list[str]:
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
            for error in _validator(version).iter_errors(document)]


def test_the_vendored_crd_is_the_cluster_image_policy_crd():
    text = (REPO / "tests/fixtures/schemas/clusterimagepolicy.crd.yaml").read_text(encoding="utf-8")
    source = "sigstore/policy-controller@v0.15.1:config/300-clusterimagepolicy.yaml"
    assert text.startswith(f"# Source: {source}\n")
    assert CRD["kind"] == "CustomResourceDefinition"
    spec = CRD["spec"]
    assert CRD["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}"
    assert spec["scope"] == "Cluster"
    assert sorted(version["name"] for version in _served_versions()) == ["v1alpha1", "v1beta1"]


@pytest.mark.parametrize("variant", sorted(AUTHORITIES))
def test_api_version_and_kind_are_the_crds(variant):
    document = _render(variant)
    group, _, version = document["apiVersion"].partition("/")
    assert group == CRD["spec"]["group"]
    assert version in [served["name"] for served in _served_versions()]
    assert document["kind"] == CRD["spec"]["names"]["kind"]
    assert "namespace" not in document["metadata"]  # the CRD is cluster-scoped


@pytest.mark.parametrize("version", _served_versions(), ids=lambda version: version["name"])
@pytest.mark.parametrize("variant", sorted(AUTHORITIES))
def test_policy_validates_against_each_served_version(variant, version):
    document = _as_version(_render(variant), version)
    assert _errors(document, version) == []


def _break(document: dict, how: str) -> dict:
    document = copy.deepcopy(document)
    spec = document["spec"]
    if how == "metadata.name missing":
        del document["metadata"]["name"]
    elif how == "kind missing":
        del document["kind"]
    elif how == "apiVersion of another group":
        document["apiVersion"] = "policy.example.com/v1beta1"
    elif how == "name not DNS-1123":
        document["metadata"]["name"] = "Qwen2_7B"
    elif how == "images a string":
        spec["images"] = REPOSITORY
    elif how == "glob a number":
        spec["images"][0]["glob"] = 5000
    elif how == "key data a list":
        spec["authorities"][0]["key"]["data"] = PUBLIC_KEY.splitlines()
    elif how == "attestations a mapping":
        spec["authorities"][1]["attestations"] = {"sbom": "https://cyclonedx.org/bom"}
    elif how == "unknown authority field insecureIgnoreTlog":
        spec["authorities"][0]["insecureIgnoreTlog"] = True
    elif how == "unknown key field":
        spec["authorities"][0]["key"]["ignoreTlog"] = True
    elif how == "unknown spec field":
        spec["image"] = spec.pop("images")
    elif how == "status condition without type (the CRD's required)":
        document["status"] = {"conditions": [{"status": "True"}]}
    elif how == "observedGeneration a string":
        document["status"] = {"observedGeneration": "1"}
    else:
        raise AssertionError(how)
    return document


BROKEN = ["metadata.name missing", "kind missing", "apiVersion of another group",
          "name not DNS-1123", "images a string", "glob a number", "key data a list",
          "attestations a mapping", "unknown authority field insecureIgnoreTlog",
          "unknown key field", "unknown spec field",
          "status condition without type (the CRD's required)", "observedGeneration a string"]


@pytest.mark.parametrize("version", _served_versions(), ids=lambda version: version["name"])
@pytest.mark.parametrize("how", BROKEN)
def test_the_schema_rejects_a_broken_policy(how, version):
    document = _as_version(_render("key"), version)
    assert _errors(document, version) == []
    assert _errors(_break(document, how), version), f"accepted: {how}"


def test_the_schema_rejects_a_wrong_type_inside_keyless():
    version = _served_versions()[-1]
    document = _as_version(_render("keyless"), version)
    document["spec"]["authorities"][0]["keyless"]["insecureIgnoreSCT"] = "yes"
    assert any("insecureIgnoreSCT" in error for error in _errors(document, version))


def test_the_schema_keeps_what_the_crd_leaves_open():
    # matchLabels and status.annotations carry x-kubernetes-preserve-unknown-fields: any key.
    version = _served_versions()[-1]
    document = _as_version(_render("key"), version)
    document["spec"]["match"] = [{"resource": "pods", "version": "v1",
                                  "selector": {"matchLabels": {"app": "qwen2-7b"}}}]
    document["status"] = {"annotations": {"anything": {"goes": 1}}}
    assert _errors(document, version) == []


# --- the admission webhook's own checks -------------------------------------------------------

_HASH_ALGORITHMS = {"sha224", "sha256", "sha384", "sha512"}  # signaturealgo/signature_digest.go
_SHORT_PREDICATE_TYPES = {"custom", "slsaprovenance", "spdx", "spdxjson", "cyclonedx", "link",
                          "vuln"}  # common/validation.go ValidPredicateTypes (deprecated forms)
# cryptoutils.UnmarshalPEMToPublicKey, approximated: one PUBLIC KEY block (no DER parse).
_PEM_BLOCK = re.compile(r"-----BEGIN PUBLIC KEY-----\n[A-Za-z0-9+/=\n]+-----END PUBLIC KEY-----\n?")


def _admission_errors(spec: dict) -> list[str]:
    """``ClusterImagePolicySpec.Validate`` for the fields a policy here can carry; a deprecation
    warning counts as an error (we want none). Also ``checkOptsFromAuthority``'s refusal, at
    admission time, of the bundle format for a key authority (pkg/webhook/validator.go)."""
    errors = []
    if not spec.get("images"):
        errors.append("images: missing")
    for image in spec.get("images", []):
        try:
            _glob_compile(image.get("glob") or "")
        except ValueError as exc:
            errors.append(f"glob: {exc}")
    if spec.get("mode", "") not in ("", "enforce", "warn"):
        errors.append("mode: unsupported")
    for authority in spec.get("authorities", []):
        kinds = [kind for kind in ("key", "keyless", "static") if authority.get(kind) is not None]
        if len(kinds) != 1:
            errors.append(f"{authority.get('name')}: expected exactly one of key, keyless, static")
            continue
        if (key := authority.get("key")) is not None:
            if len([field for field in ("data", "kms", "secretRef") if key.get(field)]) != 1:
                errors.append("key: expected exactly one of data, kms, secretRef")
            algorithm = key.get("hashAlgorithm", "")
            if algorithm and algorithm.strip().lower() not in _HASH_ALGORITHMS:
                errors.append(f"key.hashAlgorithm: {algorithm}")
            if key.get("data") and not _PEM_BLOCK.fullmatch(key["data"]):
                errors.append("key.data: not a PEM public key")
            if authority.get("signatureFormat") == "bundle":
                errors.append("when using the new bundle format, the authority must be keyless")
        if (keyless := authority.get("keyless")) is not None:
            if ("url" in keyless) == ("ca-cert" in keyless):
                errors.append("keyless: expected exactly one of url, ca-cert")
            if not keyless.get("identities"):
                errors.append("keyless.identities: missing")
            for identity in keyless.get("identities", []):
                if not (identity.get("issuer") or identity.get("issuerRegExp")):
                    errors.append("identity: missing issuer, issuerRegExp")
                if not (identity.get("subject") or identity.get("subjectRegExp")):
                    errors.append("identity: missing subject, subjectRegExp")
                if identity.get("issuer") and identity.get("issuerRegExp"):
                    errors.append("identity: both issuer and issuerRegExp")
                if identity.get("subject") and identity.get("subjectRegExp"):
                    errors.append("identity: both subject and subjectRegExp")
        if len(authority.get("source", [])) > 1:
            errors.append("source: only single source is supported")
        for attestation in authority.get("attestations", []):
            if not attestation.get("name"):
                errors.append("attestations.name: missing")
            predicate = attestation.get("predicateType", "")
            parts = urlsplit(predicate)
            if not predicate:
                errors.append("attestations.predicateType: missing")
            elif predicate in _SHORT_PREDICATE_TYPES or not (parts.scheme or predicate.startswith("/")):
                errors.append(f"attestations.predicateType: {predicate}: deprecated value, "
                              "please use RFC 3986 conformant values")
            if "policy" in attestation:
                errors += _policy_errors(attestation["policy"])
    if "policy" in spec:
        errors += _policy_errors(spec["policy"])
    return errors


def _policy_errors(policy_block: dict) -> list[str]:
    errors = []
    if policy_block.get("type") not in ("cue", "rego"):
        errors.append("policy.type: only [cue,rego] are supported")
    if len([field for field in ("data", "configMapRef", "remote") if policy_block.get(field)]) != 1:
        errors.append("policy: expected exactly one of data, configMapRef, remote")
    return errors


@pytest.mark.parametrize("variant", sorted(AUTHORITIES))
def test_the_admission_webhook_would_accept_the_policy(variant):
    assert _admission_errors(_render(variant)["spec"]) == []


@pytest.mark.parametrize("how", ["key and keyless", "short predicate type", "no subject",
                                 "key in the bundle format", "no images", "rego type typo"])
def test_the_ported_admission_checks_are_not_vacuous(how):
    spec = _render("key")["spec"]
    keyless = _render("keyless")["spec"]["authorities"][0]["keyless"]
    if how == "key and keyless":
        spec["authorities"][0]["keyless"] = keyless
    elif how == "short predicate type":
        spec["authorities"][1]["attestations"][0]["predicateType"] = "cyclonedx"
    elif how == "no subject":
        del keyless["identities"][0]["subject"]
        spec["authorities"][0] = {"name": "signature", "keyless": keyless}
    elif how == "key in the bundle format":
        spec["authorities"][0]["signatureFormat"] = "bundle"
    elif how == "no images":
        spec["images"] = []
    elif how == "rego type typo":
        spec["policy"]["type"] = "Rego"
    assert _admission_errors(spec)


# --- glob matching, ported from the policy-controller and go-containerregistry ----------------

# glob.go validGlob `^[a-zA-Z0-9-_:\/\*\.@]+$` (Go's Perl-flag class reads the `-` as a literal).
_VALID_GLOB = re.compile(r"[a-zA-Z0-9\-_:/*.@]+")
_TAG_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_-.ABCDEFGHIJKLMNOPQRSTUVWXYZ")  # tag.go
_REPOSITORY_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_-./")  # repository.go


def _glob_compile(glob: str) -> re.Pattern:
    """glob.go ``Compile``; ``ValueError`` for an invalid glob."""
    if glob == "*/*":
        glob = "index.docker.io/*/*"
    if glob == "*":
        glob = "index.docker.io/library/*"
    if not _VALID_GLOB.fullmatch(glob):
        raise ValueError(f"invalid glob {glob!r}")
    glob = glob.replace(".", r"\.").replace("**", "#").replace("*", "[^/]*").replace("#", ".*")
    return re.compile(f"^{glob}\\Z")  # Go's `$` without (?m) is the end of the text


def _registry(name: str) -> str:
    """registry.go ``NewRegistry`` (weak): an RFC 3986 authority; "" and docker.io are Docker
    Hub. (Go's url.Parse also accepts bracketed IPv6 literals, not ported: never reached.)"""
    port = name.rpartition(":")[2] if ":" in name else ""
    if (urlsplit("//" + name).netloc != name or "@" in name or "[" in name
            or not (port.isdigit() or port == "")):
        raise ValueError(f"registries must be valid RFC 3986 URI authorities: {name}")
    return "index.docker.io" if name in ("", "docker.io") else name


def _repository(name: str) -> tuple[str, str]:
    """repository.go ``NewRepository`` (weak): ``(registry, repository)``."""
    if not name:
        raise ValueError("a repository name must be specified")
    registry, repository = "", name
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first):
        registry, repository = first, rest
    if not 2 <= len(repository) <= 255 or set(repository) - _REPOSITORY_CHARS:
        raise ValueError(f"bad repository {repository!r}")
    return _registry(registry), repository


def _repository_name(registry: str, repository: str) -> str:
    """``Repository.Name()``: Docker Hub's implicit ``library/`` namespace."""
    if "/" not in repository and registry == "index.docker.io":
        repository = f"library/{repository}"
    return f"{registry}/{repository}"


def _tag(name: str) -> tuple[str, str]:
    """tag.go ``NewTag`` (weak, default tag latest): ``(Repository.Name(), tag)``."""
    base, tag = name, ""
    parts = name.split(":")
    if len(parts) > 1 and "/" not in parts[-1]:
        base, tag = ":".join(parts[:-1]), parts[-1]
        if not tag:
            raise ValueError(f"{name} must specify a tag name after the colon")
    if tag and (not 1 <= len(tag) <= 128 or set(tag) - _TAG_CHARS):
        raise ValueError(f"bad tag {tag!r}")
    return _repository_name(*_repository(base)), tag or "latest"


def _digest(name: str) -> tuple[str, str]:
    """digest.go ``NewDigest``: a tag before the ``@`` is dropped from the name."""
    parts = name.split("@")
    if len(parts) != 2:
        raise ValueError("a digest must contain exactly one '@' separator")
    base, digest = parts
    if not digest.startswith("sha256:") or not re.fullmatch(r"[a-f0-9]{64}", digest[7:]):
        raise ValueError(f"bad digest {digest!r}")
    try:
        base = _tag(base)[0]
    except ValueError:
        pass
    return _repository_name(*_repository(base)), digest


def _reference_name(image: str) -> str:
    """ref.go ``ParseReference(image).Name()``: a tag first, then a digest."""
    try:
        repository, tag = _tag(image)
        return f"{repository}:{tag}"
    except ValueError:
        pass
    repository, digest = _digest(image)
    return f"{repository}@{digest}"


def _glob_match(glob: str, image: str) -> bool:
    """glob.go ``Match``; ``ValueError`` where Go returns an error."""
    pattern = _glob_compile(glob)
    name = _reference_name(image)
    matched = pattern.match(name) is not None
    if not matched and name != image:
        matched = pattern.match(image) is not None  # the deprecated unqualified fallback
    return matched


# pkg/apis/glob/glob_test.go TestGlobMatch, every case: (image, glob, wantMatch, wantErr).
GLOB_TABLE = [
    ("foo", "index.docker.io/library/foo:latest", True, False),
    ("foo", "index.docker.io/library/foo:*", True, False),
    ("foo", "index.docker.io/library/*", True, False),
    ("foo", "index.docker.io/library/*:latest", True, False),
    ("foo", "index.docker.io/*/*", True, False),
    ("foo", "index.docker.io/**", True, False),
    ("foo", "index.docker.**", True, False),
    ("foo", "inde**", True, False),
    ("foo", "**", True, False),
    ("foo", "foo", True, False),
    ("foo", "foo*", True, False),
    ("foo", "foo**", True, False),
    ("myuser/myapp", "index.docker.io/myuser/myapp:latest", True, False),
    ("myuser/myapp", "index.docker.io/myuser/myapp:*", True, False),
    ("myuser/myapp", "index.docker.io/myuser/*", True, False),
    ("myuser/myapp", "index.docker.io/myuser/*:latest", True, False),
    ("myuser/myapp", "index.docker.io/*/*", True, False),
    ("myuser/myapp", "index.docker.io/**", True, False),
    ("myuser/myapp", "index.docker.**", True, False),
    ("myuser/myapp", "inde**", True, False),
    ("myuser/myapp", "**", True, False),
    ("myuser/myapp", "myuser/myapp", True, False),
    ("myuser/myapp", "myuser/myapp*", True, False),
    ("myuser/myapp", "myuser/myapp**", True, False),
    ("ghcr.io/foo/bar", "ghcr.io/*/*", True, False),
    ("ghcr.io/foo/bar", "ghcr.io/**", True, False),
    ("ghcr.io/foo", "ghcr.io/*/*", False, False),
    ("ghcr.io/foo", "ghcr.io/**", True, False),
    ("ghcr.io/foo", "ghc**", True, False),
    ("ghcr.io/foo", "**", True, False),
    ("ghcr.io/foo", "*/**", True, False),
    ("ghcr.io/foo", "ghcr.io/foo*", True, False),
    ("ghcr.io/foo", "ghcr.io/foo**", True, False),
    ("prefix-ghcr.io/foo", "ghcr.io/foo", False, False),
    ("ghcr.io/foo-suffix", "ghcr.io/foo", False, False),
    ("ghcrxio/foo", "ghcr.io/**", False, False),
    ("invalid&name", "**", False, True),
    ("invalid-glob", ".+", False, True),
    ("invalid-glob", "[a-z]*", False, True),
    ("foo", "*", True, False),
    ("myuser/myapp", "*/*", True, False),
    ("ghcr.io/foo@sha256:5504f2a95018e3d8a52d80d9e1a128c6ea337581808ff9fe96f5628ce2336350",
     "ghcr.io/foo@sha256:5504f2a95018e3d8a52d80d9e1a128c6ea337581808ff9fe96f5628ce2336350",
     True, False),
]


@pytest.mark.parametrize("image, glob, want_match, want_error", GLOB_TABLE,
                         ids=[f"{image}|{glob}" for image, glob, _, _ in GLOB_TABLE])
def test_the_glob_port_passes_the_policy_controllers_own_table(image, glob, want_match, want_error):
    try:
        matched, error = _glob_match(glob, image), False
    except ValueError:
        matched, error = False, True
    assert (matched, error) == (want_match, want_error)


def _matched(repository: str, image: str) -> bool:
    return any(_glob_match(glob, image) for glob in policy.image_globs(repository))


@pytest.mark.parametrize("image", [
    f"{REPOSITORY}@{DIGEST}",                               # what the deploy bundle names
    f"{REPOSITORY}:qwen2-7b-h200-0123456789ab@{DIGEST}",   # what the mutating webhook writes
    f"{REPOSITORY}:qwen2-7b-h200-0123456789ab",            # a tag it could not resolve
    REPOSITORY,                                             # :latest
])
def test_the_globs_match_the_images_references(image):
    assert _matched(REPOSITORY, image)


@pytest.mark.parametrize("image", [
    f"{REPOSITORY}-instruct@{DIGEST}", f"{REPOSITORY}/draft@{DIGEST}",
    f"127.0.0.1:5000/llm/qwen2@{DIGEST}", f"127.0.0.1:5001/llm/qwen2-7b@{DIGEST}",
    f"127.0.0.1:5000/qwen2-7b@{DIGEST}", "127.0.0.1:5000/llm/qwen2-7b-instruct:latest",
])
def test_the_globs_match_no_other_repository(image):
    assert not _matched(REPOSITORY, image)


@pytest.mark.parametrize("image", [f"{REPOSITORY}-instruct@{DIGEST}", f"{REPOSITORY}/draft@{DIGEST}"])
def test_the_glob_the_policy_does_not_use_would_take_the_neighbours_in(image):
    assert _glob_match(f"{REPOSITORY}**", image)


@pytest.mark.parametrize("repository, image", [
    ("ubuntu", f"ubuntu@{DIGEST}"),
    ("docker.io/library/ubuntu", f"ubuntu:24.04@{DIGEST}"),
    ("docker.io/acme/app", f"acme/app@{DIGEST}"),
    ("index.docker.io/acme/app", "docker.io/acme/app:v1"),
])
def test_docker_hub_names_are_normalised_as_the_webhook_names_them(repository, image):
    assert policy.repository_name(repository).startswith("index.docker.io/")
    assert _matched(repository, image)


_COMPONENT = st.from_regex(r"[a-z0-9]{1,6}(?:(?:[._]|__|-{1,2})[a-z0-9]{1,6}){0,2}", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(registry=st.sampled_from(["127.0.0.1:5000", "localhost:5000", "ghcr.io",
                                 "registry.example.com:443", "docker.io"]),
       path=st.lists(_COMPONENT, min_size=1, max_size=3)
       .filter(lambda parts: len("/".join(parts)) >= 2),  # go-containerregistry: 2 characters
       tag=st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True))
def test_the_globs_match_exactly_their_repository(registry, path, tag):
    repository = f"{registry}/{'/'.join(path)}"
    for glob in policy.image_globs(repository):
        _glob_compile(glob)  # ValidateGlob would accept it
    assert _matched(repository, f"{repository}@{DIGEST}")
    assert _matched(repository, f"{repository}:{tag}@{DIGEST}")
    assert _matched(repository, f"{repository}:{tag}")
    assert not _matched(repository, f"{repository}-x@{DIGEST}")
    assert not _matched(repository, f"{repository}/x@{DIGEST}")
    assert not _matched(repository, f"{repository}x:{tag}")


# --- what the policy says --------------------------------------------------------------------

def test_rendering_is_deterministic():
    for authority in AUTHORITIES.values():
        first = cluster_image_policy(REPOSITORY, authority)
        assert cluster_image_policy(REPOSITORY, authority) == first


def test_the_policy_name_is_a_stable_dns_1123_label():
    assert policy.policy_name(REPOSITORY) == "imgfab-llm-qwen2-7b-106ca782"
    assert _render("key")["metadata"]["name"] == policy.policy_name(REPOSITORY)
    long = "127.0.0.1:5000/" + "/".join(["a-very-long-component"] * 9)
    for repository in (REPOSITORY, long, "ghcr.io/a__b/x_y", "ubuntu", "a.b/c.d-e"):
        name = policy.policy_name(repository)
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, name
    # same slug, different repositories: the hash keeps them apart
    assert policy.policy_name("r.io/llm/qwen2-7b") != policy.policy_name("r.io/llm-qwen2/7b")


def test_the_key_policy_needs_no_transparency_log():
    spec = _render("key")["spec"]
    for authority in spec["authorities"]:
        assert authority["key"] == {"data": PUBLIC_KEY}
        assert "ctlog" not in authority and "rfc3161timestamp" not in authority
        assert authority["signatureFormat"] == "legacy"
    assert [a["key"]["hashAlgorithm"] for a in _render("key-sha512")["spec"]["authorities"]] == \
        ["sha512", "sha512"]


def test_the_keyless_policy_names_the_identity_and_fulcio():
    spec = _render("keyless")["spec"]
    for authority in spec["authorities"]:
        assert authority["keyless"] == {"url": "https://fulcio.sigstore.dev",
                                        "identities": [{"issuer": ISSUER, "subject": SUBJECT}]}
        assert authority["signatureFormat"] == "bundle"
        assert "key" not in authority and "ctlog" not in authority
    legacy = _render("keyless-legacy")["spec"]["authorities"][0]
    assert legacy["keyless"]["url"] == "http://fulcio.fulcio-system.svc"
    assert legacy["signatureFormat"] == "legacy"


@pytest.mark.parametrize("variant", sorted(AUTHORITIES))
def test_the_attestations_are_the_sbom_and_the_provenance(variant):
    spec = _render(variant)["spec"]
    assert spec["mode"] == "enforce"
    assert spec["images"] == [{"glob": glob} for glob in policy.image_globs(REPOSITORY)]
    signature, attestations = spec["authorities"]
    assert "attestations" not in signature
    # cosign v3.0.5 PredicateTypeMap: cyclonedx -> in_toto.PredicateCycloneDX, slsaprovenance1
    # -> slsa v1 PredicateSLSAProvenance (in-toto-golang v0.9.0)
    assert attestations["attestations"] == [
        {"name": "sbom", "predicateType": "https://cyclonedx.org/bom"},
        {"name": "provenance", "predicateType": "https://slsa.dev/provenance/v1"}]
    assert signature[_signer_field(signature)] == attestations[_signer_field(attestations)]


def _signer_field(authority: dict) -> str:
    return "key" if "key" in authority else "keyless"


@pytest.mark.parametrize("variant", sorted(AUTHORITIES))
def test_the_cip_policy_requires_every_authority_and_attestation(variant):
    """Authorities are alternatives (ValidatePolicy admits on one); the CIP-level rego must ask
    for a match from every one of them, signatures from the one without attestations and each
    named attestation from the other (the input is PolicyResult: validator_result.go). No rego
    evaluator runs here: this checks what the rule asks for, not OPA's verdict."""
    spec = _render(variant)["spec"]
    assert spec["policy"]["type"] == "rego"
    lines = spec["policy"]["data"].splitlines()
    assert lines[:3] == ["package sigstore", "default isCompliant = false", "isCompliant {"]
    assert lines[-1] == "}"
    required = set()
    for line in lines[3:-1]:
        match = re.fullmatch(r"  count\(input\.authorityMatches\.(\w+)\."
                             r"(signatures|attestations\.\w+)\) > 0", line)
        assert match, f"not a requirement the test understands: {line!r}"
        required.add(match.groups())
    wanted = set()
    for authority in spec["authorities"]:
        if "attestations" in authority:
            wanted |= {(authority["name"], f"attestations.{attestation['name']}")
                       for attestation in authority["attestations"]}
        else:
            wanted.add((authority["name"], "signatures"))
    assert required == wanted
    assert len({authority["name"] for authority in spec["authorities"]}) == len(spec["authorities"])


# --- refusals --------------------------------------------------------------------------------

@pytest.mark.parametrize("repository, says", [
    (f"{REPOSITORY}:latest", "names a tag"),
    (f"{REPOSITORY}@{DIGEST}", "names a digest"),
    ("127.0.0.1:5000/LLM/Qwen2", "not a repository path"),
    ("127.0.0.1:5000/llm//qwen2", "not a repository path"),
    ("127.0.0.1:5000/llm/qwen2-", "not a repository path"),
    ("127.0.0.1:5000/", "not a repository path"),
    ("127.0.0.1:5000/q", "not a repository path"),  # go-containerregistry: 2 to 255 characters
    ("localhost/llm/qwen2", "Docker Hub"),
    ("[::1]:5000/llm/qwen2", "not a registry"),
    ("", "not an image repository"),
    ("127.0.0.1:5000/llm/qwen2\n", "not an image repository"),
])
def test_a_bad_repository_is_refused(repository, says):
    with pytest.raises(RecipeError) as raised:
        cluster_image_policy(repository, AUTHORITIES["key"])
    assert raised.value.field == "repository" and says in raised.value.message


_PRIVATE = ("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n"
            "eyJrZGYiOnsibmFtZSI6InNjcnlwdCJ9fQ==\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n")


@pytest.mark.parametrize("public_key, says", [
    (_PRIVATE, "private key"),
    (PUBLIC_KEY.replace("PUBLIC KEY", "CERTIFICATE"), "PUBLIC KEY"),
    (PUBLIC_KEY + PUBLIC_KEY, "PUBLIC KEY"),
    (PUBLIC_KEY.replace("MFkw", "MF*w"), "PUBLIC KEY"),
    (PUBLIC_KEY.replace("\n", "\r\n"), "PUBLIC KEY"),
    ("-----BEGIN PUBLIC KEY-----\nMFkwEwYH=KoZI\n-----END PUBLIC KEY-----\n", "base64"),
    ("-----BEGIN PUBLIC KEY-----\naGVsbG8=\n-----END PUBLIC KEY-----\n", "DER"),
    ("", "PUBLIC KEY"),
])
def test_a_bad_public_key_is_refused(public_key, says):
    with pytest.raises(RecipeError) as raised:
        cluster_image_policy(REPOSITORY, KeyAuthority(public_key))
    assert raised.value.field == "key" and says in raised.value.message


def test_the_key_may_come_without_its_final_newline():
    assert _render("key") == yaml.safe_load(
        cluster_image_policy(REPOSITORY, KeyAuthority(PUBLIC_KEY.rstrip("\n"))))


@pytest.mark.parametrize("authority, field", [
    (KeyAuthority(PUBLIC_KEY, hash_algorithm="md5"), "key.hash_algorithm"),
    (KeylessAuthority("", SUBJECT), "keyless.issuer"),
    (KeylessAuthority(f" {ISSUER}", SUBJECT), "keyless.issuer"),
    (KeylessAuthority(ISSUER, "a\nb"), "keyless.subject"),
    (KeylessAuthority(ISSUER, SUBJECT, fulcio_url="fulcio.sigstore.dev"), "keyless.fulcio_url"),
    (KeylessAuthority(ISSUER, SUBJECT, fulcio_url="ftp://fulcio.sigstore.dev"), "keyless.fulcio_url"),
    (KeylessAuthority(ISSUER, SUBJECT, signature_format="protobuf"), "keyless.signature_format"),
])
def test_a_bad_signer_is_refused(authority, field):
    with pytest.raises(RecipeError) as raised:
        cluster_image_policy(REPOSITORY, authority)
    assert raised.value.field == field


def test_another_kind_of_authority_is_a_type_error():
    with pytest.raises(TypeError):
        cluster_image_policy(REPOSITORY, PUBLIC_KEY)  # type: ignore[arg-type]
