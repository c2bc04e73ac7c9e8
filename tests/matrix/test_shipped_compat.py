"""What the shipped compat/ is: it loads with the validating loader, every record names its source
and says whether it was confirmed, its tables are sorted, and it says when it was read.

Only that. Which stack the resolver picks, or what a row says, is tested on the frozen matrix
(tests/fixtures/compat_frozen), so that a refresh of compat/ never needs a test edit: these checks
hold for any compat/ that `imgfab compat refresh` and the README's rules produce.

Freshness is checked as data, not against the calendar: every release says when it was uploaded and
every measured row when it was read, and no date is later than today or a read earlier than the
upload it measured. A bound on the age of the newest date would turn CI red on a calendar day with
no change in the tree; `imgfab compat refresh` is what keeps the data recent.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imgfab.matrix.compat import load_matrix
from imgfab.matrix.gpus import USABLE_FRACTION, nvml_key, usable_range

from conftest import REPO

COMPAT = REPO / "compat"
FILES = sorted(path.name for path in COMPAT.glob("*.yaml"))


def _data(name: str) -> dict:
    return yaml.safe_load((COMPAT / name).read_text(encoding="utf-8"))


def _records(name: str):
    """(where, record) for every record of a compat file: the rows of each top-level table, the
    records nested in a row (nvml_names, jit_toolchains), and a top-level record (installer)."""
    for key, value in _data(name).items():
        if isinstance(value, dict) and "source" in value:
            yield f"{name} {key}", value
        if not isinstance(value, list):
            continue
        for index, row in enumerate(value):
            if not isinstance(row, dict):
                continue
            yield f"{name} {key}[{index}]", row
            for field, nested in row.items():
                if field == "signatures":  # triton_launchers.yaml: measured data of the sourced row
                    continue
                if isinstance(nested, list) and nested and isinstance(nested[0], dict):
                    for inner, entry in enumerate(nested):
                        yield f"{name} {key}[{index}].{field}[{inner}]", entry


@pytest.fixture(scope="module")
def shipped():
    return load_matrix(COMPAT)


# --- schema: the validating loader takes it ----------------------------------------------------

def test_the_shipped_compat_loads_with_the_validating_loader(shipped):
    assert {release.backend for release in shipped.releases} == {"vllm", "tensorrt-llm"}
    assert shipped.gpus and shipped.toolkits and shipped.torch and shipped.precisions and shipped.advisories


@pytest.mark.parametrize("precision", ["fp8", "gptq", "int4_awq", "int8_sq", "nvfp4", "kv_fp8"])
def test_each_vllm_release_has_one_rule_per_method_read_at_a_tag(shipped, precision):
    rules = [r for r in shipped.precisions if r.backend == "vllm" and r.precision == precision]
    for release in shipped.backend_releases("vllm"):
        version = Version(release.version)
        matching = [r for r in rules if not r.backend_versions or version in SpecifierSet(r.backend_versions)]
        assert len(matching) == 1, (precision, release.version, [r.backend_versions for r in matching])
    for rule in rules:
        assert rule.confirmed and rule.source.startswith("vllm-project/vllm@v"), rule
        for source in rule.source.split(" ; "):
            tag = source.split("@v", 1)[1].split(":", 1)[0]
            assert not rule.backend_versions or Version(tag) in SpecifierSet(rule.backend_versions), \
                (rule.backend_versions, source)


def test_every_advisorys_fix_is_outside_its_range(shipped):
    for advisory in shipped.advisories:
        assert advisory.summary and advisory.severity, advisory.id
        assert not advisory.affects(advisory.package, advisory.fixed), advisory.id


def test_the_gpu_names_memory_can_always_tell_apart(shipped):
    """A key (spelling-independent name) stands for one GPU, or for GPUs whose usable memory
    ranges do not overlap."""
    owners: dict[str, set[str]] = {}
    for gpu in shipped.gpus:
        for name in (gpu.name, *gpu.aliases, *(e.name for e in gpu.nvml_names)):
            owners.setdefault(nvml_key(name), set()).add(gpu.name)
    for key, names in owners.items():
        ranges = sorted(usable_range(shipped.gpu(n)) for n in names)
        assert all(b[0] > a[1] for a, b in zip(ranges, ranges[1:])), (key, names)
    assert USABLE_FRACTION[0] < 15360 / 16384  # ECC-on GDDR6 (T4) is inside the range


def test_every_gpu_has_nvml_names(shipped):
    assert [gpu.name for gpu in shipped.gpus if not gpu.nvml_names] == []


# --- sources: every record names one and says whether it was confirmed ------------------------

@pytest.mark.parametrize("name", FILES)
def test_every_record_has_a_source_and_says_whether_it_was_confirmed(name):
    records = list(_records(name))
    assert records, f"{name} holds no records"
    for where, record in records:
        assert isinstance(record.get("source"), str) and record["source"].strip(), f"{where} has no source"
        assert isinstance(record.get("confirmed"), bool), f"{where} does not say confirmed: true or false"
        if not record["confirmed"]:
            assert str(record.get("note") or "").strip(), f"{where} is unconfirmed and says nothing of why"


@pytest.mark.parametrize("name, project", [("vllm.yaml", "vllm"), ("tensorrt_llm.yaml", "tensorrt-llm"),
                                           ("torch.yaml", "torch"), ("tensorrt.yaml", "tensorrt")])
def test_pypi_rows_cite_the_release_they_were_read_from(name, project):
    for row in _data(name)["releases"]:
        if (row.get("index") or "https://pypi.org/simple") != "https://pypi.org/simple":
            continue  # a hand-kept row from another index cites its own source
        assert row["source"].startswith(f"https://pypi.org/project/{project}/{row['version']}/"), row["source"]


def test_the_driver_branches_are_read_from_nvidias_table():
    assert [row["branch"] for row in _data("cuda.yaml")["driver_branches"] if not row["confirmed"]] == []


def test_the_measured_h200_name_cites_its_proof():
    [h200] = [row for row in _data("gpus.yaml")["gpus"] if row["name"] == "H200"]
    entry = next(e for e in h200["nvml_names"] if e["name"] == "NVIDIA H200")
    assert entry["confirmed"] and "tests/fixtures/gpu_proof/h200-vllm-shapes-2026-12-01.json" in entry["source"]
    assert (REPO / "tests" / "fixtures" / "gpu_proof" / "h200-vllm-shapes-2026-12-01.json").is_file()


# --- order: flat, sorted tables ---------------------------------------------------------------

def _version(row: dict, field: str = "version") -> Version:
    return Version(str(row[field]))


_ORDER = [
    ("vllm.yaml", "releases", _version),
    ("tensorrt_llm.yaml", "releases", _version),
    ("torch.yaml", "releases", _version),
    ("tensorrt.yaml", "releases", _version),
    ("cuda.yaml", "toolkits", _version),
    ("cuda.yaml", "runtimes", lambda row: _version(row, "cudart")),
    ("cuda.yaml", "driver_branches", lambda row: int(row["branch"])),
    ("cuda.yaml", "minor_version_compat", lambda row: int(row["cuda_major"])),
    ("cuda_images.yaml", "images", lambda row: (_version(row, "cuda"), row["os"])),
    ("cuda_images.yaml", "os", lambda row: row["name"]),
    ("gpus.yaml", "architectures", lambda row: row["name"]),
    ("gpus.yaml", "gpus", lambda row: row["name"]),
    ("advisories.yaml", "advisories", lambda row: (row["package"], row["id"])),
    ("backends.yaml", "backends", lambda row: row["backend"]),
    ("backends.yaml", "gpu_support", lambda row: row["backend"]),
    ("models.yaml", "models", lambda row: row["model"]),
    ("payload.yaml", "platforms", lambda row: row["os"]),
]


@pytest.mark.parametrize("name, table, key", _ORDER, ids=[f"{n}:{t}" for n, t, _ in _ORDER])
def test_each_table_is_sorted_without_duplicates(name, table, key):
    keys = [key(row) for row in _data(name)[table]]
    assert keys == sorted(keys), f"{name} {table} is not sorted"
    assert len(set(keys)) == len(keys), f"{name} {table} lists a key twice"


def test_precision_rules_are_grouped_by_backend_and_precision():
    """Sorted by backend, then precision; within one, the version ranges in file order (the first
    match wins, so a ranged rule comes before an open-ended one) and never the same range twice."""
    rows = _data("precisions.yaml")["precisions"]
    groups = [(row["backend"], row["precision"]) for row in rows]
    assert groups == sorted(groups)
    ranges = [(row["backend"], row["precision"], row.get("backend_versions") or "") for row in rows]
    assert len(set(ranges)) == len(ranges)


# --- freshness: when each fact was read ---------------------------------------------------------

_READ = re.compile(r" read (\d{4}-\d{2}-\d{2})$")


def _today() -> dt.date:
    return dt.datetime.now(dt.timezone.utc).date()


@pytest.mark.parametrize("name", ["vllm.yaml", "tensorrt_llm.yaml"])
def test_every_release_says_when_it_was_uploaded(name):
    for row in _data(name)["releases"]:
        uploaded = dt.datetime.strptime(str(row.get("uploaded") or ""), "%Y-%m-%dT%H:%M:%SZ").date() \
            if row.get("uploaded") else None
        assert uploaded is not None, f"{name} {row['version']} has no uploaded time"
        assert uploaded <= _today(), f"{name} {row['version']} was uploaded in the future: {row['uploaded']}"


@pytest.mark.parametrize("name", ["vllm.yaml", "torch.yaml"])
def test_every_measured_row_says_when_it_was_read_and_after_its_upload(name):
    for row in _data(name)["releases"]:
        if not row.get("fatbin_source"):
            continue
        found = _READ.search(row["fatbin_source"])
        assert found, f"{name} {row['version']}: fatbin_source names no read date"
        read = dt.date.fromisoformat(found.group(1))
        assert read <= _today(), f"{name} {row['version']} was read in the future: {read}"
        if row.get("uploaded"):
            assert read >= dt.date.fromisoformat(row["uploaded"][:10]), \
                f"{name} {row['version']} was read on {read}, before its upload {row['uploaded']}"

