"""Subprocesses get only the variables they need (issue 34, class 4): docker, cosign, oras and
git run with an allow-list per tool (src/imgfab/docker/toolenv.py); a registry password or any
other secret in imgfab's own environment reaches none of them, whatever it is named, and
cosign sees a key password only when it signs.

Each tool is a recording stand-in that writes the environment it was started with to a file
whose path is in its own text (an environment variable would be filtered out with the rest).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from imgfab.docker import engine

# Secrets in imgfab's environment, some named like secrets and some not: none may reach a tool.
SECRETS = {"IMGFAB_REGISTRY_PASSWORD": "s3cret-registry-pw", "HARBOR_ROBOT_PASS": "s3cret-harbor",
           "AWS_SECRET_ACCESS_KEY": "s3cret-aws", "DEPLOY_KEY_B64": "s3cret-deploy",
           "COSIGN_PASSWORD": "s3cret-parent-cosign", "IMGFAB_PIP_INDEX_URL": "https://u:s3cret-pip@idx/simple"}


@pytest.fixture
def secrets_around(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")  # a tool needs it to get out
    monkeypatch.delenv("IMGFAB_COSIGN_PASSWORD_FILE", raising=False)


def _stand_in(path: Path, dump: Path, stdout: str = "") -> Path:
    """An executable that appends its environment (JSON) to ``dump`` and prints ``stdout``."""
    path.write_text(f"""#!{os.path.realpath(os.sys.executable)}
import json, os, sys
with open({str(dump)!r}, "a") as handle:
    handle.write(json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ)}}) + "\\n")
print({stdout!r})
""")
    path.chmod(0o755)
    return path


def _dumps(dump: Path) -> list[dict]:
    return [json.loads(line) for line in dump.read_text().splitlines()]


def _clean(env: dict[str, str], tool: str) -> None:
    leaked = [k for k, v in env.items() if any(s in v for s in SECRETS.values())]
    assert not leaked, leaked
    from imgfab.docker.toolenv import COMMON, TOOLS  # after the leak check, which needs no list

    # the list, and what imgfab gives on purpose (BuildKit on; the key's password to sign)
    assert set(env) <= set(COMMON) | set(TOOLS[tool]) | {"DOCKER_BUILDKIT", "COSIGN_PASSWORD"}, set(env)


def test_the_docker_cli_gets_its_allow_list(tmp_path, monkeypatch, secrets_around):
    dump = tmp_path / "dump"
    monkeypatch.setenv("IMGFAB_DOCKER_CLI", str(_stand_in(tmp_path / "docker", dump, "--secret")))
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/engine.sock")
    engine.docker_cli()
    [call] = _dumps(dump)
    _clean(call["env"], "docker")
    assert call["env"]["DOCKER_BUILDKIT"] == "1" and call["env"]["DOCKER_HOST"] == "unix:///run/engine.sock"
    assert call["env"]["HTTPS_PROXY"] == "http://proxy.example:3128"


def test_docker_run_of_a_python_script_gets_its_allow_list(tmp_path, monkeypatch, secrets_around):
    from imgfab.docker.containers import run_python

    dump = tmp_path / "dump"
    monkeypatch.setenv("IMGFAB_DOCKER_CLI", str(_stand_in(tmp_path / "docker", dump)))
    run_python("img:1", "print(1)")
    [call] = _dumps(dump)
    _clean(call["env"], "docker")


def test_oras_gets_its_allow_list(tmp_path, monkeypatch, secrets_around):
    from imgfab.docker.credentials import Credentials
    from imgfab.supply.promote import oras_copy

    dump = tmp_path / "dump"
    monkeypatch.setenv("IMGFAB_ORAS", str(_stand_in(tmp_path / "oras", dump)))
    oras_copy("127.0.0.1:5000/a/x@sha256:" + "a" * 64, "127.0.0.1:5000/b/x:v1",
              Credentials("127.0.0.1:5000", "u", "s3cret-registry-pw"), None)
    [call] = _dumps(dump)
    _clean(call["env"], "oras")
    # its credentials went in a private config file it was pointed at, not in its environment
    assert "--from-registry-config" in call["argv"]


def test_cosign_gets_its_allow_list_and_a_password_only_to_sign(tmp_path, monkeypatch, secrets_around):
    from imgfab.docker.credentials import Credentials
    from imgfab.supply import cosign

    dump = tmp_path / "dump"
    monkeypatch.setenv("IMGFAB_COSIGN", str(_stand_in(tmp_path / "cosign", dump, "[]")))
    monkeypatch.setenv("IMGFAB_COSIGN_PASSWORD", "the-key-password")
    key = tmp_path / "cosign.key"
    key.write_text("k")
    key.chmod(0o600)  # cosign's own mode for a private key: a looser one is refused (issue 34)
    ref = "127.0.0.1:5000/a/x@sha256:" + "a" * 64
    credentials = Credentials("127.0.0.1:5000", "u", "s3cret-registry-pw")
    cosign.verify(ref, cosign.Trust(key=tmp_path / "cosign.pub"), credentials)
    cosign.sign(ref, key, credentials)
    *verifying, signing = _dumps(dump)
    for call in verifying:
        _clean(call["env"], "cosign")
        assert "COSIGN_PASSWORD" not in call["env"]  # neither imgfab's key password nor the parent's
    _clean(signing["env"], "cosign")
    assert signing["argv"][0] == "sign" and signing["env"]["COSIGN_PASSWORD"] == "the-key-password"
    assert Path(signing["env"]["DOCKER_CONFIG"]).name.startswith("imgfab-auth-")  # the private config


def test_git_gets_nothing_but_the_common_list(tmp_path, monkeypatch, secrets_around):
    from imgfab.supply.publish import _source_root

    dump = tmp_path / "dump"
    _stand_in(tmp_path / "git", dump, str(tmp_path))
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    _source_root(str(tmp_path / "recipe.yaml"))
    [call] = _dumps(dump)
    _clean(call["env"], "git")


def test_a_tool_without_a_list_is_refused():
    from imgfab.docker.toolenv import tool_env

    with pytest.raises(KeyError):
        tool_env("curl")


def test_a_credential_helper_gets_no_imgfab_setting_and_no_secret_named_variable(tmp_path, monkeypatch,
                                                                                 secrets_around):
    # the one child without an allow-list: it needs its own store's variables (here a D-Bus
    # session), which no list can name for every helper
    from imgfab.docker.credentials import _from_helper

    dump = tmp_path / "dump"
    _stand_in(tmp_path / "docker-credential-fake", dump, '{"Username": "u", "Secret": "s"}')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/user/1000/bus")
    _from_helper("r.example", "fake", "r.example")
    [call] = _dumps(dump)
    named = [k for k in call["env"] if k.startswith("IMGFAB_") or k in ("AWS_SECRET_ACCESS_KEY", "COSIGN_PASSWORD")]
    assert not named, named
    assert call["env"]["DBUS_SESSION_BUS_ADDRESS"] == "unix:path=/run/user/1000/bus"
