"""Does every route a keyed server serves refuse a request without the key? (issue 34)

vLLM's own ``--api-key`` guards ``/v1`` only; an image of imgfab puts a gate in front of every
route (:mod:`imgfab.in_image.gate`). :func:`check_routes` proves it from outside, on the routes
the server itself lists:

1. ``GET /openapi.json`` with the key: every (method, path) of its ``paths`` (a path parameter
   such as ``{response_id}`` is sent as ``imgfab-smoke``), and :data:`UNLISTED`, the routes a
   FastAPI server serves without listing them (vLLM mounts Prometheus' app at ``/metrics``; the
   OpenAPI pages themselves);
2. each once without the key, a POST/PUT/PATCH with an empty JSON object as its body (nothing a
   route generates from): it must answer 401 or 403. The open routes (``GET /health``; ``GET
   /metrics`` where the image opts in) may answer; an unlisted route may be absent (404).

The route table (:class:`RouteCheck`: method, path, status, verdict) goes into the smoke
report; every route that answered is one failure line. Only ``requests`` and the standard library.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

import requests

HEALTH = ("GET", "/health")
METRICS = ("GET", "/metrics")
OPEN_ROUTES = frozenset({HEALTH})
UNLISTED = (METRICS, ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc"))
# What a path item of an OpenAPI document may hold besides operations is left out.
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
WITH_BODY = ("POST", "PUT", "PATCH")
PATH_PARAMETER = "imgfab-smoke"
# A server that lists more routes than this is not checked route by route: it fails.
MAX_ROUTES = 1000
# RFC 3986 pchar and "/": what a path keeps as it is; anything else is percent-encoded, so the
# table and a terminal see printable ASCII whatever the server listed.
_PATH_SAFE = "/-._~!$&'()*+,;=:@{}"


@dataclass(frozen=True)
class RouteCheck:
    """One route asked without the key. ``verdict``: ``refused`` (401/403), ``open`` (an open
    route, whatever it answered), ``absent`` (an unlisted route the server does not have, 404),
    ``answered`` (anything else: a failure) or ``error`` (no answer; ``status`` None)."""

    method: str
    path: str
    status: int | None
    verdict: str


def listed_routes(document: Any) -> list[tuple[str, str]]:
    """The (METHOD, path) pairs of an OpenAPI document's ``paths``, sorted; paths percent-
    encoded where they hold anything but :data:`_PATH_SAFE`. ValueError for a document
    without a ``paths`` mapping."""
    paths = document.get("paths") if isinstance(document, dict) else None
    if not isinstance(paths, dict):
        raise ValueError("it has no 'paths' mapping")
    routes = set()
    for path, item in paths.items():
        if not isinstance(path, str) or not path.startswith("/") or not isinstance(item, dict):
            continue
        shown = urllib.parse.quote(path, safe=_PATH_SAFE)
        routes.update((method.upper(), shown) for method in item if method in METHODS)
    return sorted(routes, key=lambda route: (route[1], route[0]))


def concrete(path: str) -> str:
    """A listed path with each ``{parameter}`` filled in, as it is requested."""
    return re.sub(r"\{[^/{}]*\}", PATH_PARAMETER, path)


def check_routes(session: requests.Session, base_url: str, api_key: str, *,
                 open_routes: frozenset[tuple[str, str]] = OPEN_ROUTES,
                 timeout_s: float = 30.0) -> tuple[list[RouteCheck], list[str]]:
    """Ask every route ``base_url`` lists (and :data:`UNLISTED`) without ``api_key``; returns
    the route table and the failure lines (empty when every route but ``open_routes`` refused)."""
    url = f"{base_url}/openapi.json"
    try:
        response = session.get(url, timeout=timeout_s, headers={"Authorization": f"Bearer {api_key}"})
        response.raise_for_status()
        listed = listed_routes(response.json())
    except (requests.RequestException, ValueError) as exc:
        return [], [f"routes: GET {url} with the key failed ({' '.join(str(exc).split())}): the "
                    f"server's routes cannot be listed, so they cannot be checked without the key"]
    if len(listed) > MAX_ROUTES:
        return [], [f"routes: GET {url} lists {len(listed)} routes, more than the {MAX_ROUTES} "
                    f"smoke asks one by one"]
    routes = listed + [route for route in UNLISTED if route not in listed]
    table, failures = [], []
    for method, path in routes:
        body = {"json": {}} if method in WITH_BODY else {}
        try:
            status: int | None = session.request(method, base_url + concrete(path),
                                                  timeout=timeout_s, **body).status_code
        except requests.RequestException as exc:
            table.append(RouteCheck(method, path, None, "error"))
            failures.append(f"routes: {method} {path} without the key got no answer: "
                            f"{type(exc).__name__}")
            continue
        if (method, path) in open_routes:
            verdict = "open"
        elif status in (401, 403):
            verdict = "refused"
        elif status == 404 and (method, path) in UNLISTED and (method, path) not in listed:
            verdict = "absent"
        else:
            verdict = "answered"
            failures.append(f"routes: {method} {path} answered HTTP {status} without the key; "
                            f"only {', '.join(' '.join(r) for r in sorted(open_routes))} may")
        table.append(RouteCheck(method, path, status, verdict))
    return table, failures
