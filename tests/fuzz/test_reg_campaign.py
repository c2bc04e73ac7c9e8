"""The registry fuzz campaign (issue 21): hostile registry answers through select's reading path,
and secrets of every shape through redaction. Marked ``fuzz``; outside CI's budget. Run it with:

    IMGFAB_FUZZ_EXAMPLES=10000 python -m pytest -m fuzz tests/fuzz/test_reg_campaign.py -p no:cacheprovider -s

- ``described``: a registry (in memory, at the client's edge) answers a tag with hostile bytes
  (not JSON, deep nesting, wrong types, an index of many or odd platforms, bad digests, child
  manifests and configs that do or do not hash to their digests, a lying Docker-Content-Digest).
  Every outcome is ``(digest, config)`` with the digest the sha256 of the bytes served for the
  tag, or one RegistryError line, printable and under 1,000 characters.
- ``redact``: a password in a URL with or without a scheme, quoted, as a flag value, in a
  sentence, as a query value, or cut by :func:`shown`, never survives into an error line.

Figures (cases, rejections, crashes, seconds) go to stdout and ``$IMGFAB_FUZZ_REPORT``.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import time
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgfab.docker import registry
from imgfab.docker.credentials import Credentials
from imgfab.errors import RecipeError, RegistryError, shown

pytestmark = pytest.mark.fuzz

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("IMGFAB_FUZZ_EXAMPLES", "10000"))
REPORT = Path(os.environ.get("IMGFAB_FUZZ_REPORT", REPO / "build" / "fuzz-report-reg.json"))
FIGURES: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
STARTED: dict[str, float] = {}
ENDED: dict[str, float] = {}
HOST = "127.0.0.1:5999"


def _sha(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


class _Answer:
    def __init__(self, status: int, content: bytes, headers: dict[str, str]):
        self.status_code, self.content, self.headers = status, content, headers


class _Client:
    """The registry at the client's edge: ``routes`` maps a path to its answer."""

    def __init__(self, routes: dict[str, _Answer]):
        self.routes = routes

    def request(self, method, path, *, scope, headers=None, allow=(), body="empty"):
        answer = self.routes.get(path, _Answer(404, b"", {}))
        if answer.status_code == 404 and 404 not in allow:
            raise RegistryError(f"registry {HOST} answered 404 to {method} {path}")
        return answer


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(max_size=20), st.sampled_from(["sha256:" + "a" * 64, "sha256:xyz",
                                                           "../../etc", "\x1b[2J", "linux", "amd64"]))
JSONISH = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12)


@st.composite
def registries(draw):
    """(routes, tag bytes): a tag's manifest or index, with children and configs that may or
    may not be what their digests say."""
    routes: dict[str, _Answer] = {}
    config = draw(st.one_of(
        st.builds(lambda labels: json.dumps({"config": {"Labels": labels}}).encode(),
                  st.dictionaries(st.text(max_size=30), st.one_of(st.text(max_size=30), SCALARS),
                                  max_size=5)),
        st.binary(max_size=64), st.just(b"[" * 5000), JSONISH.map(lambda v: json.dumps(v).encode())))
    config_digest = _sha(config)
    served_config = config if draw(st.booleans()) else draw(st.binary(max_size=32))
    routes[f"/v2/llm/x/blobs/{config_digest}"] = _Answer(200, served_config, {})
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": draw(st.one_of(st.just({"digest": config_digest}), JSONISH))}
    body = json.dumps(manifest).encode()
    kind = draw(st.sampled_from(["manifest", "index", "junk", "deep"]))
    if kind == "index":
        child = _sha(body)
        served = body if draw(st.booleans()) else json.dumps({**manifest, "x": 1}).encode()
        routes[f"/v2/llm/x/manifests/{child}"] = _Answer(200, served, {})
        entries = draw(st.lists(st.one_of(
            st.just({"digest": child, "platform": {"os": "linux", "architecture": "amd64"}}),
            st.builds(lambda a, d: {"digest": d, "platform": {"os": "linux", "architecture": a}},
                      st.text(max_size=40), st.one_of(st.just(child), SCALARS)),
            JSONISH), max_size=6))
        entries += [{"digest": child, "platform": {"os": "o", "architecture": f"a{i}"}}
                    for i in range(draw(st.sampled_from([0, 0, 50, 3000])))]
        body = json.dumps({"mediaType": "application/vnd.oci.image.index.v1+json",
                           "manifests": entries}).encode()
    elif kind == "junk":
        body = draw(st.one_of(st.binary(max_size=64), JSONISH.map(lambda v: json.dumps(v).encode())))
    elif kind == "deep":
        body = draw(st.sampled_from([b"[" * 100_000, b'{"a":' * 50_000, b"\xff\xfe"]))
    header = draw(st.sampled_from(["", _sha(body), "sha256:" + "0" * 64, "md5:x", "\x1b[2J"]))
    routes["/v2/llm/x/manifests/v1"] = _Answer(200, body, {"Docker-Content-Digest": header}
                                               if header else {})
    return routes, body


def _printable_line(text: str) -> bool:
    return len(text) < 1000 and not any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f for c in text)


def _start(name: str) -> None:
    STARTED.setdefault(name, time.monotonic())
    ENDED[name] = time.monotonic()


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(registries())
def test_described_is_a_digest_and_config_or_one_line(case):
    _start("described")
    routes, tag_bytes = case
    figures = FIGURES["described"]
    figures["cases"] += 1
    with mock.patch.object(registry, "_client_for", lambda parsed, credentials: _Client(routes)):
        try:
            digest, config = registry.described(f"{HOST}/llm/x:v1", Credentials(HOST))
            labels = registry.published_labels(f"{HOST}/llm/x:v1", Credentials(HOST))[1]
        except RegistryError as error:
            figures["rejections"] += 1
            assert _printable_line(error.one_line()), error.one_line()[:200]
            return
        except Exception:  # noqa: BLE001 - the point of the campaign
            figures["crashes"] += 1
            raise
    assert digest == _sha(tag_bytes)
    assert isinstance(labels, dict)
    figures["accepted"] += 1


ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~!$&'()*+,;=%@:-"
SHAPES = ["{scheme}://{user}:{pw}@{host}/simple", "{user}:{pw}@{host}/simple",
          "{user}:{pw}@{host}", "--pip-index-url={user}:{pw}@{host}/s",
          "cannot reach {scheme}://{user}:{pw}@{host}/simple: timed out",
          "index ({user}:{pw}@{host}/simple) refused",
          "{scheme}://{host}/v2/token?scope=x&access_token={pw}&n=1",
          "{scheme}://{host}/blob?X-Amz-Signature={pw}", "Authorization: Bearer {pw}"]


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(shape=st.sampled_from(SHAPES), scheme=st.sampled_from(["http", "https", "git+https", "ftp"]),
       user=st.text("abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=12),
       host=st.sampled_from(["pypi.corp.example", "10.0.0.1:8080", "[::1]:3128", "h"]),
       pw=st.text(ALPHABET, min_size=4, max_size=40), via=st.sampled_from(["line", "repr", "shown"]),
       pad=st.integers(0, 400))
def test_no_password_survives_redaction(shape, scheme, user, host, pw, via, pad):
    _start("redact")
    figures = FIGURES["redact"]
    figures["cases"] += 1
    secret = "Zq9" + pw  # a marker no host, user or word of the message holds
    if "Bearer" in shape:
        secret = "Zq9" + "".join(c for c in pw if c.isalnum()) + "xxxxxxxx"
    elif "access_token" in shape or "Signature" in shape:
        secret = "Zq9" + "".join(c for c in pw if c not in "&#'\"%") + "x"
    value = shape.format(scheme=scheme, user=user, host=host, pw=secret)
    try:
        if via == "line":
            text = RecipeError(value, field="--pip-index-url").one_line()
        elif via == "repr":
            text = RecipeError(f"{value!r} is not an http(s) URL", field="x").one_line()
        else:
            text = RecipeError(f"{shown('x' * pad + value)} is not a URL", field="x").one_line()
    except Exception:  # noqa: BLE001
        figures["crashes"] += 1
        raise
    if secret in text or secret[:8] in text:
        figures["leaks"] += 1
        raise AssertionError(f"{secret!r} survives in {text!r}")
    figures["redacted"] += 1


def teardown_module(module):
    report = {name: {**figures, "crashes": figures.get("crashes", 0),
                     "seconds": round(ENDED[name] - STARTED[name], 1)}
              for name, figures in FIGURES.items()}
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2, sort_keys=True))
    print("\nregistry fuzz campaign:", json.dumps(report, sort_keys=True))
