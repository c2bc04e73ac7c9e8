"""The verify fuzz campaign (issue 21): at least 10,000 hypothesis-generated ``docker save``
streams through :func:`imgfab.docker.verify.verify_image`. Marked ``fuzz``; outside CI's budget
(scripts/test.sh deselects it). Run it with:

    IMGFAB_FUZZ_EXAMPLES=10000 python -m pytest -m fuzz tests/fuzz/test_verify_campaign.py -p no:cacheprovider -s

Each stream is one image of one to three layers in any layout (legacy, legacy with symlinked
duplicates, OCI plain/gzip/zstd) whose entries are hostile: whiteouts and opaque markers,
symlinks and hard links, PAX records and owner names, sparse members announcing up to 1 TiB
with maps in any order, names with line breaks, escapes and non-ASCII; a build secret is
planted in some of them (in contents, a name, a link target, a PAX record or sparse data).
Half the streams are then damaged (bytes flipped, cut short, junk appended or inserted).

Every stream must give a report, never an exception; no finding or note may hold the secret
or a line break; an undamaged stream with a planted secret must fail ``secrets``; a damaged
stream whose layers still pass must have hashed to the diff ids inspect reported. Figures
(cases, rejections, crashes, seconds) go to ``$IMGFAB_FUZZ_REPORT`` (default
``build/fuzz-verify-report.json``) and to stdout.
"""

from __future__ import annotations

import collections
import io
import json
import os
import re
import tarfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgfab.docker import verify
from imgfab.docker.verify import VerifyPolicy, verify_image

pytestmark = pytest.mark.fuzz

REPO = Path(__file__).resolve().parents[2]


def _builders():
    """The save-archive builder and the engine stand-in of tests/docker/test_verify_layouts.py
    (loaded by path: ``docker`` is the SDK's package name)."""
    import importlib.util  # noqa: PLC0415

    path = REPO / "tests" / "docker" / "test_verify_layouts.py"
    spec = importlib.util.spec_from_file_location("_imgfab_verify_layouts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FakeEngine, module.save_archive


FakeEngine, save_archive = _builders()
EXAMPLES = int(os.environ.get("IMGFAB_FUZZ_EXAMPLES", "10000"))
REPORT = Path(os.environ.get("IMGFAB_FUZZ_REPORT", REPO / "build" / "fuzz-verify-report.json"))
PASSWORD = "Fz-S3cret-9q7"
PIP_CONF = f"[global]\nindex-url = https://ci:{PASSWORD}@idx.example/simple\n".encode()
POLICY = VerifyPolicy(mount_path="/models/m", required_labels={}, secrets={"pip-conf": PIP_CONF})
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
OUTCOMES: collections.Counter[str] = collections.Counter()
STARTED: list[float] = []

NAMES = ["etc/hostname", "usr/bin/gcc", "usr/bin/.wh.gcc", "usr/bin/.wh..wh..opq", "usr/bin",
         "models/m/w.bin", "models/m/.wh.x", "root/.cache/pip/a", ".wh.usr", "./etc/x", "/abs",
         "a/../../etc/passwd", "dir/", "x" * 300, "line\nbreak", "esc\x1b[2J", "ünï/çødé",
         "GNUSparseFile.0/s", "././@LongLink", "var/lib/dpkg/status", "."]
_name = st.one_of(st.sampled_from(NAMES), st.text(st.characters(blacklist_categories=["Cs"],
                                                                blacklist_characters="\x00"),
                                                  min_size=1, max_size=60))
_small = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
                 max_size=24)


@st.composite
def entries(draw) -> tuple[list[tuple[tarfile.TarInfo, bytes | None]], list[str]]:
    """The members of one layer, and where a secret was planted in them (``kind:where``)."""
    planted: list[str] = []
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for _ in range(draw(st.integers(0, 6))):
        info = tarfile.TarInfo(draw(_name))
        kind = draw(st.sampled_from(["file", "file", "dir", "symlink", "hardlink", "sparse"]))
        body: bytes | None = None
        secret_at = draw(st.sampled_from([None, None, None, "content", "name", "link", "pax",
                                          "owner"]))
        if secret_at == "name":
            info.name = info.name.rstrip("/") + PASSWORD
        if draw(st.booleans()):
            info.pax_headers = draw(st.dictionaries(_small.filter(lambda k: "=" not in k and k),
                                                    _small, max_size=3))
        if secret_at == "pax":
            info.pax_headers = {**info.pax_headers, "comment": PASSWORD}
        info.uname = PASSWORD if secret_at == "owner" else draw(_small.map(lambda s: s[:30]))
        if kind in ("symlink", "hardlink"):
            info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
            info.linkname = draw(_name) + (PASSWORD if secret_at == "link" else "")
        elif kind == "dir":
            info.type = tarfile.DIRTYPE
        elif kind == "sparse":
            realsize = draw(st.sampled_from([0, 10, 1 << 20, 32 << 30, 1 << 40]))
            chunks = draw(st.lists(st.tuples(st.integers(0, max(realsize, 1)),
                                             st.binary(max_size=16)), max_size=3))
            if secret_at == "content":
                chunks.append((0, PASSWORD.encode()))
            info.pax_headers = {**info.pax_headers, "GNU.sparse.major": "0",
                                "GNU.sparse.minor": "1", "GNU.sparse.name": info.name,
                                "GNU.sparse.realsize": str(realsize),
                                "GNU.sparse.size": str(realsize),
                                "GNU.sparse.map": ",".join(f"{o},{len(d)}" for o, d in chunks)}
            body = b"".join(d for _, d in chunks)
        else:
            body = draw(st.binary(max_size=64))
            if secret_at == "content":
                body += b"pw=" + PASSWORD.encode()
        if secret_at == "link" and kind not in ("symlink", "hardlink"):
            secret_at = None
        if secret_at == "content" and kind not in ("file", "sparse"):
            secret_at = None
        if secret_at is not None:
            planted.append(f"{kind}:{secret_at}:{info.name!r}")
        members.append((info, body))
    return members, planted


def _layer(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes | None:
    buffer = io.BytesIO()
    try:
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for info, body in members:
                if body is not None:
                    info.size = len(body)
                tar.addfile(info, io.BytesIO(body) if body is not None else None)
    except (ValueError, UnicodeError, OverflowError):
        return None
    return buffer.getvalue()


@st.composite
def streams(draw) -> tuple[bytes, list[str], bool, list[str]]:
    """(save stream, where secrets were planted, damaged, the diff ids inspect reports)."""
    layers, planted = [], []
    for _ in range(draw(st.integers(1, 3))):
        members, secret = draw(entries())
        layer = _layer(members)
        if layer is None:
            layer, secret = _layer([]), []
        layers.append(layer)
        planted += secret
    layout = draw(st.sampled_from(["legacy", "legacy-symlink", "oci", "oci", "oci"]))
    compress = draw(st.sampled_from(["none", "gzip", "zstd"])) if layout == "oci" else "none"
    archive = save_archive(layers, layout, compress=compress)
    claims = FakeEngine(archive, len(layers)).inspect_image("t:1")["RootFS"]["Layers"]
    damage = draw(st.sampled_from([None, None, "flip", "cut", "append", "insert"]))
    if damage == "flip":
        for _ in range(draw(st.integers(1, 8))):
            at = draw(st.integers(0, len(archive) - 1))
            archive = archive[:at] + bytes([archive[at] ^ draw(st.integers(1, 255))]) + archive[at + 1:]
    elif damage == "cut":
        archive = archive[:draw(st.integers(0, len(archive) - 1))]
    elif damage == "append":
        archive += draw(st.binary(min_size=1, max_size=2048))
    elif damage == "insert":
        at = draw(st.integers(0, len(archive)))
        archive = archive[:at] + draw(st.binary(min_size=1, max_size=600)) + archive[at:]
    return archive, planted, damage is not None, claims


@pytest.fixture(scope="module", autouse=True)
def report():
    STARTED.append(time.monotonic())
    yield
    seconds = round(time.monotonic() - STARTED[0], 1)
    figures = {"examples_requested": EXAMPLES, "cases": sum(OUTCOMES.values()),
               "rejections": sum(v for k, v in OUTCOMES.items() if k.endswith("rejected")),
               "crashes": OUTCOMES.get("crash", 0), "seconds": seconds,
               "outcomes": dict(sorted(OUTCOMES.items()))}
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print("\nverify fuzz campaign:", json.dumps(figures, sort_keys=True))


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
          suppress_health_check=list(HealthCheck))
@given(case=streams())
def test_fuzzed_save_stream_gives_a_report_that_fails_closed(case, tmp_path_factory, monkeypatch):
    archive, planted, damaged, claims = case
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    engine = FakeEngine(archive, len(claims), layers=claims)
    try:
        result = verify_image("t:1", POLICY, engine=engine, raise_on_failure=False)
    except Exception:
        OUTCOMES["crash"] += 1
        raise
    verdicts = {f.check: f.passed for f in result.findings}
    for line in [f.detail for f in result.findings] + result.notes:
        assert PASSWORD not in line and not _CONTROL.search(line), repr(line)[:400]
    if planted and not damaged:  # found, or its layer was not read (which fails too)
        assert verdicts["secrets"] is False or verdicts["layers"] is False, \
            (planted, repr(result.to_dict())[-300:])
    if verdicts["layers"]:
        scan = verify._scan_layers(iter([archive]), POLICY)
        assert scan.diff_ids == claims, "layers passed on bytes that hash to other diff ids"
    OUTCOMES[f"{'damaged' if damaged else 'intact'}: "
             f"{'passed' if result.passed else 'rejected'}"] += 1
