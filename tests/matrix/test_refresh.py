"""Tests for ``imgfab compat refresh`` (src/imgfab/refresh.py), offline.

The fixtures under ``tests/fixtures/pypi/`` are real PyPI responses, trimmed to what refresh
reads: ``<project>.json`` keeps ``info.name``/``info.version`` and, per release, each file's
``filename``/``url``/``yanked``; ``metadata/<file>.METADATA`` keeps the header lines
Metadata-Version, Name, Version, Requires-Python, the Python-version classifiers and the
Requires-Dist lines on torch, tensorrt*, nvidia-cuda-runtime* and cuda-toolkit. Beside them,
``compat/`` holds the four PyPI-derived compat files (torch, vllm, tensorrt_llm, tensorrt) that
refresh wrote from those responses when they were recorded: the tests refresh copies of these, never
the shipped ``compat/``, so a refresh of the shipped files needs no edit here.

Re-record both from live PyPI and the shipped compat/ (then review the diff) with::

    python tests/matrix/test_refresh.py --record
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
import requests

from imgfab.matrix import pypi
from imgfab.matrix import refresh as R
from imgfab.errors import NetworkError

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pypi"
RECORDED = FIXTURES / "compat"  # the compat files refresh wrote from the recorded responses
FILES = sorted(R.FILES.values())


# --- fakes reading the recorded responses ------------------------------------------------------

def fake_fetch_json(url: str) -> dict:
    match = re.fullmatch(r"https://pypi\.org/pypi/([^/]+)/json", url)
    assert match, f"unexpected URL {url}"
    path = FIXTURES / f"{match.group(1)}.json"
    assert path.exists(), f"no fixture {path}; re-record with `python tests/matrix/test_refresh.py --record`"
    return json.loads(path.read_text(encoding="utf-8"))


def fake_fetch_metadata(url: str, filename: str) -> str:
    path = FIXTURES / "metadata" / f"{filename}.METADATA"
    assert path.exists(), f"no fixture {path}; re-record with `python tests/matrix/test_refresh.py --record`"
    return path.read_text(encoding="utf-8")


def run(compat_dir: Path, **kwargs) -> list[str]:
    kwargs.setdefault("fetch_json", fake_fetch_json)
    kwargs.setdefault("fetch_metadata", fake_fetch_metadata)
    return R.refresh(compat_dir, **kwargs)


@pytest.fixture
def compat_copy(tmp_path: Path) -> Path:
    """A scratch copy of the recorded PyPI-derived compat files."""
    for name in FILES:
        shutil.copy(RECORDED / name, tmp_path / name)
    return tmp_path


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


def drop_release(directory: Path, kind: str, version: str) -> None:
    """Rewrite one compat file without one release (as if PyPI had just published it)."""
    path = directory / R.FILES[kind]
    rows = [row for v, row in R.read_records(path).items() if v != version]
    path.write_text(R.render(kind, rows), encoding="utf-8")


# --- the recorded responses reproduce the committed data ----------------------------------------

def test_refresh_reproduces_the_recorded_rows(compat_copy: Path) -> None:
    summary = run(compat_copy)

    assert summary == []
    for name in FILES:
        produced = R.read_records(compat_copy / name)
        recorded = R.read_records(RECORDED / name)
        assert produced, name
        for version, row in produced.items():
            assert row == recorded.get(version), f"{name} {version}"
        assert (compat_copy / name).read_bytes() == (RECORDED / name).read_bytes(), name


def test_fixture_versions_cover_the_recorded_files() -> None:
    """Every recorded release has its metadata recorded, so the test above checks all rows."""
    recorded = {p.name[: -len(".METADATA")] for p in (FIXTURES / "metadata").iterdir()}
    for name in FILES:
        for version, row in R.read_records(RECORDED / name).items():
            if (row.get("index") or R.PYPI_INDEX) != R.PYPI_INDEX:
                continue  # a hand-kept row from another index (torch 2.9.1+cu130): nothing to record
            filename = row["source"].split()[1]
            assert filename in recorded, f"{name} {version}: {filename} not recorded"


def test_output_is_byte_identical_across_runs(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for directory in (first, second):
        directory.mkdir()
        for name in FILES:
            shutil.copy(RECORDED / name, directory / name)
        run(directory)
        run(directory)  # a second pass over its own output changes nothing either
    for name in FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes()

    empty_a, empty_b = tmp_path / "c", tmp_path / "d"
    for directory in (empty_a, empty_b):
        directory.mkdir()
        run(directory)
    for name in FILES:
        assert (empty_a / name).read_bytes() == (empty_b / name).read_bytes()


# --- new releases ------------------------------------------------------------------------------

def test_new_release_without_upstream_data_is_unconfirmed(compat_copy: Path) -> None:
    drop_release(compat_copy, "vllm", "0.33.0")
    drop_release(compat_copy, "tensorrt-llm", "1.2.1")

    summary = run(compat_copy)

    assert "vllm.yaml: added 0.33.0 (confirmed: false)" in summary
    assert "tensorrt_llm.yaml: added 1.2.1 (confirmed: false)" in summary
    vllm = R.read_records(compat_copy / "vllm.yaml")["0.33.0"]
    # PyPI facts are filled in ...
    assert vllm["torch"] == "==2.14.0" and vllm["cuda"] == "13.0"
    assert vllm["python"] == "<3.15,>=3.11"
    assert "cp38-abi3-manylinux_2_28_x86_64" in vllm["wheel_tags"]
    # ... upstream-only facts are not invented.
    assert vllm["confirmed"] is False
    assert vllm["cuda_archs"] == [] and vllm["ptx_archs"] == [] and vllm["build_cuda"] == ""
    assert "new release" in vllm["note"] and "cuda_archs" in vllm["note"]
    trtllm = R.read_records(compat_copy / "tensorrt_llm.yaml")["1.2.1"]
    assert trtllm["confirmed"] is False and trtllm["base_image"] == "" and trtllm["cuda"] == ""
    assert trtllm["tensorrt"] == "~=10.14.1"
    # Releases already in the file keep their upstream facts.
    kept = R.read_records(compat_copy / "vllm.yaml")["0.11.0"]
    assert kept == R.read_records(RECORDED / "vllm.yaml")["0.11.0"]


def test_changed_pypi_fact_is_reported(compat_copy: Path) -> None:
    path = compat_copy / "vllm.yaml"
    rows = R.read_records(path)
    rows["0.11.0"]["torch"] = "==2.7.1"
    path.write_text(R.render("vllm", rows.values()), encoding="utf-8")

    summary = run(compat_copy)

    assert summary == ["vllm.yaml: 0.11.0: torch '==2.7.1' -> '==2.8.0'"]
    assert path.read_bytes() == (RECORDED / "vllm.yaml").read_bytes()


# --- failures ----------------------------------------------------------------------------------

def _failing_metadata(bad: str):
    def fetch(url: str, filename: str) -> str:
        if filename == bad:
            raise requests.ConnectionError(f"connection reset while reading {url}")
        return fake_fetch_metadata(url, filename)
    return fetch


def _failing_json(bad_project: str):
    def fetch(url: str) -> dict:
        if f"/pypi/{bad_project}/json" in url:
            raise requests.Timeout("read timed out")
        return fake_fetch_json(url)
    return fetch


@pytest.mark.parametrize("kwargs, what", [
    ({"fetch_metadata": _failing_metadata("vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl")},
     "vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl"),
    ({"fetch_json": _failing_json("tensorrt")}, "https://pypi.org/pypi/tensorrt/json"),
])
def test_network_failure_raises_and_leaves_files_untouched(compat_copy: Path, kwargs, what) -> None:
    drop_release(compat_copy, "vllm", "0.33.0")  # a successful run would rewrite vllm.yaml
    before = snapshot(compat_copy)

    with pytest.raises(NetworkError) as caught:
        run(compat_copy, **kwargs)

    assert what in caught.value.message
    assert caught.value.field == "pypi" and "refresh" in caught.value.fix
    assert snapshot(compat_copy) == before  # same names (no temp files), bytes and mtimes


def test_default_fetch_json_turns_transport_errors_into_network_error(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise requests.ConnectionError("Name or service not known")
    monkeypatch.setattr(requests, "get", refuse)

    with pytest.raises(NetworkError, match="could not read https://pypi.org/pypi/vllm/json"):
        R.fetch_json("https://pypi.org/pypi/vllm/json")


def test_write_atomically_keeps_the_old_file_when_the_rename_fails(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "vllm.yaml"
    target.write_text("old\n", encoding="utf-8")

    def broken_replace(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", broken_replace)

    with pytest.raises(OSError):
        R.write_atomically(target, "new\n")
    assert target.read_text(encoding="utf-8") == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["vllm.yaml"]


# --- pieces --------------------------------------------------------------------------------------

class _FakeResponse:
    def __init__(self, status: int, content: bytes = b"", headers: dict | None = None):
        self.status_code, self.content, self.headers = status, content, headers or {}

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise requests.HTTPError(f"{self.status_code}")


class _FakeRequests:
    """Serves one wheel with Range support and no PEP 658 .metadata file; counts bytes sent."""

    RequestException = requests.RequestException

    def __init__(self, url: str, blob: bytes):
        self.url, self.blob, self.sent = url, blob, 0

    def head(self, url, **kwargs):
        return _FakeResponse(200, headers={"Content-Length": str(len(self.blob))})

    def get(self, url, headers=None, **kwargs):
        if url == self.url + ".metadata":
            return _FakeResponse(404)
        start, end = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", headers["Range"]).groups())
        self.sent += end + 1 - start
        return _FakeResponse(206, self.blob[start:end + 1])


def test_fetch_metadata_reads_a_wheel_by_range_when_pep658_is_missing(monkeypatch) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        wheel.writestr("demo/big.bin", os.urandom(3 * R._HttpRangeFile.BLOCK))
        wheel.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\nRequires-Dist: torch==2.8.0\n")
    url = "https://files.example/demo-1.0-py3-none-manylinux_2_28_x86_64.whl"
    fake = _FakeRequests(url, buffer.getvalue())
    monkeypatch.setattr(pypi, "_session", lambda: fake)

    text = R.fetch_metadata(url, url.rsplit("/", 1)[1])

    assert R.parse_core_metadata(text).requires_dist == ("torch==2.8.0",)
    assert fake.sent < len(fake.blob)  # the big member was never downloaded


def test_torch_record_reads_cuda_toolkit_pins_of_torch_2_11_and_later() -> None:
    meta = R.parse_core_metadata(
        "Name: torch\nVersion: 2.11.0\nRequires-Python: >=3.10\n"
        "Requires-Dist: cuda-toolkit[cublas,cudart,nvrtc]==13.0.2; platform_system == \"Linux\"\n")
    record = R.torch_record("2.11.0", meta, "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    assert (record["cuda"], record["cuda_runtime"], record["confirmed"]) == ("13.0", "13.0.2", True)


def test_requirements_for_other_platforms_are_ignored() -> None:
    meta = R.parse_core_metadata(
        "Name: x\nVersion: 1\n"
        "Requires-Dist: torch==2.9.0; platform_machine == \"aarch64\"\n"
        "Requires-Dist: torch==2.8.0; platform_machine == \"x86_64\"\n"
        "Requires-Dist: torch==2.7.0; extra == \"old\"\n")
    assert str(R.requirement(meta, "torch")) == 'torch==2.8.0; platform_machine == "x86_64"'


def test_metadata_file_prefers_the_highest_build_and_skips_free_threaded() -> None:
    files = [R.DistFile(name, "https://x/" + name) for name in (
        "vllm-0.23.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "vllm-0.23.0-2-cp38-abi3-manylinux_2_28_x86_64.whl",
        "vllm-0.23.0-2-cp38-abi3-manylinux_2_28_aarch64.whl",
        "vllm-0.23.0.tar.gz")]
    assert R.metadata_file(files).filename == "vllm-0.23.0-2-cp38-abi3-manylinux_2_28_x86_64.whl"
    torch = [R.DistFile(n, "https://x/" + n) for n in (
        "torch-2.8.0-cp313-cp313t-manylinux_2_28_x86_64.whl",
        "torch-2.8.0-cp312-cp312-manylinux_2_28_x86_64.whl")]
    assert R.metadata_file(torch).filename == "torch-2.8.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    assert R.wheel_tags(files) == ["cp38-abi3-manylinux_2_28_aarch64", "cp38-abi3-manylinux_2_28_x86_64"]


def test_unknown_package_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown packages"):
        R.refresh(tmp_path, fetch_json=fake_fetch_json, fetch_metadata=fake_fetch_metadata,
                  packages=("sglang",))


# --- recording the fixtures from live PyPI -------------------------------------------------------

_KEPT_REQUIREMENTS = re.compile(r"^(torch|tensorrt([-_]cu\d+)?|nvidia-cuda-runtime(-cu\d+)?|cuda-toolkit)\b",
                                re.IGNORECASE)
# Releases kept in an index fixture besides the ones whose metadata was read (first file only),
# so that version filtering (floors, pre-releases, pins) is exercised too.
_INDEX_FLOORS = {"vllm": "0.7.0", "tensorrt-llm": "0.18.0", "torch": "2.5.0", "tensorrt": "10.9.0"}


def _trim_metadata(text: str) -> str:
    keep = []
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(": ")
        if key in ("Metadata-Version", "Name", "Version", "Requires-Python") or (
                key == "Classifier" and re.fullmatch(r"Programming Language :: Python :: \d+\.\d+", value)) or (
                key == "Requires-Dist" and _KEPT_REQUIREMENTS.match(value)):
            keep.append(line)
    return "\n".join(keep) + "\n"


def _trim_index(project: str, index: dict, read: set[str]) -> dict:
    from packaging.version import InvalidVersion, Version

    releases = {}
    for version, files in sorted(index["releases"].items()):
        try:
            parsed = Version(version)
        except InvalidVersion:
            continue
        if any(f["filename"] in read for f in files):
            rows = files
        elif parsed >= Version(_INDEX_FLOORS[project]) and files:
            rows = files[:1]
        else:
            continue
        releases[version] = [{"filename": f["filename"], "url": f["url"], "yanked": bool(f.get("yanked")),
                              "upload_time_iso_8601": f["upload_time_iso_8601"]}
                             for f in sorted(rows, key=lambda f: f["filename"])]
    return {"info": {"name": index["info"]["name"], "version": index["info"]["version"]},
            "releases": releases}


def record() -> None:
    """Run refresh against live PyPI on a copy of the shipped compat/ and store what it read,
    trimmed, and the compat files it wrote."""
    indexes: dict[str, dict] = {}
    texts: dict[str, str] = {}

    def recording_json(url: str) -> dict:
        data = R.fetch_json(url)
        indexes[url.split("/pypi/")[1].split("/")[0]] = data
        return data

    def recording_metadata(url: str, filename: str) -> str:
        texts[filename] = R.fetch_metadata(url, filename)
        return texts[filename]

    with tempfile.TemporaryDirectory() as scratch:
        for name in FILES:
            shutil.copy(REPO / "compat" / name, Path(scratch) / name)
        for line in R.refresh(Path(scratch), fetch_json=recording_json, fetch_metadata=recording_metadata):
            print(line)
        shutil.rmtree(FIXTURES, ignore_errors=True)
        (FIXTURES / "metadata").mkdir(parents=True)
        RECORDED.mkdir()
        for name in FILES:
            shutil.copy(Path(scratch) / name, RECORDED / name)
    for project, index in sorted(indexes.items()):
        trimmed = _trim_index(project, index, set(texts))
        (FIXTURES / f"{project}.json").write_text(json.dumps(trimmed, indent=1, sort_keys=True) + "\n",
                                                  encoding="utf-8")
    for filename, text in sorted(texts.items()):
        (FIXTURES / "metadata" / f"{filename}.METADATA").write_text(_trim_metadata(text), encoding="utf-8")
    print(f"recorded {len(indexes)} indexes, {len(texts)} metadata files and {len(FILES)} compat files "
          f"under {FIXTURES}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/matrix/test_refresh.py --record")
    record()
