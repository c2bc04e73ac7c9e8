"""The lock-parser fuzz campaign (issue 21, item 7): at least 10,000 hypothesis-generated lock
texts through the parser and the builder's re-written requirements file. Marked ``fuzz``;
outside CI's budget (scripts/test.sh deselects it). Run it with:

    IMGFAB_FUZZ_EXAMPLES=10000 python -m pytest -m fuzz tests/fuzz/test_lock_campaign.py -p no:cacheprovider -s

Each text is a slice of a committed lock (its header and a few pins) with one to four edits:
a hostile line inserted or put in place of one (option lines, includes, URL and path
requirements, forged header lines, continuation tricks, control characters and Unicode line
breaks, random text), a line cut short, or a character changed. Every outcome must be a
RecipeError with one printable line that echoes no password, or a parse whose requirements
file holds only imgfab's header lines, ``name==version \\`` and ``--hash=sha256:`` lines, and
parses back to the same pins. Figures go to ``$IMGFAB_FUZZ_REPORT`` (default
``build/fuzz-lock-report.json``) and to stdout.
"""

from __future__ import annotations

import collections
import json
import os
import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgfab.errors import RecipeError
from imgfab.payload.lockparse import parse_lock, requirements_text

pytestmark = pytest.mark.fuzz

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("IMGFAB_FUZZ_EXAMPLES", "10000"))
REPORT = Path(os.environ.get("IMGFAB_FUZZ_REPORT", REPO / "build" / "fuzz-lock-report.json"))
OUTCOMES: collections.Counter[str] = collections.Counter()
EDITS: collections.Counter[str] = collections.Counter()
STARTED: list[float] = []
HASH = "sha256:" + "ab" * 32


def _base() -> list[str]:
    """The header of a committed lock and its first eight pins, the layer lines naming them."""
    text = (REPO / "recipes" / "qwen2-7b-h100.lock").read_text()
    head, body = text.split("\n\n", 1)
    pins = re.findall(r"^[a-z0-9-]+==.*(?:\n    --hash=.*)+", body, re.M)[:8]
    names = [pin.split("==", 1)[0] for pin in pins]
    lines = [line for line in head.split("\n") if not line.startswith("# layer ")]
    lines += [f"# layer rest-1 (0.10 GB): {' '.join(names[:5])}", f"# layer vllm-1 (1.30 GB): {' '.join(names[5:])}"]
    return lines + [""] + "\n".join(pins).split("\n")


BASE = _base()
HOSTILE = [
    "--extra-index-url http://127.0.0.1:9/simple", "--extra-index-url=http://alice:S3CRET@h/simple",
    "--index-url http://127.0.0.1:9/simple", "-i http://x", "-ihttp://x", "--find-links=./w", "-f .",
    "--trusted-host h", "--no-binary :all:", "--only-binary=:none:", "--pre", "--prefer-binary",
    "--no-index", "--use-feature=x", "-r other.txt", "-rother.txt", "--requirement=o.txt",
    "-c c.txt", "--constraint c.txt", "-e .", "--editable=git+https://h/r", "-e git+https://h/r#egg=x",
    "evil @ http://127.0.0.1:9/evil-1.0-py3-none-any.whl", "evil@https://alice:S3CRET@h/e.whl",
    f"evil @ file:///tmp/e.whl --hash={HASH}", "./evil-1.0-py3-none-any.whl", "/tmp/e.whl",
    "evil-1.0.tar.gz", "../evil", "C:\\evil.whl", "git+https://h/r#egg=evil", "evil==1.0; python_version>'3'",
    "evil==1.0 ;sys_platform=='linux'", "evil==1.0 --hash=" + HASH, "evil==1.0 \\", "evil>=1.0",
    "evil===1.0", "evil==1.0,<2", "evil[extra]==1.0", "evil == 1.0", "evil==1.0 # comment",
    "evil==1.0\t\\", f"    --hash={HASH}", f"    --hash={HASH} \\", "    --hash=md5:00", "\t--hash=" + HASH,
    "evil==1.0\x0c--extra-index-url http://x", "evil==1.0\r--extra-index-url http://x",
    "evil==1.0\u2028--index-url http://x", "evil==1.0\x85-f http://x", "evil==1.0\x00", "\ufeffevil==1.0",
    "evil==1.0\x1b[2J", "# index: http://127.0.0.1:9/simple (every other name)", "# installer: uv @ http://h/uv.whl",
    "# serves: 10.0", "# serves: 9.0; rm -rf /", "# extra-index-url: http://x", "# fingerprint: 00",
    "# collisions-cut: ../../../../usr/bin/python3", "# collisions-cut: /etc/passwd",
    "# layer rest-1 (0.1 GB): evil", "# layer x (1 GB): a", "# layer cuda-9 (1.00 GB): not-pinned",
    "#--extra-index-url http://x", "#", "# ", "evil==1.0 \\\n--extra-index-url http://x",
    "evil==1!2.0+local.1", "UPPER_Case.name==1.0.post1", "a==1", "a-==1", "-a==1", "a==-1", "a==1/2",
    "a==1@2", "a==1:2", "six==1.17.0", "",
]
_line = st.one_of(st.sampled_from(HOSTILE),
                  st.text(alphabet=st.characters(codec="utf-8"), max_size=60),
                  st.text(alphabet="-=@:/\\ #;.abc019\t\r\x0c", max_size=30))


@st.composite
def lock_texts(draw) -> tuple[str, str]:
    """(edit kinds, lock text)."""
    lines = list(BASE)
    kinds = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["insert", "insert", "replace", "truncate", "char", "crlf"]))
        where = draw(st.integers(0, len(lines)))
        if kind == "insert":
            lines.insert(where, draw(_line))
        elif kind == "replace" and where < len(lines):
            lines[where] = draw(_line)
        elif kind == "truncate" and where < len(lines):
            lines[where] = lines[where][: draw(st.integers(0, max(0, len(lines[where]) - 1)))]
        elif kind == "char" and where < len(lines) and lines[where]:
            at = draw(st.integers(0, len(lines[where]) - 1))
            lines[where] = lines[where][:at] + draw(st.sampled_from(list("-@:/; \\\t#=x\x0c\u2028"))) + lines[where][at + 1:]
        elif kind == "crlf":
            lines = [line + "\r" for line in lines]
        kinds.append(kind)
        EDITS[kind] += 1
    return "+".join(sorted(set(kinds))), "\n".join(lines) + "\n"


ALLOWED = re.compile(r"^(# requirements of recipe fuzz, written by imgfab from its lock \(fingerprint f\): "
                     r"name==version with its hashes, nothing else"
                     r"|# serves: 9\.0|# collisions-cut: [A-Za-z0-9._+-]+(?:/[A-Za-z0-9._+-]+)*(?: [A-Za-z0-9._/+-]+)*"
                     r"|# layer [a-z]+-[0-9]+ \([0-9.]+ (?:B|MB|GB)(?: single package over the limit)?\): [a-z0-9 -]*"
                     r"|[a-z0-9]+(?:-[a-z0-9]+)*==[0-9][0-9A-Za-z.!+_-]* \\|[a-z0-9]+(?:-[a-z0-9]+)*==[0-9][0-9A-Za-z.!+_-]*"
                     r"|    --hash=sha256:[0-9a-f]{64}(?: \\)?|)$")


@pytest.fixture(scope="module", autouse=True)
def report():
    STARTED.append(time.monotonic())
    yield
    seconds = round(time.monotonic() - STARTED[0], 1)
    figures = {"examples_requested": EXAMPLES, "cases": sum(OUTCOMES.values()),
               "rejections": sum(v for k, v in OUTCOMES.items() if k.endswith("RecipeError")),
               "crashes": 0, "seconds": seconds, "outcomes": dict(sorted(OUTCOMES.items())),
               "edits": dict(sorted(EDITS.items()))}
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print("\nlock fuzz campaign:", json.dumps({k: v for k, v in figures.items() if k != "edits"}, sort_keys=True))


def _one_line(error: RecipeError) -> None:
    line = error.one_line()
    assert line and "\n" not in line and len(line) < 1000, line
    assert not any(ord(ch) < 32 or 0x7f <= ord(ch) <= 0x9f for ch in line), repr(line)
    assert "S3CRET" not in line, line
    assert re.match(r"lock: fuzz\.lock:\d+: |lock: the lock's '# collisions-cut:'", line), line


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
          suppress_health_check=list(HealthCheck))
@given(case=lock_texts())
def test_a_fuzzed_lock_is_refused_in_one_line_or_rewritten_to_pins_only(case):
    kinds, text = case
    try:
        parsed = parse_lock(text, "fuzz.lock")
        requirements = requirements_text(parsed, recipe="fuzz", fingerprint="f", serves=("9.0",),
                                         collisions_allowed=("build_backend.py",))
    except RecipeError as error:
        _one_line(error)
        OUTCOMES[f"{kinds}: RecipeError"] += 1
        return
    bad = [line for line in requirements.split("\n") if not ALLOWED.match(line)]
    assert not bad, (bad[:3], text[:300])
    assert "://" not in requirements and "@" not in requirements and "\r" not in requirements
    again = parse_lock(requirements, "requirements.lock")
    assert [(e.name, e.version, e.hashes) for e in again.entries] == \
        sorted(((e.name, e.version, e.hashes) for e in parsed.entries), key=lambda row: row[0])
    OUTCOMES[f"{kinds}: parsed"] += 1
