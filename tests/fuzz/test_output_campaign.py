"""The weights-and-output fuzz campaign (issue 34): hostile weights directories through every
reader of a weights directory, and hostile strings through the ``--json`` emitter and the
terminal sanitizer. Marked ``fuzz``; outside CI's budget (scripts/test.sh deselects it). Run with:

    IMGFAB_FUZZ_EXAMPLES=10000 python -m pytest -m fuzz tests/fuzz/test_output_campaign.py -p no:cacheprovider -s

``IMGFAB_FUZZ_EXAMPLES`` (default 10,000) is the number of cases of each of the two campaigns:

- weights: a directory with a config.json (a published model's, edited; deep nesting; numbers
  of thousands of digits; random or non-UTF-8 bytes; truncated) and zero to three
  ``*.safetensors`` files (shapes with huge, negative or non-integer dimensions, deep headers,
  lying header lengths up to 2**64 - 1, random bytes), read by ``read_model_dir`` and then by its
  consumers: the resolver (``imgfab resolve --weights``), ``imgfab smoke --weights``'s fit check
  and the in-image probe's. Allowed outcomes: facts, ``FactsError`` from the reader, an
  ``ImgfabError`` from the CLI's consumers, a probe finding; anything else is a crash.
- output: strings built of quotes, backslashes, C0/C1 controls, escape sequences and secret
  patterns (``password="``, ``api_key='``, ``https://u:p@``, Bearer) in nested ``--json``
  objects (``imgfab.output.dumps``), error lines, progress lines and the CLI's printer; and the
  CLI itself (``validate``/``list``, text and ``--json``) on a recipe whose file name and one
  field (or none) are such strings. Every ``--json`` output must ``json.loads`` to one object, no output
  may hold a raw control character (tab and newline aside), and a ``password=`` secret planted
  in a value must not reach a ``--json`` output.

Figures (cases, crashes, invalid JSON, raw control characters, leaked secrets, seconds) go to
``$IMGFAB_FUZZ_REPORT`` (default ``build/fuzz-output-report.json``) and to stdout.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgfab.errors import ImgfabError, RecipeError, printable
from imgfab.in_image import probe
from imgfab.in_image.facts import GpuFacts, HostFacts, ImageFacts
from imgfab.in_image.fit import FactsError, read_model_dir
from imgfab.matrix.compat import load_matrix
from imgfab.ops.smoke_fit import weights_fit
from imgfab.output import document, dumps, error_object
from imgfab.progress import Progress
from imgfab.recipe import parse_recipe
from imgfab.stack.resolve import resolve

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
sys.path.insert(0, str(REPO / "tests" / "ops"))
from conftest import FROZEN_COMPAT, FROZEN_RECIPES  # noqa: E402
from model_facts import MODELS, tensor_shapes  # noqa: E402
from test_smoke_fit import _labels  # noqa: E402

pytestmark = pytest.mark.fuzz

EXAMPLES = int(os.environ.get("IMGFAB_FUZZ_EXAMPLES", "10000"))
REPORT = Path(os.environ.get("IMGFAB_FUZZ_REPORT", REPO / "build" / "fuzz-output-report.json"))
FIGURES: dict[str, collections.Counter[str]] = {"weights": collections.Counter(),
                                                "output": collections.Counter()}
SECONDS: dict[str, float] = {}


def _raw_controls(text: str) -> int:
    return sum(1 for ch in text if (ord(ch) < 32 and ch not in "\t\n") or 0x7f <= ord(ch) <= 0x9f)


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    figures = {campaign: {"cases": counts["cases"], "crashes": counts["crashes"],
                          "invalid_json": counts["invalid_json"], "raw_controls": counts["raw_controls"],
                          "secrets_leaked": counts["secrets_leaked"],
                          "seconds": round(SECONDS.get(campaign, 0.0), 1),
                          "outcomes": dict(sorted((k, v) for k, v in counts.items() if k.startswith("outcome ")))}
               for campaign, counts in FIGURES.items()}
    figures["examples_requested"] = EXAMPLES
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print("\nweights/output fuzz campaign:", json.dumps(
        {k: {f: v for f, v in c.items() if f != "outcomes"} if isinstance(c, dict) else c
         for k, c in figures.items()}, sort_keys=True))


@contextlib.contextmanager
def _timed(campaign: str):
    """Count one case of ``campaign`` and the time it takes."""
    FIGURES[campaign]["cases"] += 1
    started = time.monotonic()
    try:
        yield
    finally:
        SECONDS[campaign] = SECONDS.get(campaign, 0.0) + time.monotonic() - started


# --- the weights readers --------------------------------------------------------------------

MATRIX = load_matrix(FROZEN_COMPAT)
_NO_FACTS = yaml.safe_load((FROZEN_RECIPES / "qwen2-7b-h100.yaml").read_text())
_NO_FACTS["model"].pop("facts")
RECIPE = parse_recipe(_NO_FACTS)
LABELS = _labels("llama31-8b-l4", facts=None)
HOST = HostFacts(driver="580.95.05", gpus=[GpuFacts(0, "NVIDIA H100 80GB HBM3", "9.0", 80 * 2**30)])
CONFIG = MODELS["Qwen2-7B"]["config"]
SHAPES = tensor_shapes("Qwen2-7B")
EDGES = [0, 1, 2, 63, 64, 65, 2**31, 2**53, 2**62, 2**63, 2**64, 10**15, 10**15 + 1, -1, -(2**63)]

_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(10**45), 10**45), st.sampled_from(EDGES),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
_json_value = st.recursive(_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                           max_leaves=8)
_digits = st.sampled_from([1, 20, 39, 40, 41, 300, 4300, 4301, 5000])
_depths = st.sampled_from([1, 2, 62, 63, 64, 65, 999, 1000, 3000, 100_000])


def _nest(depth: int, kind: str) -> str:
    return ("[" * depth + "]" * depth) if kind == "list" else ('{"a":' * depth + "1" + "}" * depth)


@st.composite
def config_texts(draw) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["published", "published", "published", "edited", "edited", "digits",
                                 "deep", "deep-inside", "bytes", "truncated"]))
    if kind == "published":  # the safetensors files decide
        return kind, json.dumps(CONFIG).encode()
    if kind == "edited":
        config = dict(CONFIG)
        for _ in range(draw(st.integers(1, 3))):
            key = draw(st.sampled_from([*CONFIG, "head_dim", "text_config", "num_key_value_heads"]))
            config[key] = draw(_json_value)
        return kind, json.dumps(config, allow_nan=True).encode()
    if kind == "digits":
        key = draw(st.sampled_from(["num_hidden_layers", "hidden_size", "rope_theta", "vocab_size"]))
        number = "9" * draw(_digits) + draw(st.sampled_from(["", ".5", "e5", "e400", "e-400"]))
        return kind, json.dumps(CONFIG)[:-1].encode() + f', "{key}": {draw(st.sampled_from(["", "-"]))}{number}}}'.encode()
    if kind == "deep":
        return kind, _nest(draw(_depths), draw(st.sampled_from(["list", "dict"]))).encode()
    if kind == "deep-inside":
        return kind, json.dumps(CONFIG)[:-1].encode() + b', "x": ' + _nest(draw(_depths), "list").encode() + b"}"
    if kind == "bytes":
        return kind, draw(st.binary(max_size=64))
    text = json.dumps(CONFIG).encode()
    return kind, text[:draw(st.integers(0, len(text) - 1))]


_dim = st.one_of(st.integers(0, 70_000), st.sampled_from(EDGES), st.integers(-(10**45), 10**45),
                 st.floats(allow_nan=False), st.text(max_size=3), st.none(), st.booleans(),
                 st.lists(st.integers(0, 9), max_size=2))


@st.composite
def safetensors_files(draw) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["model", "shapes", "shapes", "not-a-tensor", "deep", "digits", "bytes"]))
    if kind == "model":
        names = draw(st.lists(st.sampled_from(sorted(SHAPES)), max_size=20, unique=True))
        header: object = {"__metadata__": {"format": "pt"}, **{n: {"dtype": "BF16", "shape": SHAPES[n],
                                                                   "data_offsets": [0, 0]} for n in names}}
        raw = json.dumps(header).encode()
    elif kind == "shapes":
        header = {draw(st.text(max_size=10)): {"dtype": "BF16", "shape": draw(st.lists(_dim, max_size=25))}
                  for _ in range(draw(st.integers(1, 4)))}
        raw = json.dumps(header, allow_nan=True).encode()
    elif kind == "not-a-tensor":
        raw = json.dumps({"w": draw(_json_value), "__metadata__": draw(_json_value)}, allow_nan=True).encode()
    elif kind == "deep":
        raw = b'{"w": {"shape": ' + _nest(draw(_depths), draw(st.sampled_from(["list", "dict"]))).encode() + b"}}"
    elif kind == "digits":
        raw = b'{"w": {"shape": [' + b"7" * draw(_digits) + b"]}}"
    else:
        return kind, draw(st.binary(max_size=40))
    length = draw(st.one_of(st.just(len(raw)), st.just(len(raw)),
                            st.sampled_from([0, 1, 7, len(raw) - 1, len(raw) + 1, 100 * 2**20, 100 * 2**20 + 1,
                                             2**63, 2**64 - 1])))
    return kind, struct.pack("<Q", max(0, length)) + raw


@st.composite
def weights_dirs(draw) -> tuple[str, bytes, list[bytes]]:
    kind, config = draw(config_texts())
    files = draw(st.lists(safetensors_files(), max_size=3))
    kinds = "+".join([f"config {kind}", *sorted({f"st {k}" for k, _ in files})])
    return kinds, config, [raw for _, raw in files]


def _consumers(directory: str) -> str:
    """Every reader of ``directory`` as imgfab runs them; the outcome's name."""
    try:
        facts = read_model_dir(directory)
    except FactsError as exc:
        line = str(exc)
        assert line and "\n" not in line and not _raw_controls(line), repr(line)
        return "FactsError"
    try:
        resolve(RECIPE, MATRIX, None, facts, f"{directory}/config.json")
        resolved = "resolved"
    except ImgfabError as exc:
        resolved = type(exc).__name__
    try:
        weights_fit(LABELS, Path(directory), MATRIX)
        fit = "fit line"
    except ImgfabError as exc:
        fit = type(exc).__name__
    image = ImageFacts.from_labels({**LABELS, "org.imgfab.model.mount": directory})
    findings = probe.check_fit(image, HOST)
    assert findings and all(not _raw_controls(f.line()) and "\n" not in f.line() for f in findings)
    return f"read; resolve {resolved}; smoke {fit}"


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=weights_dirs())
def test_hostile_weights_are_read_or_refused_never_crash(case):
    kinds, config, files = case
    with _timed("weights"), tempfile.TemporaryDirectory(prefix="imgfab-fuzz-") as directory:
        Path(directory, "config.json").write_bytes(config)
        for index, raw in enumerate(files):
            Path(directory, f"model-{index}.safetensors").write_bytes(raw)
        try:
            outcome = _consumers(directory)
        except Exception as exc:
            FIGURES["weights"]["crashes"] += 1
            raise AssertionError(f"{kinds}: {type(exc).__name__}: {str(exc)[:300]}") from exc
    FIGURES["weights"][f"outcome {kinds.split('+')[0]}: {outcome}"] += 1


# --- the JSON emitter and the terminal ------------------------------------------------------

PIECES = ['"', "'", "\\", '\\"', "\\\\", "\\u0000", "password=", 'password="', "api_key=", "api_key='",
          "token=", "?token=", "&sig=", " Bearer ", "Basic ", "https://user:", "@host/", "alice:", "://",
          "&", "#", "=", " ", "\x1b[31m", "\x1b[0m", "\x1b]0;title\x07", "\x1b]8;;http://x\x1b\\", "\x1b",
          "\x1bc", "\r", "\n", "\t", "\x00", "\x07", "\x08", "\x0b", "\x7f", "\x85", "\x9b", "\x9b2J",
          "\u2028", "\u202e", "\ufeff", "ü", "✓", "[red]", "[/]", "{}", "[", "]", "%s", "{0}"]
_strings = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6),
                              st.characters(min_codepoint=0, max_codepoint=0x9f)), max_size=10).map("".join)
_marker = st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ0123456789", min_size=4, max_size=8).map(lambda s: f"S3CRET{s}")


@st.composite
def hostile_strings(draw) -> tuple[str, str | None]:
    """(a string, the secret planted in it as `` password=SECRET`` or None)."""
    text = draw(_strings)
    if not draw(st.booleans()):
        return text, None
    secret, after = draw(_marker), draw(st.sampled_from(["", " ", "&x=1", '"', "'", "#", "\\"]))
    at = draw(st.integers(0, len(text)))
    return f"{text[:at]} password={secret}{after}{text[at:]}", secret


_json_doc = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False,
                                   allow_infinity=False), _strings),
                         lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                 st.dictionaries(_strings, inner, max_size=4)),
                         max_leaves=10)
FIELDS = [("target", "gpu"), ("model", "id"), ("name",), ("serve", "served_model_name"),
          ("image", "repository"), ("model", "revision"), ("target", "driver")]
BASE = yaml.safe_load((FROZEN_RECIPES / "qwen2-7b-h100.yaml").read_text())


def _file_name(text: str) -> str:
    name = "".join(ch for ch in text if ch not in "/\x00")
    while len(name.encode()) > 150:
        name = name[:-1]
    return f"r{name}.yaml"


def _cli(args: list[str]) -> tuple[int, str, str]:
    from imgfab.cli import main  # noqa: PLC0415

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["imgfab", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.argv = saved
    return code, out.getvalue(), err.getvalue()


def _judge_json(text: str, secrets: list[str]) -> None:
    counts = FIGURES["output"]
    try:
        parsed = json.loads(text)
        assert isinstance(parsed, dict)
    except (ValueError, AssertionError):
        counts["invalid_json"] += 1
        raise AssertionError(f"invalid JSON: {text[:300]!r}") from None
    if any(secret in text for secret in secrets):
        counts["secrets_leaked"] += 1
        raise AssertionError(f"a planted secret in the JSON: {text[:300]!r}")


def _judge_terminal(text: str) -> None:
    if _raw_controls(text):
        FIGURES["output"]["raw_controls"] += 1
        raise AssertionError(f"raw control characters on the terminal: {text[:300]!r}")


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(value=hostile_strings(), name=hostile_strings(), doc=_json_doc, field=st.sampled_from([*FIELDS, None]),
       command=st.sampled_from(["validate --json", "validate", "list --json", "list"]))
def test_hostile_strings_leave_one_json_object_and_a_clean_terminal(value, name, doc, field, command):
    (text, secret), (other, other_secret) = value, name
    secrets = [s for s in (secret, other_secret) if s]
    with _timed("output"), tempfile.TemporaryDirectory(prefix="imgfab-fuzz-") as directory:
        try:
            error = RecipeError(text, field=other, fix=text)
            _judge_json(dumps(document("fuzz", exit_code=2, error=error_object(error), value=text,
                                       nested={other: [text, doc]}, doc=doc)), secrets)
            _judge_terminal(error.one_line())
            _judge_terminal(printable(text))
            plain = io.StringIO()
            Progress("plain", stream=plain).item(text, 1, 1, other)
            _judge_terminal(plain.getvalue())
            recipe = dict(BASE, **{k: dict(v) for k, v in BASE.items() if isinstance(v, dict)})
            if field is not None:  # None: a valid recipe, only its file name is hostile
                section = recipe if len(field) == 1 else recipe[field[0]]
                section[field[-1]] = text
            path = Path(directory, _file_name(other))
            path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
            words = command.split()
            target = str(path) if words[0] == "validate" else directory
            code, out, err = _cli([*words, target, "--compat-dir", str(FROZEN_COMPAT)])
        except AssertionError:
            raise
        except Exception as exc:
            FIGURES["output"]["crashes"] += 1
            raise AssertionError(f"{type(exc).__name__}: {str(exc)[:300]}") from exc
        if code == 1 or "internal error" in err:
            FIGURES["output"]["crashes"] += 1
            raise AssertionError(f"{command} exited {code}: {err[:300]!r}")
        if "--json" in words:
            _judge_json(out, secrets)
        _judge_terminal(out + err)
        FIGURES["output"][f"outcome {command}: exit {code}"] += 1
