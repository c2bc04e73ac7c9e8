"""Verify before you sign (issue 34, class 5): ``imgfab promote --sign-key`` signs the release
only after the source's signature and its SBOM and provenance attestations verified, for exactly
its digest, against the key or keyless identity that signed staging; nothing is copied before.
An unverifiable source is exit 1; ``--no-verify-source`` signs it all the same and says so.

The edges stood in for: cosign (a stand-in on ``IMGFAB_COSIGN`` printing what cosign 2.5 prints,
as tests/supply/test_cosign_verify.py uses), and the registries (the copy, the tag lookups). The
real cosign, oras and registry: tests/integration/test_supply.py.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from imgfab.errors import RecipeError, ValidationFailed
from imgfab.supply import cosign, promote

from test_cosign_verify import DIGEST, GOOD, _envelope, _signature, fake_cosign  # noqa: F401

SOURCE = f"127.0.0.1:5000/staging/x@{DIGEST}"
TARGET = "127.0.0.1:5000/release/x:v1"


@pytest.fixture
def registries(monkeypatch):
    """The registries, stood in for: every copy recorded (in order), the target tag free, and the
    copied tag naming the source's digest."""
    copies: list[tuple[str, str]] = []
    monkeypatch.setattr(promote, "oras_copy", lambda src, dst, *_: copies.append((src, dst)))
    monkeypatch.setattr(promote.registry, "tag_holder",
                        lambda ref, *_: ("sha256:" + "e" * 64, {}) if ref.endswith(".att") else None)
    monkeypatch.setattr(promote.registry, "resolve_digest", lambda ref, *_: f"{ref.split(':')[0]}@{DIGEST}")
    monkeypatch.setattr(promote.registry.Credentials, "load", classmethod(lambda cls, host, *a: cls(host)))
    return copies


def _calls(log) -> list[str]:
    return [json.loads(line)[0] for line in log.read_text().splitlines()] if log.exists() else []


def test_a_signing_key_needs_a_trust_root_or_an_explicit_opt_out(fake_cosign, registries, tmp_path):
    log = fake_cosign(GOOD)
    key = tmp_path / "cosign.key"
    key.write_text("k")
    key.chmod(0o600)  # a private key only its owner reads (issue 34)
    with pytest.raises(RecipeError) as caught:
        promote.promote(SOURCE, TARGET, sign_key=key)
    assert caught.value.field == "--verify-key" and "--no-verify-source" in caught.value.fix
    assert registries == [] and _calls(log) == []


@pytest.mark.parametrize("broken", ["verify", "verify-attestation cyclonedx",
                                    "verify-attestation slsaprovenance1"])
def test_an_unverifiable_source_is_exit_1_and_nothing_is_copied_or_signed(fake_cosign, registries,
                                                                          tmp_path, broken):
    log = fake_cosign(GOOD | {broken: (1, "")})
    key = tmp_path / "cosign.key"
    key.write_text("k")
    key.chmod(0o600)  # a private key only its owner reads (issue 34)
    with pytest.raises(ValidationFailed) as caught:
        promote.promote(SOURCE, TARGET, sign_key=key, trust=cosign.Trust(key=tmp_path / "cosign.pub"))
    assert caught.value.exit_code == 1
    assert caught.value.message.startswith(f"{SOURCE} does not verify with key {tmp_path / 'cosign.pub'}")
    assert registries == [] and "sign" not in _calls(log)


def test_a_signature_of_another_digest_is_no_verification(fake_cosign, registries, tmp_path):
    other = "sha256:" + "b" * 64
    fake_cosign(GOOD | {"verify": (0, _signature(other)),
                        "verify-attestation cyclonedx": (0, _envelope(other, cosign.PREDICATE_TYPES["cyclonedx"]))})
    with pytest.raises(ValidationFailed):
        promote.promote(SOURCE, TARGET, sign_key=tmp_path / "k", trust=cosign.Trust(key=tmp_path / "k.pub"))
    assert registries == []


def test_a_verified_source_is_copied_then_signed(fake_cosign, registries, tmp_path):
    log = fake_cosign(GOOD | {"sign": (0, "")})
    key = tmp_path / "cosign.key"
    key.write_text("k")
    key.chmod(0o600)  # a private key only its owner reads (issue 34)
    done = promote.promote(SOURCE, TARGET, sign_key=key, trust=cosign.Trust(key=tmp_path / "cosign.pub"))
    assert _calls(log) == ["verify", "verify-attestation", "verify-attestation", "sign"]
    assert registries[0] == (SOURCE, TARGET)
    assert done.signed and done.source_verified
    assert done.verification == (f"signature and attestations (cyclonedx, slsaprovenance1) verified with "
                                 f"key {tmp_path / 'cosign.pub'}")


def test_no_verify_source_signs_unverified_and_says_so(fake_cosign, registries, tmp_path):
    log = fake_cosign({"sign": (0, "")})
    key = tmp_path / "cosign.key"
    key.write_text("k")
    key.chmod(0o600)  # a private key only its owner reads (issue 34)
    done = promote.promote(SOURCE, TARGET, sign_key=key, verify_source=False)
    assert _calls(log) == ["sign"] and registries[0] == (SOURCE, TARGET)
    assert done.signed and not done.source_verified
    assert done.verification == "not verified: --no-verify-source"
    with pytest.raises(RecipeError):  # both at once is a contradiction, refused
        promote.promote(SOURCE, TARGET, sign_key=key, verify_source=False,
                        trust=cosign.Trust(key=tmp_path / "cosign.pub"))


def test_the_cli_states_an_unverified_promotion_in_json_and_on_stderr(fake_cosign, registries, tmp_path):
    from imgfab.cli import cli
    from imgfab.output import output_schema
    import jsonschema

    fake_cosign({"sign": (0, "")})
    key = tmp_path / "cosign.key"
    key.write_text("k")
    key.chmod(0o600)  # a private key only its owner reads (issue 34)
    as_json = CliRunner().invoke(cli, ["promote", SOURCE, "--to", TARGET, "--sign-key", str(key),
                                       "--no-verify-source", "--json"])
    assert as_json.exit_code == 0, as_json.output
    doc = json.loads(as_json.stdout)
    jsonschema.validate(doc, output_schema())
    assert doc["source_verified"] is False and doc["verification"] == "not verified: --no-verify-source"
    text = CliRunner().invoke(cli, ["promote", SOURCE, "--to", TARGET, "--sign-key", str(key),
                                    "--no-verify-source"])
    assert text.exit_code == 0
    assert text.stdout.strip() == f"127.0.0.1:5000/release/x@{DIGEST}"
    assert (f"imgfab: note: {SOURCE} was not verified: --no-verify-source; "
            f"127.0.0.1:5000/release/x@{DIGEST} is signed with your key all the same") in text.stderr
    refused = CliRunner().invoke(cli, ["promote", SOURCE, "--to", TARGET, "--sign-key", str(key)])
    assert isinstance(refused.exception, RecipeError) and refused.exception.field == "--verify-key"
