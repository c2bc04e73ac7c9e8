"""Registry credentials: where imgfab finds them (--registry-user with a password from stdin or
IMGFAB_REGISTRY_PASSWORD(_FILE), else the Docker config and its credential helpers), and how
they are kept out of every message (Credentials never shows its secret in a repr).

The credential helpers run without IMGFAB_* or secret-named variables in their environment.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgfab.errors import RegistryError

DOCKER_HUB = "docker.io"
_HUB_API = "registry-1.docker.io"


@dataclass(frozen=True)
class Credentials:
    """Who we are at one registry (``host[:port]``, the key Docker config uses too).

    ``username=None`` means anonymous. ``identity_token`` is an OAuth refresh token some
    credential helpers hand out instead of a password. ``repr`` masks both secrets.
    """

    registry: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    identity_token: str | None = field(default=None, repr=False)
    source: str = "anonymous"

    def __repr__(self) -> str:
        secret = "***" if (self.password or self.identity_token) else None
        return (f"Credentials(registry={self.registry!r}, username={self.username!r}, "
                f"password={secret!r}, source={self.source!r})")

    __str__ = __repr__

    @property
    def anonymous(self) -> bool:
        return not (self.username and self.password) and not self.identity_token

    def auth_config(self) -> dict[str, str] | None:
        """The dict the docker SDK / Engine API takes as ``X-Registry-Auth``."""
        if self.identity_token:
            return {"identitytoken": self.identity_token, "serveraddress": self.registry}
        if self.anonymous:
            return None
        return {"username": str(self.username), "password": str(self.password),
                "serveraddress": self.registry}

    @classmethod
    def load(cls, registry: str, user: str | None = None,
             password: str | None = None) -> "Credentials":
        """Credentials for ``registry``, first match wins:

        1. ``user`` + a password: ``password`` (e.g. from ``--password-stdin``), else
           ``$IMGFAB_REGISTRY_PASSWORD``, else the file ``$IMGFAB_REGISTRY_PASSWORD_FILE``.
           ``user`` defaults to ``$IMGFAB_REGISTRY_USER`` when ``registry`` is ``$IMGFAB_REGISTRY``.
        2. The Docker config (``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``):
           ``credHelpers[registry]``, else ``credsStore``, else ``auths[registry]``; helpers
           run as ``docker-credential-<helper> get``.
        3. Anonymous.

        Raises :class:`RegistryError` when a user is named but no password is found, or a
        credential helper is missing or fails.
        """
        if user is None and registry == os.environ.get("IMGFAB_REGISTRY"):
            user = os.environ.get("IMGFAB_REGISTRY_USER") or None
        if user:
            secret = password if password is not None else _password_from_env()
            if secret:
                return cls(registry, user, secret, source="explicit")
            stored = _from_docker_config(registry)
            if stored is not None and stored.username == user:
                return stored
            raise RegistryError(f"no password for user {user} at registry {registry}",
                                field="registry",
                                fix="pipe it to --password-stdin, or set IMGFAB_REGISTRY_PASSWORD"
                                    " / IMGFAB_REGISTRY_PASSWORD_FILE, or docker login")
        stored = _from_docker_config(registry)
        return stored if stored is not None else cls(registry)


def _password_from_env() -> str | None:
    if os.environ.get("IMGFAB_REGISTRY_PASSWORD"):
        return os.environ["IMGFAB_REGISTRY_PASSWORD"]
    path = os.environ.get("IMGFAB_REGISTRY_PASSWORD_FILE")
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").rstrip("\r\n") or None
    except OSError as exc:
        raise RegistryError(f"cannot read IMGFAB_REGISTRY_PASSWORD_FILE {path}: {exc.strerror}",
                            field="registry", fix="point it at a readable file") from None


def _docker_config() -> tuple[Path, dict[str, Any]]:
    base = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    path = base / "config.json"
    if not path.is_file():
        return path, {}
    try:
        return path, json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RegistryError(f"cannot read Docker config {path}: {exc}", field="registry",
                            fix="fix or remove the file, then docker login again") from None


def _config_keys(registry: str) -> list[str]:
    keys = [registry, f"https://{registry}", f"http://{registry}", f"https://{registry}/v1/",
            f"https://{registry}/v2/"]
    if registry in (DOCKER_HUB, "index.docker.io", _HUB_API):
        keys = ["https://index.docker.io/v1/", "index.docker.io", DOCKER_HUB, *keys]
    return keys


def _from_docker_config(registry: str) -> Credentials | None:
    path, config = _docker_config()
    keys = _config_keys(registry)
    helpers = config.get("credHelpers") or {}
    for key in keys:
        if key in helpers:
            return _from_helper(registry, helpers[key], key)
    auths = config.get("auths") or {}
    if config.get("credsStore"):
        found = _from_helper(registry, config["credsStore"], keys[0])
        if found is not None:
            return found
    for key in keys:
        entry = auths.get(key)
        if not entry:
            continue
        if entry.get("identitytoken"):
            return Credentials(registry, entry.get("username") or "<token>",
                               identity_token=entry["identitytoken"], source=str(path))
        if entry.get("auth"):
            try:
                user, _, secret = base64.b64decode(entry["auth"]).decode("utf-8").partition(":")
            except (ValueError, UnicodeDecodeError):
                raise RegistryError(f"the auths entry for {key} in {path} is not base64 user:password",
                                    field="registry", fix=f"docker login {registry}") from None
            return Credentials(registry, user, secret, source=str(path))
        if entry.get("username") and entry.get("password"):
            return Credentials(registry, entry["username"], entry["password"], source=str(path))
    return None


def _from_helper(registry: str, helper: str, server: str) -> Credentials | None:
    program = f"docker-credential-{helper}"
    if shutil.which(program) is None:
        raise RegistryError(f"the Docker config names credential helper {helper!r} but "
                            f"{program} is not on PATH", field="registry",
                            fix=f"install {program}, or remove it from the Docker config")
    try:
        from imgfab.docker.toolenv import helper_env  # noqa: PLC0415

        result = subprocess.run([program, "get"], input=server, capture_output=True, text=True,
                                timeout=30, check=False, env=helper_env())
    except subprocess.TimeoutExpired:
        raise RegistryError(f"{program} get did not answer within 30s", field="registry",
                            fix="unlock the keychain / check the helper") from None
    if result.returncode != 0:
        if "credentials not found" in (result.stdout + result.stderr).lower():
            return None
        raise RegistryError(f"{program} get failed (exit {result.returncode})",
                            field="registry", fix=f"run: echo {server} | {program} get")
    try:
        answer = json.loads(result.stdout)
    except ValueError:
        raise RegistryError(f"{program} get printed no JSON", field="registry",
                            fix=f"run: echo {server} | {program} get") from None
    if answer.get("Username") == "<token>":
        return Credentials(registry, "<token>", identity_token=answer.get("Secret"),
                           source=program)
    return Credentials(registry, answer.get("Username"), answer.get("Secret"), source=program)
