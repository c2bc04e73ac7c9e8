"""How imgfab reads what cosign accepted (the real cosign runs in
tests/integration/test_supply.py): a stand-in ``cosign`` on ``IMGFAB_COSIGN`` (the one test
double, at the tool's edge) prints what cosign 2.5 prints, and :func:`imgfab.supply.cosign.verify`
must still refuse a verified signature or statement that names another digest."""

from __future__ import annotations

import base64
import json
import os

import pytest

from imgfab.errors import EngineError
from imgfab.supply import cosign

DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
REF = f"127.0.0.1:5000/llm/x@{DIGEST}"


def _envelope(subject: str, predicate_type: str) -> str:
    statement = {"_type": "https://in-toto.io/Statement/v0.1", "predicateType": predicate_type,
                 "subject": [{"name": "127.0.0.1:5000/llm/x", "digest": {"sha256": subject.split(":")[1]}}],
                 "predicate": {}}
    payload = base64.b64encode(json.dumps(statement).encode()).decode()
    return json.dumps({"payloadType": "application/vnd.in-toto+json", "payload": payload,
                       "signatures": [{"keyid": "", "sig": "MEUC"}]})


@pytest.fixture
def fake_cosign(tmp_path, monkeypatch):
    """Write the stand-in: ``answers`` maps the subcommand (``verify``, ``verify-attestation
    cyclonedx``, ...) to (exit status, stdout); every call's argv is logged."""
    log = tmp_path / "argv.log"

    def install(answers: dict[str, tuple[int, str]]) -> list[list[str]]:
        (tmp_path / "answers.json").write_text(json.dumps(answers))
        script = tmp_path / "cosign"
        script.write_text(f"""#!/usr/bin/env python3
import json, sys
args = sys.argv[1:]
with open({str(log)!r}, "a") as handle:
    handle.write(json.dumps(args) + "\\n")
answers = json.load(open({str(tmp_path / 'answers.json')!r}))
key = args[0] + (" " + args[args.index("--type") + 1] if "--type" in args else "")
code, out = answers.get(key, (1, ""))
print(out)
if code:
    print("Error: no matching signatures", file=sys.stderr)
sys.exit(code)
""")
        script.chmod(0o755)
        monkeypatch.setenv("IMGFAB_COSIGN", str(script))
        return log
    return install


def _signature(digest: str) -> str:
    return json.dumps([{"critical": {"image": {"docker-manifest-digest": digest},
                                     "type": "cosign container image signature"}}])


GOOD = {"verify": (0, _signature(DIGEST)),
        "verify-attestation cyclonedx": (0, _envelope(DIGEST, cosign.PREDICATE_TYPES["cyclonedx"])),
        "verify-attestation slsaprovenance1": (0, _envelope(DIGEST, cosign.PREDICATE_TYPES["slsaprovenance1"]))}


def test_everything_for_this_digest_verifies(fake_cosign, tmp_path):
    log = fake_cosign(GOOD)
    verdict = cosign.verify(REF, cosign.Trust(key=tmp_path / "k.pub"))
    assert verdict.verified, verdict.problems
    assert verdict.attestations == {"cyclonedx": 1, "slsaprovenance1": 1}
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert all("--insecure-ignore-tlog" in c and REF in c for c in calls)  # key: no tlog here


@pytest.mark.parametrize(("key", "answer", "problem"), [
    ("verify", (1, ""), "signature: none verifies"),
    ("verify", (0, _signature(OTHER)), f"not {DIGEST}"),
    ("verify-attestation cyclonedx", (1, ""), "attestation cyclonedx: none verifies"),
    ("verify-attestation cyclonedx", (0, _envelope(OTHER, cosign.PREDICATE_TYPES["cyclonedx"])),
     f"its subject is {OTHER}"),
    ("verify-attestation slsaprovenance1",
     (0, _envelope(DIGEST, "https://slsa.dev/provenance/v0.2")), "its subject is nothing"),
])
def test_each_way_it_can_fail_is_a_reason(fake_cosign, tmp_path, key, answer, problem):
    fake_cosign(GOOD | {key: answer})
    verdict = cosign.verify(REF, cosign.Trust(key=tmp_path / "k.pub"))
    assert not verdict.verified
    assert any(problem in p for p in verdict.problems), verdict.problems


def test_keyless_checks_the_identity_and_the_tlog(fake_cosign):
    log = fake_cosign(GOOD)
    trust = cosign.Trust(identity="https://github.com/o/r/.github/workflows/images.yml@refs/tags/v1",
                         issuer="https://token.actions.githubusercontent.com", tlog=True)
    assert cosign.verify(REF, trust).verified
    for call in map(json.loads, log.read_text().splitlines()):
        assert "--insecure-ignore-tlog" not in call and "--certificate-identity" in call


def test_a_tag_is_never_verified(fake_cosign, tmp_path):
    from imgfab.errors import RecipeError

    fake_cosign(GOOD)
    with pytest.raises(RecipeError):
        cosign.verify("127.0.0.1:5000/llm/x:v1", cosign.Trust(key=tmp_path / "k.pub"))


def test_no_cosign_is_an_environment_failure(monkeypatch, tmp_path):
    monkeypatch.setenv("IMGFAB_COSIGN", str(tmp_path / "missing"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EngineError) as caught:
        cosign.cosign_binary()
    assert caught.value.exit_code == 1


def test_credentials_reach_cosign_in_a_private_config_never_on_its_command_line(fake_cosign, tmp_path):
    from imgfab.docker.credentials import Credentials

    log = fake_cosign(GOOD)
    script = tmp_path / "cosign"
    script.write_text(script.read_text().replace(
        'key = args[0]', 'import os; print(os.environ["DOCKER_CONFIG"], file=sys.stderr); '
        'print(open(os.environ["DOCKER_CONFIG"] + "/config.json").read(), file=sys.stderr)\nkey = args[0]'))
    done = cosign._run(["verify", REF], Credentials("127.0.0.1:5000", "u", "s3cret-pw"))
    assert "s3cret-pw" not in log.read_text()
    config_dir, config = done.stderr.splitlines()[:2]
    auth = json.loads(config)["auths"]["127.0.0.1:5000"]["auth"]
    assert base64.b64decode(auth) == b"u:s3cret-pw"
    assert not os.path.exists(config_dir)  # the private config is gone afterwards
