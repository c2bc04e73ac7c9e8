"""The environment of each external tool imgfab runs: an allow-list per tool (issue 34).

A child process inherits nothing but what its tool needs to find itself, its configuration and
the network: a registry password, a pip index URL with credentials, a cloud key or any other
secret in imgfab's own environment never reaches docker, cosign, oras or git. What a tool is
given on purpose (``DOCKER_BUILDKIT=1``, a private ``DOCKER_CONFIG``, ``COSIGN_PASSWORD`` for
signing only) is passed as ``extra`` by the caller, never inherited.

Why each name (the tools' own documentation):

- every tool: ``PATH`` and ``HOME`` (where it and its configuration live), ``TMPDIR``, the locale
  and ``TZ``; ``SSL_CERT_FILE``/``SSL_CERT_DIR`` (a private CA, Go's crypto/x509 reads both) and
  the proxy variables (Go's net/http ProxyFromEnvironment: ``HTTP(S)_PROXY``, ``NO_PROXY``,
  either case), without which a registry behind a proxy is unreachable;
- docker: ``DOCKER_HOST``, ``DOCKER_CONTEXT``, ``DOCKER_CONFIG`` (its config and credential
  helpers), ``DOCKER_CERT_PATH``, ``DOCKER_TLS_VERIFY``, ``DOCKER_API_VERSION`` (the CLI's
  environment variables, docs.docker.com/reference/cli/docker/#environment-variables),
  ``BUILDX_CONFIG`` and ``BUILDX_BUILDER`` (buildx), ``XDG_RUNTIME_DIR`` (a rootless engine's
  socket);
- cosign: ``DOCKER_CONFIG`` (registry credentials, go-containerregistry's keychain),
  ``COSIGN_REPOSITORY`` and ``COSIGN_DOCKER_MEDIA_TYPES`` (where and how signatures are stored:
  verification must look where signing wrote), ``TUF_ROOT`` and the ``SIGSTORE_*`` trust-root
  files (``cosign env``); ``COSIGN_PASSWORD`` is never inherited: the caller passes the key's
  password to ``cosign sign`` and ``cosign attest`` only;
- oras: ``DOCKER_CONFIG`` (its default credential store; imgfab passes private
  ``--from/--to-registry-config`` files whenever it has credentials);
- git: nothing else (``git rev-parse`` of the recipe's own checkout).

A credential helper (``docker-credential-<name> get``) is the one child without an allow-list:
it is the user's own program for reaching the user's credential store (a keychain over D-Bus, a
GPG agent, a cloud CLI's configuration), whose variables no list can name for every helper. It
gets :func:`helper_env`: this environment without imgfab's own settings and without any
variable named like a secret.
"""

from __future__ import annotations

import os
import re

# Every tool: finding itself and its configuration, the locale, the network's CA and proxies.
COMMON = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "SSL_CERT_FILE",
          "SSL_CERT_DIR", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
          "no_proxy")
TOOLS: dict[str, tuple[str, ...]] = {
    "docker": ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_CERT_PATH",
               "DOCKER_TLS_VERIFY", "DOCKER_API_VERSION", "BUILDX_CONFIG", "BUILDX_BUILDER",
               "XDG_RUNTIME_DIR"),
    "cosign": ("DOCKER_CONFIG", "COSIGN_REPOSITORY", "COSIGN_DOCKER_MEDIA_TYPES", "TUF_ROOT",
               "SIGSTORE_ROOT_FILE", "SIGSTORE_REKOR_PUBLIC_KEY", "SIGSTORE_CT_LOG_PUBLIC_KEY_FILE"),
    "oras": ("DOCKER_CONFIG",),
    "git": (),
}


def tool_env(tool: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment to run ``tool`` (a key of :data:`TOOLS`) with: the variables of
    :data:`COMMON` and of the tool's own list that are set here, then ``extra``. KeyError for a
    tool with no list (a new tool needs one)."""
    allowed = COMMON + TOOLS[tool]
    env = {name: os.environ[name] for name in allowed if name in os.environ}
    env.update(extra or {})
    return env


# What a credential helper never inherits: imgfab's own settings (the registry password, a pip
# index URL with credentials) and anything named like a secret.
_SECRET_NAME = re.compile(r"^IMGFAB_|PASSWORD|PASSWD|TOKEN|SECRET|CREDENTIAL|API_?KEY",
                          re.IGNORECASE)


def helper_env() -> dict[str, str]:
    """A credential helper's environment: this one's, without :data:`_SECRET_NAME` variables."""
    return {key: value for key, value in os.environ.items() if not _SECRET_NAME.search(key)}
