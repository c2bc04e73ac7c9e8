"""The only module that talks to a registry's HTTP API (Docker Registry HTTP API V2 / OCI
distribution), through ``requests``; pushes go through the daemon (:func:`imgfab.engine.push_image`).

Scheme: plain http for loopback (127.0.0.0/8, ``localhost``, ``::1``), https elsewhere.
Auth: anonymous first; on a 401 the ``WWW-Authenticate`` challenge picks Basic (htpasswd
registries, the local stack) or Bearer (token server: ``realm``/``service``/``scope``, asked
with Basic credentials). Every failure is one :class:`~imgfab.errors.RegistryError` line with
the fix. Passwords never reach a log line, an error message or a ``repr``.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from imgfab.errors import RegistryError

MANIFEST_ACCEPT = ", ".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))
_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")
DOCKER_HUB = "docker.io"
_HUB_API = "registry-1.docker.io"
_TIMEOUT = (5, 60)  # (connect, read) seconds
# Backoff before attempt n+1 of a push: BACKOFF_S * 2**(n-1), capped at 30 s.
BACKOFF_S = 1.0
# Daemon/registry messages that mean "the network or the server hiccuped": worth a retry.
_TRANSIENT = re.compile(
    r"connection reset|connection refused|broken pipe|\bEOF\b|timeout|timed out|"
    r"temporarily unavailable|no route to host|unexpected HTTP status: 5\d\d|"
    r"status(?: code)?:? 5\d\d|\b50[0-4]\b|too many requests|\b429\b", re.IGNORECASE)
# Pagination: at most this many pages of tags (100 000 tags at the default page size).
MAX_PAGES = 1000
# Anything a terminal would interpret (C0/C1 controls, DEL): never echoed from a registry.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_AUTH = re.compile(r"unauthorized|authentication required|denied|\b401\b|\b403\b|"
                   r"no basic auth credentials", re.IGNORECASE)


# --- references -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference: ``host/repository[:tag][@digest]`` (Docker's normalisation:
    no host → ``docker.io``, one-component Hub names get ``library/``)."""

    host: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, ref: str) -> "ImageRef":
        text = ref.strip()
        if not text or any(ch.isspace() for ch in text):
            raise RegistryError(f"{ref!r} is not an image reference", field="image",
                                fix="use host/repository:tag, e.g. 127.0.0.1:5000/llm/qwen:v1")
        name, _, digest = text.partition("@")
        first, slash, rest = name.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            host, path = first, rest
        else:
            host, path = DOCKER_HUB, name
        tag = None
        if ":" in path.rsplit("/", 1)[-1]:
            path, tag = path.rsplit(":", 1)
        if host == DOCKER_HUB and "/" not in path:
            path = f"library/{path}"
        if not re.fullmatch(r"[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*",
                            path) or (digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest)):
            raise RegistryError(f"{ref!r} is not an image reference", field="image",
                                fix="lower-case host/repository:tag or @sha256:<64 hex>")
        return cls(host, path, tag, digest or None)

    @property
    def name(self) -> str:
        """``host/repository`` as the daemon spells it."""
        return f"{self.host}/{self.repository}"

    @property
    def reference(self) -> str:
        """What goes after ``/manifests/``: the digest if pinned, else the tag (default latest)."""
        return self.digest or self.tag or "latest"


def _api_host(host: str) -> str:
    return _HUB_API if host in (DOCKER_HUB, "index.docker.io") else host


def _is_loopback(host: str) -> bool:
    """``host`` (``name``, ``name:port``, ``[v6]:port`` or a bare IP) is this machine."""
    if host.startswith("["):  # [::1]:5000
        bare = host[1:].split("]", 1)[0]
    else:
        bare = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if bare == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def _scheme(host: str) -> str:
    return "http" if _is_loopback(host) else "https"


def printable(text: str, limit: int = 300) -> str:
    """Registry-supplied ``text`` made safe to print: control characters (terminal escapes,
    newlines) become spaces, and at most ``limit`` characters are kept."""
    clean = " ".join(_CONTROL.sub(" ", str(text)).split())
    return clean if len(clean) <= limit else clean[:limit] + "…"


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, the port made explicit."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        port = -1
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


# --- credentials ------------------------------------------------------------------------------

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
        from imgfab.engine import child_env  # noqa: PLC0415

        result = subprocess.run([program, "get"], input=server, capture_output=True, text=True,
                                timeout=30, check=False, env=child_env())
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


# --- the HTTP client --------------------------------------------------------------------------

class _Client:
    """One registry, one credential set; answers a 401 challenge once per scope."""

    def __init__(self, credentials: Credentials):
        import requests  # noqa: PLC0415 - lazy: `imgfab --help` needs no HTTP stack

        self.credentials = credentials
        self.host = credentials.registry
        self.base = f"{_scheme(self.host)}://{_api_host(self.host)}"
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "imgfab"
        self._authorization: dict[str, str] = {}  # scope → Authorization header value

    def request(self, method: str, path: str, *, scope: str, headers: dict[str, str] | None = None,
                allow: tuple[int, ...] = ()) -> Any:
        """``method`` ``path`` (or an absolute URL); returns the response when its status is
        2xx or in ``allow``; raises :class:`RegistryError` otherwise."""
        url = self.resolve(path)
        response = self._send(method, url, scope, headers)
        if response.status_code == 401 and scope not in self._authorization:
            self._authorization[scope] = self._answer(response, scope)
            response = self._send(method, url, scope, headers)
        if response.status_code == 401:
            raise self._refused(401)
        if response.status_code == 403:
            raise self._refused(403, scope)
        if response.ok or response.status_code in allow:
            return response
        raise RegistryError(f"registry {self.host} answered {response.status_code} to "
                            f"{method} {url.split('?')[0]}: {_error_text(response)}",
                            field="registry", fix="check the reference and the registry log")

    def resolve(self, path: str, relative_to: str | None = None) -> str:
        """``path`` (a path, or a URL the registry sent) resolved against ``relative_to`` (the
        URL it came with), else this registry's base. A URL on another scheme, host or port raises :class:`RegistryError`: the credentials
        issued for this registry never go anywhere else."""
        url = urllib.parse.urljoin(relative_to or self.base + "/", path)
        if _origin(url) != _origin(self.base):
            raise RegistryError(f"registry {self.host} pointed imgfab at another server "
                                f"({printable(urllib.parse.urlsplit(url).netloc, 80)}); "
                                "its credentials are not sent there", field="registry",
                                fix="use the registry's own host, or check for a man in the middle")
        return url

    def _send(self, method: str, url: str, scope: str, headers: dict[str, str] | None) -> Any:
        import requests  # noqa: PLC0415

        merged = dict(headers or {})
        if scope in self._authorization and _origin(url) == _origin(self.base):
            merged["Authorization"] = self._authorization[scope]
        try:
            return self.session.request(method, url, headers=merged, timeout=_TIMEOUT)
        except requests.exceptions.RequestException as exc:
            raise _unreachable(self.host, exc) from None

    def _answer(self, response: Any, scope: str) -> str:
        challenge = response.headers.get("WWW-Authenticate", "")
        kind, _, rest = challenge.partition(" ")
        params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if self.credentials.anonymous and kind.lower() == "basic":
            raise RegistryError(f"registry {self.host} needs credentials and none were found",
                                field="registry",
                                fix=f"pass --registry-user and --password-stdin, or docker login {self.host}")
        if kind.lower() == "basic":
            raw = f"{self.credentials.username}:{self.credentials.password}".encode()
            return "Basic " + base64.b64encode(raw).decode()
        if kind.lower() == "bearer" and params.get("realm"):
            realm = urllib.parse.urlsplit(params["realm"])
            if realm.scheme != "https" and not (realm.scheme == "http"
                                                and _is_loopback(realm.hostname or "")):
                raise RegistryError(f"registry {self.host} sent a token realm that is not https "
                                    f"({printable(params['realm'], 80)}); no credentials sent",
                                    field="registry",
                                    fix="configure the registry's token service with an https realm")
            return "Bearer " + self._token(params, scope)
        raise RegistryError(f"registry {self.host} sent an auth challenge imgfab does not "
                            f"speak: {printable(kind, 40) or 'none'}", field="registry",
                            fix="use a registry with Basic or Bearer token auth")

    def _token(self, params: dict[str, str], scope: str) -> str:
        import requests  # noqa: PLC0415

        query = {"service": params.get("service", ""), "scope": params.get("scope") or scope}
        auth = None
        if self.credentials.identity_token:
            query.update(grant_type="refresh_token", refresh_token=self.credentials.identity_token)
        elif not self.credentials.anonymous:
            auth = (str(self.credentials.username), str(self.credentials.password))
        try:
            answer = self.session.get(params["realm"], params={k: v for k, v in query.items() if v},
                                      auth=auth, timeout=_TIMEOUT)
        except requests.exceptions.RequestException as exc:
            raise _unreachable(printable(params["realm"], 80), exc) from None
        if answer.status_code in (401, 403):
            raise self._refused(answer.status_code)
        if not answer.ok:
            raise RegistryError(f"token server {printable(params['realm'], 80)} answered {answer.status_code}",
                                field="registry", fix="check the registry's token service")
        body = answer.json()
        token = body.get("token") or body.get("access_token")
        if not token:
            raise RegistryError(f"token server {printable(params['realm'], 80)} returned no token",
                                field="registry", fix="check the registry's token service")
        return str(token)

    def _refused(self, status: int, scope: str = "") -> RegistryError:
        if self.credentials.anonymous:
            return RegistryError(f"registry {self.host} refused anonymous access ({status})",
                                 field="registry",
                                 fix="pass --registry-user and --password-stdin, or docker login")
        what = f" for {scope}" if status == 403 and scope else ""
        return RegistryError(
            f"registry {self.host} refused the credentials for user "
            f"{self.credentials.username} ({status}){what}",
            fix="check --registry-user / the password")


def _error_text(response: Any) -> str:
    try:
        errors = response.json().get("errors") or []
        text = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors) or response.reason
    except (ValueError, AttributeError):
        text = str(response.reason)
    return printable(str(text))


def _unreachable(host: str, exc: BaseException) -> RegistryError:
    text = str(exc)
    if "refused" in text.lower():
        why = "connection refused"
    elif "timed out" in text.lower() or "timeout" in text.lower():
        why = "timed out"
    elif "reset" in text.lower() or "aborted" in text.lower():
        why = "connection reset"
    elif "name or service not known" in text.lower() or "resolve" in text.lower():
        why = "unknown host"
    else:
        why = exc.__class__.__name__
    return RegistryError(f"cannot reach registry {host}: {why}",
                         fix="is it running? (scripts/local-stack.sh up)")


def _client_for(ref: ImageRef, credentials: Credentials | None) -> _Client:
    # Credentials are keyed by host[:port]: ones for another host are never sent here.
    if credentials is None or credentials.registry != ref.host:
        credentials = Credentials.load(ref.host)
    return _Client(credentials)


def _pull_scope(ref: ImageRef) -> str:
    return f"repository:{ref.repository}:pull"


# --- read API ---------------------------------------------------------------------------------

def _manifest_digest(client: _Client, ref: ImageRef) -> str:
    path = f"/v2/{ref.repository}/manifests/{ref.reference}"
    response = client.request("HEAD", path, scope=_pull_scope(ref),
                              headers={"Accept": MANIFEST_ACCEPT}, allow=(404,))
    if response.status_code == 404:
        raise RegistryError(f"{ref.name}:{ref.reference} is not in registry {ref.host}",
                            field="image", fix="check the repository and tag (imgfab push it first?)")
    digest = response.headers.get("Docker-Content-Digest")
    if not digest:  # some registries omit it on HEAD: hash the manifest bytes instead
        body = client.request("GET", path, scope=_pull_scope(ref),
                              headers={"Accept": MANIFEST_ACCEPT}).content
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
    return digest


def resolve_digest(ref: str, credentials: Credentials | None = None) -> str:
    """``ref@sha256:…`` for the manifest (or index) ``ref`` names now, by a HEAD on
    ``/v2/<name>/manifests/<tag>`` accepting OCI index/manifest and Docker v2 list/manifest.

    The tag stays in the result (``host/repo:tag@sha256:…``) for readers; the daemon uses the
    digest. ``credentials=None`` loads them for the ref's host (:meth:`Credentials.load`).
    Raises :class:`RegistryError` (unknown tag, refused, unreachable).
    """
    parsed = ImageRef.parse(ref)
    digest = _manifest_digest(_client_for(parsed, credentials), parsed)
    return f"{ref.split('@', 1)[0]}@{digest}"


def list_tags(repository_ref: str, credentials: Credentials | None = None, *,
              page_size: int = 100) -> list[str]:
    """Every tag of ``repository_ref`` (``host/repository``; a tag on it is ignored), in the
    registry's order, following ``Link: <…>; rel="next"`` pages of ``?n=page_size``.

    A repository the registry does not know has no tags: ``[]``.
    """
    parsed = ImageRef.parse(repository_ref)
    client = _client_for(parsed, credentials)
    url: str | None = client.resolve(f"/v2/{parsed.repository}/tags/list?n={page_size}")
    tags: list[str] = []
    visited: set[str] = set()
    while url:
        if url in visited or len(visited) >= MAX_PAGES:
            raise RegistryError(f"registry {parsed.host} paginated the tags of "
                                f"{parsed.repository} in a loop or past {MAX_PAGES} pages",
                                field="registry", fix="check the registry's Link headers")
        visited.add(url)
        response = client.request("GET", url, scope=_pull_scope(parsed), allow=(404,))
        if response.status_code == 404:
            return tags
        try:
            page = response.json().get("tags") or []
        except (ValueError, AttributeError):
            page = None
        if not isinstance(page, list) or not all(isinstance(t, str) for t in page):
            raise RegistryError(f"registry {parsed.host} answered the tag list of "
                                f"{parsed.repository} with something that is not a list of tags",
                                field="registry", fix="check the registry")
        tags.extend(page)
        url = _next_link(response.headers.get("Link", ""), client, url)
    return tags


def _next_link(header: str, client: _Client, page: str) -> str | None:
    """The ``rel="next"`` URL of a ``Link`` header, resolved against the ``page`` it came with (a
    link to another scheme, host or port raises :class:`RegistryError`)."""
    match = re.search(r'<([^>]+)>\s*;\s*rel="?next"?', header)
    if not match:
        return None
    return client.resolve(match.group(1), page)


def image_config(ref: str, credentials: Credentials | None = None, *,
                 platform: str = "linux/amd64") -> dict[str, Any]:
    """The image config blob of ``ref`` (``config.Labels``, ``config.Env``, ``rootfs``, …).

    A manifest list / OCI index is resolved to its ``platform`` entry (default
    ``linux/amd64``). The blob's sha256 is checked against the manifest.
    """
    parsed = ImageRef.parse(ref)
    client = _client_for(parsed, credentials)
    scope = _pull_scope(parsed)
    manifest = _get_manifest(client, parsed, parsed.reference)
    if manifest.get("mediaType") in _INDEX_TYPES or "manifests" in manifest:
        os_name, _, arch = platform.partition("/")
        entries = manifest.get("manifests")
        entries = [m for m in entries if isinstance(m, dict)] if isinstance(entries, list) else []

        def platform_of(entry: dict[str, Any]) -> tuple[Any, Any]:
            where = entry.get("platform") if isinstance(entry.get("platform"), dict) else {}
            return where.get("os"), where.get("architecture")

        choices = [m for m in entries if platform_of(m) == (os_name, arch)]
        if not choices:
            offered = sorted({printable(f"{o}/{a}", 40) for o, a in map(platform_of, entries)})
            raise RegistryError(f"{ref} has no {platform} image (offers {', '.join(offered)})",
                                field="image", fix="pick a multi-arch tag that includes it")
        manifest = _get_manifest(client, parsed, _checked_digest(choices[0].get("digest"), ref))
    config = manifest.get("config")
    digest = config.get("digest") if isinstance(config, dict) else None
    if not digest:
        raise RegistryError(f"{ref}: the manifest names no config blob", field="image",
                            fix="schema 1 manifests are not supported; re-push the image")
    digest = _checked_digest(digest, ref)
    body = client.request("GET", f"/v2/{parsed.repository}/blobs/{digest}", scope=scope).content
    if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
        raise RegistryError(f"{ref}: config blob does not match its digest {digest}",
                            field="image", fix="the registry storage is corrupt; re-push")
    try:
        return json.loads(body)
    except ValueError:
        raise RegistryError(f"{printable(ref, 200)}: the config blob is not JSON", field="image",
                            fix="rebuild and re-push the image") from None


def _checked_digest(digest: Any, ref: str) -> str:
    """``digest`` when it is ``sha256:<64 hex>``; RegistryError otherwise (it becomes a URL path)."""
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise RegistryError(f"{printable(ref, 200)}: the manifest names a digest that is not "
                            f"sha256:<64 hex> ({printable(str(digest), 40)})", field="image",
                            fix="re-push the image")
    return digest


def image_labels(ref: str, credentials: Credentials | None = None) -> dict[str, str]:
    """The ``config.Labels`` of ``ref``'s image config (empty when it has none); a config
    whose labels are not a mapping of strings raises :class:`RegistryError`."""
    config = image_config(ref, credentials)
    section = config.get("config") if isinstance(config, dict) else None
    labels = (section.get("Labels") if isinstance(section, dict) else None) or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in labels.items()):
        raise RegistryError(f"{printable(ref, 200)}: the image config's labels are not a "
                            "mapping of strings", field="image", fix="rebuild the image")
    return labels

def _get_manifest(client: _Client, ref: ImageRef, reference: str) -> dict[str, Any]:
    response = client.request("GET", f"/v2/{ref.repository}/manifests/{reference}",
                              scope=_pull_scope(ref), headers={"Accept": MANIFEST_ACCEPT},
                              allow=(404,))
    if response.status_code == 404:
        raise RegistryError(f"{ref.name}:{reference} is not in registry {ref.host}",
                            field="image", fix="check the repository and tag")
    try:
        manifest = response.json()
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        raise RegistryError(f"{ref.name}:{printable(reference, 80)}: the manifest is not a JSON "
                            "object", field="image", fix="re-push the image")
    return manifest


def retarget(image: str, registry: str) -> str:
    """``image``'s repository and tag on ``registry``: ``llm/qwen:v1`` → ``HOST/llm/qwen:v1``
    (a host already in ``image`` is replaced; no tag means ``latest``)."""
    parsed = ImageRef.parse(image)
    repository = parsed.repository
    if parsed.host == DOCKER_HUB and "/" not in image.split("@")[0]:
        repository = repository.removeprefix("library/")
    return f"{registry}/{repository}:{parsed.tag or 'latest'}"


# --- push -------------------------------------------------------------------------------------

def is_transient(message: str) -> bool:
    """True for failures worth another attempt (resets, refusals, timeouts, 5xx, 429);
    never for auth failures."""
    return not _AUTH.search(message) and bool(_TRANSIENT.search(message))


def push(local_ref: str, target_ref: str, *, credentials: Credentials, attempts: int = 5,
         on_line: Callable[[str], None] | None = None) -> str:
    """Tag ``local_ref`` as ``target_ref``, push it through the daemon, return
    ``host/repo@sha256:…``.

    Each attempt first checks the credentials against the registry (``GET /v2/`` with a push
    scope), so a wrong password fails before any blob moves, and is not retried. Transient
    failures (connection reset/refused, timeouts, 5xx) are retried up to ``attempts`` times
    with exponential backoff. The digest comes from the push stream's ``aux.Digest`` and is
    cross-checked with a HEAD on the pushed tag. ``on_line`` receives progress and retry lines.
    """
    target = ImageRef.parse(target_ref)
    if target.digest:
        raise RegistryError(f"cannot push to a digest reference {target_ref}", field="image",
                            fix="push to a tag: host/repository:tag")
    if credentials.registry != target.host:
        raise RegistryError(f"credentials are for {credentials.registry}, the target is on "
                            f"{target.host}", field="registry",
                            fix=f"load credentials for {target.host}")
    tag = target.tag or "latest"
    last: RegistryError | None = None
    for attempt in range(1, max(1, attempts) + 1):
        if attempt > 1:
            delay = min(30.0, BACKOFF_S * 2 ** (attempt - 2))
            if on_line is not None:
                on_line(f"retrying push of {target.name}:{tag} in {delay:.1f}s "
                        f"(attempt {attempt}/{attempts}) after: {last.message if last else ''}")
            time.sleep(delay)
        try:
            return _push_once(local_ref, target, tag, credentials, on_line)
        except RegistryError as error:
            if not is_transient(error.message):
                if _AUTH.search(error.message) and "refused" not in error.message:
                    raise _Client(credentials)._refused(401) from None
                raise
            last = error
    assert last is not None
    raise RegistryError(f"{last.message} (gave up after {attempts} attempts)",
                        field=last.field, fix=last.fix or "check the registry and the network")


def _push_once(local_ref: str, target: ImageRef, tag: str, credentials: Credentials,
               on_line: Callable[[str], None] | None) -> str:
    from imgfab.engine import push_image  # noqa: PLC0415

    client = _Client(credentials)
    # The auth check: /v2/ answers 401 to a wrong password before anything is uploaded.
    client.request("GET", "/v2/", scope=f"repository:{target.repository}:pull,push")
    pushed = push_image(local_ref, target.name, tag, auth_config=credentials.auth_config(),
                        on_line=on_line)
    head = _manifest_digest(client, ImageRef(target.host, target.repository, tag))
    if head != pushed:
        raise RegistryError(f"pushed {target.name}:{tag} as {pushed} but the registry now "
                            f"serves {head}", field="registry",
                            fix="another push raced this one; push again")
    return f"{target.name}@{pushed}"
