"""The only module that talks to a registry's HTTP API (Docker Registry HTTP API V2 / OCI
distribution), through ``requests``; pushes go through the daemon (:func:`imgfab.docker.engine.push_image`).

Scheme: plain http for loopback (127.0.0.0/8, ``localhost``, ``::1``), https elsewhere.
Auth: anonymous first; on a 401 the ``WWW-Authenticate`` challenge picks Basic (htpasswd
registries, the local stack) or Bearer (token server: ``realm``/``service``/``scope``, asked
with Basic credentials). Every failure is one :class:`~imgfab.errors.RegistryError` line with
the fix. Passwords never reach a log line, an error message or a ``repr``.
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any, Callable

from imgfab.errors import RegistryError
from imgfab.docker.credentials import Credentials
from imgfab.docker.registry_http import (_AUTH, _INDEX_TYPES, _NOT_JSON, DOCKER_HUB, MANIFEST_ACCEPT,
                                         ImageRef, _Client, _client_for, _pull_scope, few,
                                         parse_json, printable)

# The names other stations and the tests use, wherever they live in this package.
__all__ = ["Credentials", "ImageRef", "printable", "resolve_digest", "list_tags", "image_config",
           "image_labels", "described", "published_labels", "published_image", "config_platform", "retarget", "is_transient", "push", "tag_holder", "refuse_moving_tag"]

# Backoff before attempt n+1 of a push: BACKOFF_S * 2**(n-1), capped at 30 s.
BACKOFF_S = 1.0
# Daemon/registry messages that mean "the network or the server hiccuped": worth a retry.
_TRANSIENT = re.compile(
    r"connection reset|connection refused|broken pipe|\bEOF\b|timeout|timed out|"
    r"temporarily unavailable|no route to host|unexpected HTTP status: 5\d\d|"
    r"status(?: code)?:? 5\d\d|\b50[0-4]\b|too many requests|\b429\b", re.IGNORECASE)
# Pagination: at most this many pages of tags (100 000 tags at the default page size).
MAX_PAGES = 1000


# --- references -------------------------------------------------------------------------------


# --- credentials ------------------------------------------------------------------------------


# --- the HTTP client --------------------------------------------------------------------------


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
                              headers={"Accept": MANIFEST_ACCEPT}, body="manifest").content
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
        response = client.request("GET", url, scope=_pull_scope(parsed), allow=(404,), body="tags")
        if response.status_code == 404:
            return tags
        try:
            page = parse_json(response.content).get("tags") or []
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
    """The image config blob of ``ref`` (``config.Labels``, ``config.Env``, ``rootfs``, …):
    :func:`described`'s config."""
    return described(ref, credentials, platform=platform)[1]


def described(ref: str, credentials: Credentials | None = None, *,
              platform: str = "linux/amd64") -> tuple[str, dict[str, Any]]:
    """``(digest, config)``: the sha256 of the manifest bytes ``ref`` named, fetched once, and
    the image config reached from those very bytes.

    A manifest list / OCI index is resolved to its ``platform`` entry (default
    ``linux/amd64``); the digest is then the index's, which the daemon resolves the same way.
    Every hop is hash-checked: a manifest fetched by digest must hash to it, the config blob
    to the manifest's config digest, and a ``Docker-Content-Digest`` the registry sends must
    agree with the bytes. Raises :class:`RegistryError` otherwise.
    """
    parsed = ImageRef.parse(ref)
    client = _client_for(parsed, credentials)
    scope = _pull_scope(parsed)
    digest, manifest = _manifest(client, parsed, parsed.reference)
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
            raise RegistryError(f"{printable(ref, 200)} has no {platform} image (offers "
                                f"{few(offered) or 'none'})",
                                field="image", fix="pick a multi-arch tag that includes it")
        manifest = _manifest(client, parsed, _checked_digest(choices[0].get("digest"), ref))[1]
    config = manifest.get("config")
    blob = config.get("digest") if isinstance(config, dict) else None
    if not blob:
        raise RegistryError(f"{printable(ref, 200)}: the manifest names no config blob", field="image",
                            fix="schema 1 manifests are not supported; re-push the image")
    blob = _checked_digest(blob, ref)
    body = client.request("GET", f"/v2/{parsed.repository}/blobs/{blob}", scope=scope,
                          body="config").content
    if "sha256:" + hashlib.sha256(body).hexdigest() != blob:
        raise RegistryError(f"{printable(ref, 200)}: config blob does not match its digest {blob}",
                            field="image", fix="the registry storage is corrupt; re-push")
    parsed_config = parse_json(body)
    if parsed_config is _NOT_JSON:
        raise RegistryError(f"{printable(ref, 200)}: the config blob is not JSON", field="image",
                            fix="rebuild and re-push the image") from None
    return digest, parsed_config


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
    return published_labels(ref, credentials)[1]


def published_labels(ref: str, credentials: Credentials | None = None) -> tuple[str, dict[str, str]]:
    """``(digest, labels)``: the labels of the image :func:`described` reached, and the digest
    of exactly the manifest bytes they were reached from (what ``select`` prints)."""
    return published_image(ref, credentials)[:2]


def published_image(ref: str, credentials: Credentials | None = None, *,
                    platform: str = "linux/amd64") -> tuple[str, dict[str, str], str]:
    """``(digest, labels, config platform)``: :func:`published_labels` with an index resolved to
    its ``platform`` entry (the host's), and the ``os/architecture`` the image config records
    (:func:`config_platform`)."""
    digest, config = described(ref, credentials, platform=platform)
    section = config.get("config") if isinstance(config, dict) else None
    labels = (section.get("Labels") if isinstance(section, dict) else None) or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in labels.items()):
        raise RegistryError(f"{printable(ref, 200)}: the image config's labels are not a "
                            "mapping of strings", field="image", fix="rebuild the image")
    return digest, labels, config_platform(config)


def config_platform(config: Any) -> str:
    """``os/architecture`` of an image config (the OCI config's required ``os`` and
    ``architecture`` fields), made printable; '' when either is missing or not a string."""
    if not isinstance(config, dict):
        return ""
    os_name, arch = config.get("os"), config.get("architecture")
    if not (isinstance(os_name, str) and isinstance(arch, str) and os_name and arch):
        return ""
    return printable(f"{os_name}/{arch}", 60)


def _manifest(client: _Client, ref: ImageRef, reference: str) -> tuple[str, dict[str, Any]]:
    """``(sha256 of the bytes received, the manifest)`` for ``reference`` (a tag or a digest),
    fetched once. Bytes fetched by digest must hash to it, and a ``Docker-Content-Digest``
    header must agree with them; RegistryError otherwise."""
    response = client.request("GET", f"/v2/{ref.repository}/manifests/{reference}",
                              scope=_pull_scope(ref), headers={"Accept": MANIFEST_ACCEPT},
                              allow=(404,), body="manifest")
    shown = f"{ref.name}{'@' if reference.startswith('sha256:') else ':'}{printable(reference, 80)}"
    if response.status_code == 404:
        raise RegistryError(f"{shown} is not in registry {ref.host}",
                            field="image", fix="check the repository and tag")
    body = response.content
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    if reference.startswith("sha256:") and digest != reference:
        raise RegistryError(f"{shown}: the registry served a manifest whose sha256 is {digest}, "
                            "not the digest asked for", field="image",
                            fix="the registry is corrupt or tampered with; re-push the image")
    announced = str(response.headers.get("Docker-Content-Digest") or "")
    if announced.startswith("sha256:") and announced != digest:
        raise RegistryError(f"{shown}: the registry announced {printable(announced, 80)} for a "
                            f"manifest whose sha256 is {digest}", field="image",
                            fix="the registry is corrupt or tampered with; re-push the image")
    manifest = parse_json(body)
    if not isinstance(manifest, dict):
        raise RegistryError(f"{shown}: the manifest is not a JSON object", field="image",
                            fix="re-push the image")
    return digest, manifest


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


def tag_holder(target_ref: str, credentials: Credentials | None = None) -> tuple[str, str] | None:
    """``(manifest digest, config digest)`` of what ``target_ref``'s tag names now; ``None``
    when the registry has no such tag. An index's config digest is ``""``."""
    parsed = ImageRef.parse(target_ref)
    client = _client_for(parsed, credentials)
    response = client.request("HEAD", f"/v2/{parsed.repository}/manifests/{parsed.reference}",
                              scope=_pull_scope(parsed), headers={"Accept": MANIFEST_ACCEPT},
                              allow=(404,))
    if response.status_code == 404:
        return None
    manifest_digest, manifest = _manifest(client, parsed, _manifest_digest(client, parsed))
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    return manifest_digest, str(config.get("digest") or "")


def refuse_moving_tag(local_id: str, target_ref: str, credentials: Credentials | None = None) -> None:
    """Raise :class:`RecipeError` (exit 2) when ``target_ref``'s tag already names another
    image than ``local_id`` (the engine's image id: the config digest, or the manifest digest
    on the containerd image store). A tag the registry does not have, or one that names this
    very image (a re-push), passes. Both digests are named in the message."""
    held = tag_holder(target_ref, credentials)
    if held is None or local_id in held:
        return
    from imgfab.errors import RecipeError  # noqa: PLC0415

    raise RecipeError(f"{target_ref} already names {held[0]} (config {held[1] or 'an index'}); "
                      f"this build is {local_id}: refusing to move the tag to another image",
                      field="--push", fix="pass --retag to move it anyway, or change the recipe "
                                          "so that the build gets its own tag")


def push(local_ref: str, target_ref: str, *, credentials: Credentials, attempts: int = 5,
         on_line: Callable[[str], None] | None = None, retag: bool = False,
         progress: Any = None) -> str:
    """Tag ``local_ref`` as ``target_ref``, push it through the daemon, return
    ``host/repo@sha256:…``.

    A tag that already names another image is not moved (:func:`refuse_moving_tag`) unless
    ``retag``; ``on_line`` then says which digest the tag left.

    Each attempt first checks the credentials against the registry (``GET /v2/`` with a push
    scope), so a wrong password fails before any blob moves, and is not retried. Transient
    failures (connection reset/refused, timeouts, 5xx) are retried up to ``attempts`` times
    with exponential backoff. The digest comes from the push stream's ``aux.Digest`` and is
    cross-checked with a HEAD on the pushed tag. ``on_line`` receives progress and retry lines;
    ``progress`` (:class:`imgfab.progress.Progress`) the bytes sent over all layers.
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
    from imgfab.docker.engine import inspect_image  # noqa: PLC0415

    local_id = str(inspect_image(local_ref).get("Id") or "")
    last: RegistryError | None = None
    for attempt in range(1, max(1, attempts) + 1):
        if attempt > 1:
            delay = min(30.0, BACKOFF_S * 2 ** (attempt - 2))
            if on_line is not None:
                on_line(f"retrying push of {target.name}:{tag} in {delay:.1f}s "
                        f"(attempt {attempt}/{attempts}) after: {last.message if last else ''}")
            time.sleep(delay)
        try:
            return _push_once(local_ref, target, tag, credentials, on_line,
                              local_id=local_id, retag=retag, progress=progress)
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
               on_line: Callable[[str], None] | None, *, local_id: str, retag: bool,
               progress: Any = None) -> str:
    from imgfab.docker.engine import push_image  # noqa: PLC0415

    client = _Client(credentials)
    # The auth check: /v2/ answers 401 to a wrong password before anything is uploaded.
    client.request("GET", "/v2/", scope=f"repository:{target.repository}:pull,push")
    # The tag guard runs inside the attempt, so a reset on its HEAD is retried like the rest.
    if not retag:
        refuse_moving_tag(local_id, f"{target.name}:{tag}", credentials)
    elif on_line is not None and (held := tag_holder(f"{target.name}:{tag}", credentials)) \
            and local_id not in held:
        on_line(f"--retag: {target.name}:{tag} moves from {held[0]} to this build ({local_id})")
    pushed = push_image(local_ref, target.name, tag, auth_config=credentials.auth_config(),
                        on_line=on_line, progress=progress)
    head = _manifest_digest(client, ImageRef(target.host, target.repository, tag))
    if head != pushed:
        raise RegistryError(f"pushed {target.name}:{tag} as {pushed} but the registry now "
                            f"serves {head}", field="registry",
                            fix="another push raced this one; push again")
    return f"{target.name}@{pushed}"
