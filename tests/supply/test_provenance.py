"""The provenance builder (imgfab.supply.provenance) and the Statement checks
(imgfab.supply.statement): the fields the SLSA v1.0 and in-toto v1 specs name, no secret in the
output, the subject-digest check, byte-identical output, and the strict structural check."""

from __future__ import annotations

import copy
import hashlib
import json
import re

import pytest

from imgfab.docker.registry_http import ImageRef
from imgfab.errors import ValidationFailed
from imgfab.render.context import Source
from imgfab.supply.provenance import (BUILD_TYPE, PREDICATE_TYPE, WORKSTATION_BUILDER, BuildParameters,
                                      CompatRow, SourceFile, build_provenance, check_provenance,
                                      public_location, refuse_leaks)
from imgfab.supply.statement import STATEMENT_TYPE, subject_names

from conftest import REPO

MARKER = "Zq7SECRETmarker"
DIGEST = "sha256:" + "a1" * 32
IMAGE = f"127.0.0.1:5000/imgfab/qwen2-7b-h100:vllm0.19.1-0123456789ab@{DIGEST}"
RUNTIME = "127.0.0.1:5001/hub/nvidia/cuda:12.8.2-base-ubuntu24.04@sha256:" + "b2" * 32
BUILDER = "127.0.0.1:5001/hub/nvidia/cuda:12.8.2-devel-ubuntu24.04@sha256:" + "c3" * 32
REVISION = "17d17b4" + "0" * 33
ROWS = [CompatRow("compat/vllm.yaml", "vllm", "0.19.1", "https://pypi.org/project/vllm/0.19.1/"),
        CompatRow("compat/torch.yaml", "torch", "2.10.0", "https://pypi.org/project/torch/2.10.0/", "d4" * 32),
        CompatRow("compat/backends.yaml", "vllm", "0.19.1", "https://docs.vllm.ai/en/v0.19.1/")]


@pytest.fixture()
def secret_files(tmp_path):
    """The build's secrets as it holds them (name → file), each file holding the marker."""
    files = {"ca-cert": tmp_path / "ca.pem", "pip-conf": tmp_path / "pip.conf"}
    files["ca-cert"].write_text(f"-----BEGIN CERTIFICATE-----\n{MARKER}\n-----END CERTIFICATE-----\n")
    files["pip-conf"].write_text(f"[global]\nindex-url = https://ci:{MARKER}@pypi.example/simple\n")
    return files


def _provenance(secrets=(), **changes) -> str:
    parameters = BuildParameters(mirror="127.0.0.1:5001/hub", registry="127.0.0.1:5000", network="host",
                                 pin_digests=True, push=True,
                                 pip_index_url=f"https://ci-user:{MARKER}@pypi.example:8443/simple?token={MARKER}#x",
                                 secrets=secrets)
    inputs = dict(image=ImageRef.parse(IMAGE),
                  recipe=SourceFile("recipes/qwen2-7b-h100.yaml", (REPO / "recipes/qwen2-7b-h100.yaml").read_bytes()),
                  lock=SourceFile("recipes/qwen2-7b-h100.lock", (REPO / "recipes/qwen2-7b-h100.lock").read_bytes()),
                  parameters=parameters,
                  bases={"RUNTIME_IMAGE": ImageRef.parse(RUNTIME), "BUILDER_IMAGE": ImageRef.parse(BUILDER)},
                  compat_rows=ROWS, source=Source(url="https://github.com/imgfab/imgfab", revision=REVISION),
                  builder_id=WORKSTATION_BUILDER, invocation_id="build-qwen2-7b-h100-1",
                  started_on="2026-01-31T12:00:00Z", finished_on="2026-01-31T12:20:00Z")
    return build_provenance(**(inputs | changes))


@pytest.fixture()
def statement(secret_files) -> dict:
    return json.loads(_provenance(secrets=secret_files))


def test_statement_layer(statement):
    assert statement["_type"] == STATEMENT_TYPE == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == PREDICATE_TYPE == "https://slsa.dev/provenance/v1"
    assert statement["subject"] == [{"name": "127.0.0.1:5000/imgfab/qwen2-7b-h100", "digest": {"sha256": "a1" * 32}}]
    assert set(statement["predicate"]) == {"buildDefinition", "runDetails"}


def test_build_definition(statement):
    definition = statement["predicate"]["buildDefinition"]
    assert set(definition) == {"buildType", "externalParameters", "internalParameters", "resolvedDependencies"}
    assert definition["buildType"] == BUILD_TYPE
    recipe = (REPO / "recipes/qwen2-7b-h100.yaml").read_bytes()
    assert definition["externalParameters"] == {
        "recipe": {"path": "recipes/qwen2-7b-h100.yaml", "digest": {"sha256": hashlib.sha256(recipe).hexdigest()}},
        "mirror": "127.0.0.1:5001/hub", "registry": "127.0.0.1:5000", "network": "host",
        "pinDigests": True, "push": True, "compile": "auto",
        "pipIndexUrl": "https://pypi.example:8443/simple", "secrets": ["ca-cert", "pip-conf"]}
    assert definition["internalParameters"] == {"imgfabVersion": "0.1.0"}


def test_resolved_dependencies(statement):
    found = {d["name"]: d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    lock = (REPO / "recipes/qwen2-7b-h100.lock").read_bytes()
    assert found["source"] == {"name": "source", "uri": f"git+https://github.com/imgfab/imgfab@{REVISION}",
                               "digest": {"gitCommit": REVISION}}
    assert found["lock"] == {"name": "lock", "uri": "recipes/qwen2-7b-h100.lock",
                             "digest": {"sha256": hashlib.sha256(lock).hexdigest()}}
    installer = re.search(r"^# installer: uv==(\S+) (.*)$", lock.decode(), re.M)
    assert found["installer"]["uri"] == f"pkg:pypi/uv@{installer.group(1)}"
    assert found["installer"]["annotations"]["imgfab_hashes"] == sorted(re.findall(r"sha256:[0-9a-f]{64}",
                                                                                    installer.group(2)))
    assert found["RUNTIME_IMAGE"] == {"name": "RUNTIME_IMAGE", "digest": {"sha256": "b2" * 32},
                                      "uri": "127.0.0.1:5001/hub/nvidia/cuda@sha256:" + "b2" * 32,
                                      "annotations": {"imgfab_tag": "12.8.2-base-ubuntu24.04"}}
    assert found["BUILDER_IMAGE"]["digest"] == {"sha256": "c3" * 32}
    rows = [d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"] if d["uri"].startswith("compat/")]
    assert [(d["uri"], d["name"], d["annotations"]["imgfab_source"]) for d in rows] == [
        ("compat/backends.yaml", "vllm 0.19.1", "https://docs.vllm.ai/en/v0.19.1/"),
        ("compat/torch.yaml", "torch 2.10.0", "https://pypi.org/project/torch/2.10.0/"),
        ("compat/vllm.yaml", "vllm 0.19.1", "https://pypi.org/project/vllm/0.19.1/")]
    assert rows[1]["digest"] == {"sha256": "d4" * 32} and "digest" not in rows[0]


def test_run_details(statement):
    assert statement["predicate"]["runDetails"] == {
        "builder": {"id": WORKSTATION_BUILDER},
        "metadata": {"invocationId": "build-qwen2-7b-h100-1", "startedOn": "2026-01-31T12:00:00Z",
                     "finishedOn": "2026-01-31T12:20:00Z"}}


def test_no_secret_value_anywhere(secret_files):
    text = _provenance(secrets=secret_files)
    assert MARKER in secret_files["pip-conf"].read_text() and MARKER in secret_files["ca-cert"].read_text()
    assert MARKER not in text
    assert "ci-user" not in text
    for path in secret_files.values():
        assert str(path) not in text and path.name not in text


def test_unknown_source_leaves_the_checkout_out():
    found = json.loads(_provenance(source=None))["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert "source" not in {d["name"] for d in found}
    found = json.loads(_provenance(source=Source(url="https://github.com/imgfab/imgfab")))
    assert "source" not in {d["name"] for d in found["predicate"]["buildDefinition"]["resolvedDependencies"]}


def test_options_not_given_are_left_out():
    bare = json.loads(_provenance(parameters=BuildParameters()))["predicate"]["buildDefinition"]
    assert set(bare["externalParameters"]) == {"recipe", "pinDigests", "push", "compile", "secrets"}


@pytest.mark.parametrize("given, public", [
    ("https://u:p@pypi.example/simple/", "https://pypi.example/simple/"),
    ("https://u:p%40ss@[::1]:8443/simple?token=t#frag", "https://[::1]:8443/simple"),
    ("http://127.0.0.1:3141/root/pypi/+simple/", "http://127.0.0.1:3141/root/pypi/+simple/"),
    ("user:pw@127.0.0.1:5001/hub", "127.0.0.1:5001/hub"),
    ("registry.example:5000", "registry.example:5000"),
])
def test_public_location(given, public):
    assert public_location(given) == public


def test_the_leak_guard():
    parameters = BuildParameters(pip_index_url=f"https://u:{MARKER}@pypi.example/simple")
    refuse_leaks('{"pipIndexUrl": "https://pypi.example/simple"}', parameters)
    with pytest.raises(ValidationFailed, match="password"):
        refuse_leaks(f'{{"pipIndexUrl": "https://u:{MARKER}@pypi.example/simple"}}', parameters)


def test_subject_check(statement):
    assert subject_names(statement, DIGEST)
    assert not subject_names(statement, "sha256:" + "a1" * 31 + "a2")
    assert not subject_names(statement, "sha256:" + "00" * 32)
    assert not subject_names({"subject": "sha256:" + "a1" * 32}, DIGEST)
    assert not subject_names([], DIGEST)
    assert not subject_names({"subject": [{"digest": {"sha512": "a1" * 32}}]}, DIGEST)
    for bad in ("a1" * 32, "sha256:" + "A1" * 32, "sha512:" + "a1" * 64, DIGEST + "0"):
        with pytest.raises(ValidationFailed, match="not a sha256 digest"):
            subject_names(statement, bad)


def test_the_same_inputs_give_the_same_bytes(secret_files):
    first = _provenance(secrets=secret_files)
    assert first == _provenance(secrets=dict(reversed(list(secret_files.items()))))
    assert first == json.dumps(json.loads(first), sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert first != _provenance(secrets=secret_files, finished_on="2026-01-31T12:21:00Z")


def test_a_base_without_digest_is_refused():
    with pytest.raises(ValidationFailed, match="RUNTIME_IMAGE .* no sha256 digest"):
        _provenance(bases={"RUNTIME_IMAGE": ImageRef.parse(RUNTIME.split("@")[0])})
    with pytest.raises(ValidationFailed, match="image .* no sha256 digest"):
        _provenance(image=ImageRef.parse(IMAGE.split("@")[0]))


def _set(path: str, value):
    def change(statement):
        *parents, last = [int(key) if key.isdigit() else key for key in path.split(".")]
        target = statement
        for key in parents:
            target = target[key]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value
    return change


@pytest.mark.parametrize("change, match", [
    (_set("_type", "https://in-toto.io/Statement/v0.1"), "_type"),
    (_set("subject", []), "subject is empty"),
    (_set("subject.0.digest", {"sha256": "a1" * 31}), "subject\\[0\\].digest.sha256 is not lowercase hex"),
    (_set("subject.0.digest", {"sha256": "A1" * 32}), "lowercase hex"),
    (_set("subject.0.digest", {"md5": "a1" * 16}), "algorithm"),
    (_set("subject.0", {"name": "x", "uri": "oci://127.0.0.1:5000/x"}), "no digest"),
    (_set("subject.0.digest", KeyError), "neither uri nor digest"),
    (_set("predicateType", "https://slsa.dev/provenance/v0.2"), "predicateType"),
    (_set("predicate", KeyError), "predicate is not an object"),
    (_set("predicate.buildDefinition", KeyError), "buildDefinition is missing"),
    (_set("predicate.buildDefinition.buildType", ""), "buildType"),
    (_set("predicate.buildDefinition.externalParameters", {}), "externalParameters is empty"),
    (_set("predicate.buildDefinition.resolvedDependencies.0", {"name": "x"}), "neither uri nor digest"),
    (_set("predicate.buildDefinition.resolvedDependencies.1.digest", {"sha256": "zz"}), "lowercase hex"),
    (_set("predicate.buildDefinition.resolvedDependencies.0.digest", {"gitCommit": "abc"}), "gitCommit"),
    (_set("predicate.buildDefinition.materials", []), "unknown field"),
    (_set("predicate.runDetails.builder", KeyError), "builder is missing"),
    (_set("predicate.runDetails.builder.id", "my laptop"), "builder.id is not a URI"),
    (_set("predicate.runDetails.metadata.startedAt", "2026-01-31T12:00:00Z"), "unknown field.*startedAt"),
    (_set("predicate.runDetails.metadata.finishedOn", "2026-01-31T12:20:00+01:00"), "finishedOn"),
    (_set("predicate.runDetails.metadata.invocationId", 7), "invocationId"),
])
def test_the_check_rejects_a_broken_statement(statement, change, match):
    check_provenance(statement)
    broken = copy.deepcopy(statement)
    change(broken)
    with pytest.raises(ValidationFailed, match=match) as caught:
        check_provenance(broken)
    assert "\n" not in caught.value.one_line()


def test_the_check_accepts_extension_fields(statement):
    statement["predicate"]["runDetails"]["metadata"]["examplebuilder_queue"] = "gpu"
    statement["predicate"]["buildDefinition"]["resolvedDependencies"][0]["annotations"] = {"twoPartyReview": False}
    check_provenance(statement)


def test_the_build_type_document_names_every_field():
    document = (REPO / "docs" / "build-type-v1.md").read_text(encoding="utf-8")
    assert BUILD_TYPE.endswith("/docs/build-type-v1.md")
    every = BuildParameters(mirror="m.example/hub", registry="r.example", network="host", pin_digests=True,
                            pip_index_url="https://p.example/simple", compat_dir="compat-local",
                            lock="recipes/x.lock", secrets=["pip-conf"])
    definition = json.loads(_provenance(parameters=every))["predicate"]["buildDefinition"]
    assert len(definition["externalParameters"]) == 11
    for key in set(definition["externalParameters"]) | set(definition["internalParameters"]):
        assert f"| `{key}` |" in document, key
    for name in {d["name"] for d in definition["resolvedDependencies"]} - {"vllm 0.19.1", "torch 2.10.0"}:
        assert f"`{name}`" in document, name
    assert "`<key> <version>`" in document
    assert WORKSTATION_BUILDER.split("#")[1] in document
