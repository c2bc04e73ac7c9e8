"""The registry HTTP client: image references, the scheme per host (plain http only on loopback),
the Basic/Bearer challenge and token, and the redirect and realm rules that keep credentials
with their registry (a link or realm on another scheme, host or port is refused; a Bearer
realm must be https except on loopback). Registry text is printed without control characters.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from imgfab.docker import http_bounds
from imgfab.docker.credentials import _HUB_API, DOCKER_HUB, Credentials
from imgfab.errors import RegistryError


MANIFEST_ACCEPT = ", ".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))
_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")
_TIMEOUT = (5, 60)  # (connect, read) seconds, each bounded by what is left of DEADLINE_S
# The overall wall-clock bound of one request: redirects, the 401 round and the token included.
DEADLINE_S = 120.0
# Body caps, in bytes, by what the body is. The OCI distribution spec has registries accept
# manifests up to 4 MiB; a config is JSON metadata (a few KiB, rarely 1 MiB); a token a JWT.
LIMITS = {"manifest": 4 << 20, "config": 16 << 20, "tags": 4 << 20, "token": 256 << 10,
          "error": 64 << 10, "empty": 64 << 10}


# Anything a terminal would interpret (C0/C1 controls, DEL): never echoed from a registry.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# A tag as the OCI distribution spec defines it (it becomes a URL path segment).
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
# A bearer token as it may go into a header: printable ASCII, no spaces.
_TOKEN = re.compile(r"[\x21-\x7e]{1,65536}")
_AUTH = re.compile(r"unauthorized|authentication required|denied|\b401\b|\b403\b|"
                   r"no basic auth credentials", re.IGNORECASE)


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
                            path) or (digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest)) \
                or (tag is not None and not _TAG.fullmatch(tag)):
            raise RegistryError(f"{printable(repr(ref), 200)} is not an image reference", field="image",
                                fix="lower-case host/repository, a tag of [A-Za-z0-9_.-] "
                                    "(at most 128), or @sha256:<64 hex>")
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


class _Client:
    """One registry, one credential set; answers a 401 challenge once per scope."""

    def __init__(self, credentials: Credentials):
        import requests  # noqa: PLC0415 - lazy: `imgfab --help` needs no HTTP stack

        self.credentials = credentials
        self.host = credentials.registry
        self.base = f"{_scheme(self.host)}://{_api_host(self.host)}"
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "imgfab"
        self.session.max_redirects = 5
        http_bounds.mount(self.session)
        self._authorization: dict[str, str] = {}  # scope → Authorization header value

    def request(self, method: str, path: str, *, scope: str, headers: dict[str, str] | None = None,
                allow: tuple[int, ...] = (), body: str = "empty") -> Any:
        """``method`` ``path`` (or an absolute URL); returns the response when its status is
        2xx or in ``allow``; raises :class:`RegistryError` otherwise.

        ``body`` names what a 2xx body is (a key of :data:`LIMITS`): its cap. The whole call,
        redirects and the auth round included, ends within :data:`DEADLINE_S` seconds."""
        url = self.resolve(path)
        with http_bounds.deadline(DEADLINE_S):
            response = self._send(method, url, scope, headers, body)
            if response.status_code == 401 and scope not in self._authorization:
                self._authorization[scope] = self._answer(response, scope)
                response = self._send(method, url, scope, headers, body)
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

    def _send(self, method: str, url: str, scope: str, headers: dict[str, str] | None,
              body: str, **extra: Any) -> Any:
        merged = dict(headers or {})
        if scope in self._authorization and _origin(url) == _origin(self.base):
            merged["Authorization"] = self._authorization[scope]
        return self._bounded(self.host, method, url, body, headers=merged, **extra)

    def _bounded(self, who: str, method: str, url: str, body: str, **extra: Any) -> Any:
        """One ``requests`` call inside the current deadline, its body read under the cap of
        ``body`` (error text and redirects under the ``error`` cap)."""
        import requests  # noqa: PLC0415

        def capped(response: Any, **_: Any) -> Any:
            ok = 200 <= response.status_code < 300
            http_bounds.read_capped(response, LIMITS[body if ok else "error"],
                                    f"the {body if ok else 'error'} body from {who}")
            return response

        with http_bounds.deadline(DEADLINE_S) as window:
            left = window.remaining()
            timeout = (min(_TIMEOUT[0], left), min(_TIMEOUT[1], left))
            try:
                response = self.session.request(method, url, timeout=timeout, stream=True,
                                                hooks={"response": [capped]}, **extra)
            except (requests.exceptions.RequestException, OSError) as exc:
                if window.expired:
                    raise _late(who) from None
                raise _unreachable(who, exc) from None
            if window.expired:  # cut off mid-headers: what was parsed is not an answer
                raise _late(who)
            return response

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
        query = {"service": params.get("service", ""), "scope": params.get("scope") or scope}
        auth = None
        if self.credentials.identity_token:
            query.update(grant_type="refresh_token", refresh_token=self.credentials.identity_token)
        elif not self.credentials.anonymous:
            auth = (str(self.credentials.username), str(self.credentials.password))
        server = f"token server {printable(params['realm'], 80)}"
        answer = self._bounded(server, "GET", params["realm"], "token",
                               params={k: v for k, v in query.items() if v}, auth=auth)
        if answer.status_code in (401, 403):
            raise self._refused(answer.status_code)
        if not answer.ok:
            raise RegistryError(f"{server} answered {answer.status_code}",
                                field="registry", fix="check the registry's token service")
        body = parse_json(answer.content)
        if not isinstance(body, dict):
            raise RegistryError(f"{server} answered with something that is not a JSON object "
                                f"({printable(answer.headers.get('Content-Type', 'no type'), 60)})",
                                field="registry", fix="check the registry's token service")
        token = body.get("token") or body.get("access_token")
        if not token:
            raise RegistryError(f"{server} returned no token",
                                field="registry", fix="check the registry's token service")
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise RegistryError(f"{server} returned a token that is not a printable string",
                                field="registry", fix="check the registry's token service")
        return token

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


_NOT_JSON = object()


def parse_json(body: bytes) -> Any:
    """``body`` parsed as JSON, or a sentinel that is no dict or list when it is not JSON (bad
    bytes, bad syntax, or nesting deep enough to exhaust the parser's recursion)."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return _NOT_JSON


def few(items: list[str], limit: int = 5) -> str:
    """The first ``limit`` of ``items``, comma-separated, then ``… and N more``: a list a
    registry supplies is never printed whole."""
    shown = ", ".join(items[:limit])
    return shown + (f" … and {len(items) - limit} more" if len(items) > limit else "")


def _error_text(response: Any) -> str:
    try:
        errors = parse_json(response.content).get("errors") or []
        text = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors[:5]) \
            or response.reason
    except (ValueError, AttributeError, TypeError):
        text = str(response.reason)
    return printable(str(text))


def _late(who: str) -> RegistryError:
    return RegistryError(f"{who} did not answer within {DEADLINE_S:g} s", field="registry",
                         fix="check the registry and the network")


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
                         fix="check that the registry is running and HOST[:PORT] is right")


def _client_for(ref: ImageRef, credentials: Credentials | None) -> _Client:
    # Credentials are keyed by host[:port]: ones for another host are never sent here.
    if credentials is None or credentials.registry != ref.host:
        credentials = Credentials.load(ref.host)
    return _Client(credentials)


def _pull_scope(ref: ImageRef) -> str:
    return f"repository:{ref.repository}:pull"
