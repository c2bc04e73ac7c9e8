"""Progress on long steps (issue 23): rich on a terminal, plain lines on stderr otherwise,
nothing with -q; lock reports its steps and every RECORD read, refresh every release."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

from imgfab.progress import Progress, for_command

FIXTURES = REPO / "tests" / "fixtures" / "pypi"


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_throttle_items_but_keep_steps_and_edges():
    out, clock = io.StringIO(), _Clock()
    progress = Progress("plain", stream=out, interval_s=2.0, clock=clock)
    progress.step("resolving")
    for done in range(1, 101):
        clock.now += 0.1  # 100 items over 10 s: the first, one per 2 s, and the last
        progress.item("RECORD", done, 100, f"pkg{done}")
    progress.bytes("w.whl", 10, 1000)
    progress.bytes("w.whl", 1000, 1000)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("] resolving") and re.match(r"\[ +0\.0s\] ", lines[0])
    items = [line for line in lines if "RECORD" in line]
    assert items[0].endswith("RECORD: 1/100 pkg1") and items[-1].endswith("RECORD: 100/100 pkg100")
    assert 4 <= len(items) <= 8, items
    assert lines[-1].endswith("w.whl: 1.0 kB of 1.0 kB read")


def test_quiet_prints_nothing_and_a_pipe_gets_plain_lines():
    out = io.StringIO()
    quiet = for_command(quiet=True, stream=out)
    quiet.step("x")
    quiet.item("y", 1, 1)
    assert out.getvalue() == "" and quiet.mode == "quiet"
    assert for_command(quiet=False, stream=out).mode == "plain"  # StringIO is no terminal


def test_rich_mode_shows_a_status_and_stops_it():
    out = io.StringIO()
    with Progress("rich", stream=out) as progress:
        progress.step("resolving")
        progress.item("RECORD", 1, 2)
        assert progress._status is not None
    assert progress._status is None


def test_inspect_reports_each_record_read(monkeypatch):
    from imgfab.matrix import wheelzip
    from imgfab.payload import lock as lockmod
    from imgfab.payload.lockfile import LockedPackage

    monkeypatch.setattr(wheelzip, "read_members",
                        lambda url, digest, suffixes: {".dist-info/RECORD": "a/b.py,sha256=x,10\n"})
    packages = [LockedPackage(name=f"p{i}", version="1.0", hashes=["sha256:" + "0" * 64],
                              urls=[f"https://h/p{i}.whl"]) for i in range(5)]
    out = io.StringIO()
    lockmod.inspect_packages(packages, progress=Progress("plain", stream=out, interval_s=0))
    done = sorted(int(m) for m in re.findall(r"RECORD: (\d)/5", out.getvalue()))
    assert done == [1, 2, 3, 4, 5]
    assert all(p.files == {"a/b.py": "sha256=x"} for p in packages)


def _fake_json(url: str) -> dict:
    name = re.fullmatch(r"https://pypi\.org/pypi/([^/]+)/json", url).group(1)
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def _fake_metadata(url: str, filename: str) -> str:
    return (FIXTURES / "metadata" / f"{filename}.METADATA").read_text(encoding="utf-8")


def test_refresh_reports_each_release(tmp_path):
    from imgfab.matrix import refresh as R

    for name in R.FILES.values():
        shutil.copy(REPO / "compat" / name, tmp_path / name)
    out = io.StringIO()
    R.refresh(tmp_path, fetch_json=_fake_json, fetch_metadata=_fake_metadata,
              progress=Progress("plain", stream=out, interval_s=0))
    text = out.getvalue()
    releases = len(R.read_records(tmp_path / R.FILES["vllm"]))
    assert f"vllm releases: {releases}/{releases} " in text
    assert "reading the torch releases from PyPI" in text and "torch 2." in text
    assert "tensorrt-llm releases: 1/" in text


def _lock(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", "lock",
                           str(REPO / "recipes" / "qwen2-7b-h100.yaml"),
                           "--index-url", "http://127.0.0.1:9/simple",
                           "--output", str(tmp_path / "x.lock"), *args],
                          capture_output=True, text=True, timeout=120)


def test_lock_shows_its_steps_on_stderr_and_q_silences_them(tmp_path):
    """An index that does not answer: the steps are shown, then the one error line last."""
    shown = _lock(tmp_path=tmp_path)
    lines = shown.stderr.strip().splitlines()
    assert shown.returncode == 1, shown.stderr  # the network, not the recipe
    assert re.match(r"\[ +[0-9.]+s\] qwen2-7b-h100: checking the indexes answer$", lines[0]), lines
    assert lines[-1].startswith("imgfab: ") and sum(l.startswith("imgfab: ") for l in lines) == 1
    quiet = _lock("-q", tmp_path=tmp_path)
    assert quiet.returncode == 1 and len(quiet.stderr.strip().splitlines()) == 1, quiet.stderr
    as_json = _lock("--json", tmp_path=tmp_path)
    assert json.loads(as_json.stdout)["command"] == "lock"  # stdout keeps its one object


def test_bake_reports_each_recipe_and_q_silences_it(tmp_path):
    recipes = [str(REPO / "recipes" / name) for name in ("qwen2-7b-h100.yaml", "llama31-8b-l4.yaml")]
    argv = [sys.executable, "-m", "imgfab.cli", "bake", *recipes, "-o", str(tmp_path / "bake.json")]
    loud = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert loud.returncode == 0, loud.stderr
    lines = loud.stderr.splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == [
        "bake: rendered: 1/2 qwen2-7b-h100.yaml", "bake: rendered: 2/2 llama31-8b-l4.yaml"], lines
    quiet = subprocess.run([*argv, "-q"], capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_layer_bytes_add_up_every_layer_of_a_stream():
    from imgfab.docker.engine import LayerBytes

    seen = LayerBytes()
    stream = [
        {"status": "Pulling fs layer", "id": "a", "progressDetail": {}},
        {"status": "Downloading", "id": "a", "progressDetail": {"current": 5, "total": 10}},
        {"status": "Downloading", "id": "b", "progressDetail": {"current": 1, "total": 30}},
        {"status": "Download complete", "id": "a", "progressDetail": {"hidecounts": True}},
        # unpacking reports its own counts, never the bytes read
        {"status": "Extracting", "id": "b", "progressDetail": {"current": 99, "total": 99}},
        {"status": "Pull complete", "id": "b", "progressDetail": {}},
        {"status": "Digest: sha256:" + "0" * 64},
    ]
    moved = [seen.see(item) for item in stream]
    assert moved == [False, True, True, True, False, True, False]
    assert (seen.done, seen.total) == (40, 40)
