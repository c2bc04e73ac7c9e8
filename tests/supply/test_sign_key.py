"""A cosign private key open to group or others is refused wherever imgfab signs (issue 34,
class 8): exit 2, one line naming the key and ``chmod 600``, never its content, and before
anything is built or copied."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FROZEN_COMPAT, FROZEN_RECIPES

from imgfab.errors import RecipeError
from imgfab.supply import cosign

KEY_TEXT = "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nS3CRETKEYMATERIAL\n"
DIGEST_REF = "127.0.0.1:9/llm/x@sha256:" + "a" * 64


def _key(tmp_path: Path, mode: int) -> Path:
    key = tmp_path / "cosign.key"
    key.write_text(KEY_TEXT)
    key.chmod(mode)
    return key


def _imgfab(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMGFAB_", "DOCKER_"))}
    env.update(DOCKER_CONFIG=str(cwd), DOCKER_HOST=f"unix://{cwd}/no-docker.sock",
               IMGFAB_COSIGN=str(cwd / "no-cosign"), IMGFAB_ORAS=str(cwd / "no-oras"))
    return subprocess.run([sys.executable, "-c", "from imgfab.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o660, 0o707], ids=lambda m: f"{m:04o}")
def test_a_key_open_to_group_or_others_is_refused_naming_chmod_600(tmp_path, mode):
    key = _key(tmp_path, mode)
    with pytest.raises(RecipeError) as caught:
        cosign.private_key(key)
    assert caught.value.one_line() == (f"--sign-key: the private key {key} is open to group or "
                                       f"others (mode {mode:04o}); fix: chmod 600 {key}")


@pytest.mark.parametrize("mode", [0o600, 0o400], ids=lambda m: f"{m:04o}")
def test_a_key_only_its_owner_can_read_is_used(tmp_path, mode):
    key = _key(tmp_path, mode)
    assert cosign.private_key(key) == key


def test_sign_and_attest_refuse_a_loose_key_before_cosign_runs(tmp_path, monkeypatch):
    key = _key(tmp_path, 0o644)
    monkeypatch.setattr(cosign, "_run", lambda *a, **k: pytest.fail("cosign ran with a loose key"))
    with pytest.raises(RecipeError) as signed:
        cosign.sign(DIGEST_REF, key)
    with pytest.raises(RecipeError) as attested:
        cosign.attest(DIGEST_REF, tmp_path / "sbom.json", "cyclonedx", key)
    assert signed.value.one_line().endswith(f"fix: chmod 600 {key}")
    assert attested.value.one_line() == signed.value.one_line()


def test_build_push_refuses_a_loose_key_in_one_line_before_any_step(tmp_path):
    key = _key(tmp_path, 0o644)
    result = _imgfab("build", str(FROZEN_RECIPES / "qwen2-7b-h100.yaml"), "--compat-dir", str(FROZEN_COMPAT),
                     "--push", "--registry", "127.0.0.1:9", "--sign-key", str(key), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"imgfab: --sign-key: the private key {key} is open to group or others "
                             f"(mode 0644); fix: chmod 600 {key}\n")
    assert "S3CRETKEYMATERIAL" not in result.stdout + result.stderr


def test_promote_refuses_a_loose_key_in_one_line_before_any_copy(tmp_path):
    key = _key(tmp_path, 0o640)
    result = _imgfab("promote", DIGEST_REF, "--to", "127.0.0.1:9/llm/release:v1", "--sign-key", str(key),
                     "--json", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"imgfab: --sign-key: the private key {key} is open to group or others "
                             f"(mode 0640); fix: chmod 600 {key}\n")
    assert "S3CRETKEYMATERIAL" not in result.stdout + result.stderr


def test_a_missing_key_is_still_named_as_not_a_key_file(tmp_path):
    with pytest.raises(RecipeError) as caught:
        cosign.private_key(tmp_path / "absent.key")
    assert caught.value.one_line() == (f"--sign-key: {tmp_path}/absent.key is not a key file; fix: give "
                                       "the path of a cosign key (cosign generate-key-pair)")
