"""Era-correct locks (issue 20, item 5): `imgfab lock` resolves under the backend release's upload
time plus a stated grace (uv --exclude-newer), records the bound in the lock header and in the
fingerprint, and refuses a locked pin outside the ranges the backend's own wheel declares.

Offline but for the test marked `network` (deselected unless `-m network` names it), which asks
the real uv against PyPI whether the bound is honoured.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from imgfab.errors import CompatibilityError, MatrixError, RecipeError
from imgfab.matrix.compat import load_matrix
from imgfab.matrix.pypi import PYPI_PROJECT_URL, release_files, release_uploaded
from imgfab.payload import era
from imgfab.payload import lock as lockmod
from imgfab.payload.lock import Lock, LockedPackage, PayloadRequest
from imgfab.recipe import load_recipe
from imgfab.stack.resolve import resolve

from conftest import REPO, VLLM_0191

PYPI = REPO / "tests" / "fixtures" / "pypi"
WHEEL_METADATA = REPO / "tests" / "fixtures" / "wheel_metadata"
RECIPE = VLLM_0191  # vllm 0.19.1, torch 2.10.0, with its committed lock


def _request_of(recipe_path: Path, compat_dir: Path | None = None) -> PayloadRequest:
    recipe = load_recipe(str(recipe_path))
    stack = resolve(recipe, load_matrix(compat_dir)).stack
    return lockmod.payload_request(recipe, stack, compat_dir)


# ---------------------------------------------------------------- the bound, from recorded data


def test_the_bound_is_the_release_upload_time_from_the_pypi_json_plus_14_days():
    """vllm.json is PyPI's project JSON as `compat refresh` read it (trimmed): 0.19.1's files
    were uploaded 2026-04-18T05:49:16Z (aarch64 wheel) to 05:50:15Z (sdist); the release is
    complete at the last one."""
    index = json.loads((PYPI / "vllm.json").read_text())
    files = release_files(index, "0.19.1", PYPI_PROJECT_URL.format(project="vllm"))
    assert sorted(f.uploaded for f in files) == ["2026-04-18T05:49:16Z", "2026-04-18T05:49:54Z",
                                                 "2026-04-18T05:50:15Z"]
    assert release_uploaded(files) == "2026-04-18T05:50:15Z"
    assert era.GRACE.days == 14
    assert era.exclude_newer("2026-04-18T05:50:15Z") == "2026-05-02T05:50:15Z"
    # The case: vLLM 0.8.5.post1 (uploaded 2025-05-02) is bounded mid-May 2025, where
    # transformers 4.51.3 was the newest release.
    old = release_files(index, "0.8.5.post1", PYPI_PROJECT_URL.format(project="vllm"))
    assert era.exclude_newer(release_uploaded(old)) == "2025-05-16T22:31:09Z"
    # What the shipped matrix records is what the JSON gives (compat refresh wrote it).
    row = next(r for r in load_matrix().releases if r.backend == "vllm" and r.version == "0.19.1")
    assert row.uploaded == "2026-04-18T05:50:15Z"


def test_the_lock_header_records_the_bound_and_where_it_came_from():
    request = _request_of(RECIPE)
    assert request.exclude_newer == "2026-05-02T05:50:15Z"
    text = lockmod.format_lock(request, [], uv_version="0.13.9")
    assert ("# exclude-newer: 2026-05-02T05:50:15Z (vllm 0.19.1 uploaded 2026-04-18T05:50:15Z on PyPI, "
            "+ 14 days grace)\n") in text
    assert Lock.parse(text).parsed.first("exclude-newer").startswith("2026-05-02T05:50:15Z ")
    # Pure: the same recipe and matrix give the same text.
    assert text == lockmod.format_lock(_request_of(RECIPE), [], uv_version="0.13.9")


def test_a_tensorrt_llm_lock_is_bounded_by_its_pypi_sdist_upload():
    request = _request_of(REPO / "recipes" / "mistral-7b-a100-trtllm.yaml")
    assert request.era == ("2026-05-04T09:20:02Z (tensorrt-llm 1.2.1 uploaded 2026-04-20T09:20:02Z on PyPI, "
                           "+ 14 days grace)")


def test_the_committed_locks_record_the_bound_their_matrix_gives():
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        request = _request_of(path)
        lock = Lock.parse(path.with_suffix(".lock").read_text())
        assert lock.parsed.first("exclude-newer") == request.era, path.name


def _compat_copy(tmp_path: Path) -> Path:
    compat = tmp_path / "compat"
    shutil.copytree(REPO / "compat", compat)
    return compat


def _set_uploaded(compat: Path, version: str, value: str | None) -> None:
    path = compat / "vllm.yaml"
    data = yaml.safe_load(path.read_text())
    for row in data["releases"]:
        if row["version"] == version:
            if value is None:
                row.pop("uploaded")
            else:
                row["uploaded"] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_check_notices_a_moved_bound(tmp_path):
    """Same pins, another recorded upload time: the committed lock is stale, and its header
    line no longer matches what the matrix gives."""
    compat = _compat_copy(tmp_path)
    committed = Lock.parse(RECIPE.with_suffix(".lock").read_text(), "qwen2-7b-h100.lock")
    assert lockmod.check_lock(str(RECIPE)).problem == ""
    _set_uploaded(compat, "0.19.1", "2026-04-20T00:00:00Z")
    moved = _request_of(RECIPE, compat)
    assert moved.exclude_newer == "2026-05-04T00:00:00Z"
    assert committed.fingerprint != lockmod.lock_fingerprint(moved, committed.text)
    assert "stale" in lockmod.check_lock(str(RECIPE), compat).problem
    with pytest.raises(RecipeError, match=r"its '# exclude-newer:' lines record 2026-05-02T05:50:15Z .*"
                                          r"give 2026-05-04T00:00:00Z"):
        lockmod.check_header(committed, moved, "qwen2-7b-h100.lock", str(RECIPE))


def test_a_release_without_an_upload_time_is_refused_before_uv(tmp_path, monkeypatch):
    compat = _compat_copy(tmp_path)
    _set_uploaded(compat, "0.19.1", None)
    monkeypatch.setattr(lockmod, "uv_binary", lambda: pytest.fail("uv must not run"))
    with pytest.raises(MatrixError, match="vllm 0.19.1 records no 'uploaded:' time") as caught:
        lockmod.lock_recipe(str(RECIPE), compat_dir=compat, output=tmp_path / "x.lock")
    assert "imgfab compat refresh" in caught.value.one_line()


def test_a_malformed_upload_time_is_refused_by_the_matrix(tmp_path):
    compat = _compat_copy(tmp_path)
    _set_uploaded(compat, "0.19.1", "2026-04-18 05:50")
    with pytest.raises(MatrixError, match=r"vllm.yaml 0.19.1: uploaded '2026-04-18 05:50'"):
        load_matrix(compat)


FAKE_UV = """#!/bin/sh
printf '%s\\n' "$@" > "{argv}"
echo 'error: recorded' >&2
exit 2
"""


def test_uv_is_run_with_the_bound(tmp_path):
    argv_file = tmp_path / "argv"
    uv = tmp_path / "uv"
    uv.write_text(FAKE_UV.format(argv=argv_file))
    uv.chmod(0o755)
    request = _request_of(RECIPE)
    with pytest.raises(CompatibilityError):
        lockmod.resolve_packages(request, uv=str(uv))
    argv = argv_file.read_text().splitlines()
    assert argv[argv.index("--exclude-newer") + 1] == "2026-05-02T05:50:15Z"


def test_upgrade_prints_the_moved_bound_above_the_pins():
    request = _request_of(RECIPE)
    new = Lock.parse(lockmod.format_lock(request, [], uv_version="0.13.9"))
    unbounded = Lock.parse(lockmod.format_lock(PayloadRequest(**{**request.__dict__, "exclude_newer": "",
                                                                 "era": ""}), [], uv_version="0.13.9"))
    assert lockmod.era_diff(unbounded, new) == ["bound: exclude-newer none -> 2026-05-02T05:50:15Z"]
    assert lockmod.era_diff(new, new) == [] and lockmod.era_diff(None, new) == []


# ---------------------------------------------------------------- the backend's declared ranges


def _vllm_0191() -> LockedPackage:
    """vllm 0.19.1 with the Requires-Dist of its real x86_64 wheel METADATA (recorded 2026-12-03)."""
    text = (WHEEL_METADATA / "vllm-0.19.1-cp38-abi3-manylinux_2_31_x86_64.whl.METADATA").read_text()
    requires = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]
    return LockedPackage("vllm", "0.19.1", [], [], requires=requires)


def _locked(lock_path: Path) -> list[LockedPackage]:
    lock = Lock.parse(lock_path.read_text())
    return [LockedPackage(name, version, hashes, []) for name, (version, hashes) in lock.packages.items()
            if name != "vllm"]


def test_the_committed_vllm_lock_is_inside_the_ranges_vllm_declares():
    request = _request_of(RECIPE)
    lockmod.check_declared_ranges([_vllm_0191(), *_locked(RECIPE.with_suffix(".lock"))], request)


@pytest.mark.parametrize("name, version, declared, whose", [
    # transformers!=5.0.*,...,!=5.5.0,>=4.56.0: 5.2.0 is one of the releases vLLM excludes
    ("transformers", "5.2.0", "transformers!=5.0.*,!=5.1.*,!=5.2.*,!=5.3.*,!=5.4.*,!=5.5.0,>=4.56.0",
     "what uv resolved"),
    ("torch", "2.11.0", "torch==2.10.0", "a pin of the stack"),
    ("compressed-tensors", "0.16.0", "compressed-tensors==0.15.0.1", "what uv resolved"),
])
def test_a_pin_outside_a_declared_range_is_refused_naming_package_pin_and_range(name, version, declared, whose):
    request = _request_of(RECIPE)
    packages = [_vllm_0191(), *(p for p in _locked(RECIPE.with_suffix(".lock")) if p.name != name),
                LockedPackage(name, version, [], [])]
    with pytest.raises(CompatibilityError) as caught:
        lockmod.check_packages(packages, request, "12.8.2")
    line = caught.value.one_line()
    assert "\n" not in line and caught.value.exit_code == 2
    assert (f"{name} {version} is incompatible with vllm 0.19.1: the lock pins {name}=={version} ({whose}), "
            f"vllm 0.19.1 declares {declared} (its wheel's Requires-Dist)") in line


def test_the_lock_reads_the_backend_wheel_metadata(monkeypatch):
    """inspect_packages asks the backend's wheel (and torch's) for its METADATA beside the
    RECORD, and fills ``requires`` from its Requires-Dist; other wheels give only their RECORD."""
    from imgfab.matrix import wheelzip

    metadata = (WHEEL_METADATA / "vllm-0.19.1-cp38-abi3-manylinux_2_31_x86_64.whl.METADATA").read_text()
    asked: dict[str, tuple[str, ...]] = {}

    def members(url, digest, suffixes, **kwargs):
        asked[url.rsplit("/", 1)[1]] = tuple(suffixes)
        found = {".dist-info/RECORD": "pkg/__init__.py,sha256=x,10\n"}
        if ".dist-info/METADATA" in suffixes:
            found[".dist-info/METADATA"] = metadata
        return found

    monkeypatch.setattr(wheelzip, "read_members", members)
    vllm = LockedPackage("vllm", "0.19.1", [f"sha256:{'a' * 64}"], ["https://h/vllm.whl"])
    six = LockedPackage("six", "1.17.0", [f"sha256:{'b' * 64}"], ["https://h/six.whl"])
    lockmod.inspect_packages([vllm, six], workers=1)
    assert ".dist-info/METADATA" in asked["vllm.whl"] and ".dist-info/METADATA" not in asked["six.whl"]
    assert "torch==2.10.0" in vllm.requires and len(vllm.requires) == 88 and six.requires == []


def test_requirements_behind_an_extra_or_a_false_marker_do_not_apply():
    """vllm 0.19.1 declares `mistral_common[audio]; extra == "audio"` and aarch64/other-platform
    pins; none of them binds an x86_64 Linux image without extras."""
    request = _request_of(RECIPE)
    vllm = _vllm_0191()
    assert any("extra ==" in r for r in vllm.requires)
    vllm.requires.append('six==0.1; platform_machine == "aarch64"')
    vllm.requires.append('six==0.2; extra == "audio"')
    lockmod.check_declared_ranges([vllm, LockedPackage("six", "1.17.0", [], [])], request)
    vllm.requires.append('six==0.3; platform_machine == "x86_64"')
    with pytest.raises(CompatibilityError, match="six 1.17.0 is incompatible with vllm 0.19.1"):
        lockmod.check_declared_ranges([vllm, LockedPackage("six", "1.17.0", [], [])], request)


# ---------------------------------------------------------------- the real uv against PyPI


@pytest.mark.network
def test_uv_against_pypi_honours_the_bound():
    """The issue's own observation: bounded where vLLM 0.8.5.post1's era ends, transformers
    resolves to 4.51.3; unbounded, to a transformers 5 release."""
    bounded = PayloadRequest(recipe="era", stack_line="s", pins=("transformers",), python="3.12",
                             platform="x86_64-manylinux_2_39", cuda_major="12", indexes=(),
                             default_index="https://pypi.org/simple", exclude_newer="2025-05-16T22:31:09Z")
    versions = {p.name: p.version for p in lockmod.resolve_packages(bounded)}
    assert versions["transformers"] == "4.51.3"
    unbounded = PayloadRequest(**{**bounded.__dict__, "exclude_newer": ""})
    latest = {p.name: p.version for p in lockmod.resolve_packages(unbounded)}
    assert int(latest["transformers"].split(".")[0]) >= 5


@pytest.mark.integration
@pytest.mark.parametrize("upload_times", [True, False], ids=["pep700-index", "html-only-index"])
def test_an_index_without_upload_times_is_one_line_naming_the_bound(tmp_path, upload_times):
    """The era bound against a local index: one that reports PEP 700 upload times locks; an
    HTML-only one has every file left out by uv's --exclude-newer, and the refusal says why."""
    sys.path.insert(0, str(REPO / "tests" / "fixtures"))
    from fake_payload import installer_wheel, recipe_pins, serve_index

    recipe = REPO / "recipes" / "qwen2-7b-h200.yaml"
    with serve_index(recipe_pins(recipe), (installer_wheel(),), upload_times=upload_times) as url:
        done = subprocess.run([sys.executable, "-m", "imgfab.cli", "lock", str(recipe), "--index-url", url,
                               "--output", str(tmp_path / "out.lock"), "-q"],
                              capture_output=True, text=True, timeout=300)
    if upload_times:
        assert done.returncode == 0, done.stderr
        assert "# exclude-newer: 2026-08-08T10:40:48Z" in (tmp_path / "out.lock").read_text()
        return
    assert done.returncode == 2 and not (tmp_path / "out.lock").exists(), done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "does not resolve under the era bound exclude-newer 2026-08-08T10:40:48Z" in line
    assert "PEP 700 upload-time" in line
