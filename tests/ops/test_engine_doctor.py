"""Issue 19: the engine imgfab builds on (Docker >= 23.0), its image store, buildx, and what a
host needs to pull zstd layers: doctor's findings, the build's refusals, select's note."""

from __future__ import annotations

import copy

import pytest
import yaml

from imgfab.docker.engine import EngineFacts, build_output_args, check_engine, engine_facts
from imgfab.errors import EngineError
from imgfab.ops.doctor import HostView, diagnose, engine_findings, pull_findings
from imgfab.ops.select import Candidate, Published
from imgfab.recipe import parse_recipe, recipe_hash
from imgfab.render.context import image_labels
from imgfab.stack.resolve import resolve

from conftest import REPO

CONTAINERD = {"ServerVersion": "26.1.5+dfsg1", "Driver": "overlayfs",
              "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]}
CLASSIC = {"ServerVersion": "24.0.7", "Driver": "overlay2",
           "DriverStatus": [["Backing Filesystem", "extfs"], ["Supports d_type", "true"]]}
OLD = {"ServerVersion": "20.10.24+dfsg1", "Driver": "overlay2", "DriverStatus": []}
BUILDX = "github.com/docker/buildx 0.13.1+ds1 0.13.1+ds1-3"


def _labels(matrix, compression: str) -> dict[str, str]:
    data = yaml.safe_load((REPO / "recipes" / "qwen2-7b-h100.yaml").read_text())
    data["image"]["compression"] = compression
    recipe = parse_recipe(copy.deepcopy(data))
    return image_labels(recipe, resolve(recipe, matrix).stack, recipe_hash(recipe), "config.json")


def test_engine_facts_read_the_store_and_the_release():
    facts = engine_facts(CONTAINERD)
    assert facts == EngineFacts("26.1.5+dfsg1", True, "overlayfs") and facts.release == (26, 1, 5)
    assert not facts.too_old()
    assert not engine_facts(CLASSIC).containerd_store
    assert engine_facts(OLD).too_old() and engine_facts(OLD).release == (20, 10, 24)


def test_doctor_on_the_containerd_store_with_buildx_is_all_ok():
    checks = {f.check: f for f in engine_findings(CONTAINERD, BUILDX)}
    assert [checks[c].severity for c in ("engine", "image-store", "buildx")] == ["ok"] * 3
    assert "OCI layout" in checks["image-store"].seen


def test_doctor_says_what_each_missing_feature_costs():
    old = {f.check: f for f in engine_findings(OLD, None)}
    assert old["engine"].severity == "error" and "23.0" in old["engine"].fix
    assert "zstd" in old["engine"].seen
    assert old["buildx"].severity == "warn" and "imgfab build fails" in old["buildx"].seen
    classic = {f.check: f for f in engine_findings(CLASSIC, BUILDX)}
    assert classic["engine"].severity == "ok"
    assert classic["image-store"].severity == "info" and "gzip only" in classic["image-store"].seen
    assert "containerd-snapshotter" in classic["image-store"].fix


def test_doctor_checks_an_images_pull_requirement_on_this_engine(matrix):
    zstd, gzip = _labels(matrix, "zstd"), _labels(matrix, "gzip")
    assert zstd["org.imgfab.pull.requires"] == "docker>=23.0|containerd>=1.5"
    assert gzip["org.imgfab.pull.requires"] == "" and gzip["org.imgfab.layers.compression"] == "gzip"
    refused = pull_findings(zstd, OLD)
    assert [f.severity for f in refused] == ["error"] and "--compression gzip" in refused[0].fix
    assert [f.severity for f in pull_findings(zstd, CONTAINERD)] == ["ok"]
    assert pull_findings(gzip, OLD) == []
    view = HostView(files={"/proc/modules": ""}, docker_info=OLD)
    assert any(f.check == "image-pull" and f.severity == "error"
               for f in diagnose(view, image_labels=zstd))


def test_select_says_what_pulling_needs(matrix):
    zstd = Candidate(Published("r/x", "t-zstd", "sha256:" + "1" * 64, _labels(matrix, "zstd")))
    gzip = Candidate(Published("r/x", "t-gzip", "sha256:" + "2" * 64, _labels(matrix, "gzip")))
    assert zstd.pull_note() == "t-zstd: zstd layers: the pulling host needs docker>=23.0 or containerd>=1.5"
    assert gzip.pull_note() == "" and gzip.pull_requires == ""


def test_builds_refuse_an_old_engine_and_zstd_on_the_classic_store():
    with pytest.raises(EngineError) as old:
        check_engine("gzip", engine_facts(OLD))
    assert "older than 23.0" in old.value.message and "23.0" in old.value.fix
    with pytest.raises(EngineError) as classic:
        check_engine("zstd", engine_facts(CLASSIC))
    assert classic.value.field == "--compression" and "gzip" in classic.value.fix
    assert check_engine("gzip", engine_facts(CLASSIC)).version == "24.0.7"
    assert check_engine("zstd", engine_facts(CONTAINERD)).containerd_store


def test_build_output_args_make_cold_builds_the_same_bytes():
    args = build_output_args("zstd", 1700000000)
    assert "--provenance=false" in args and "--sbom=false" in args
    assert args[args.index("--build-arg") + 1] == "SOURCE_DATE_EPOCH=1700000000"
    output = args[args.index("--output") + 1].split(",")
    assert {"type=image", "compression=zstd", "force-compression=true", "oci-mediatypes=true"} == set(output)
    with pytest.raises(EngineError):
        build_output_args("lz4", 0)


def _recipe_labels(matrix, name: str) -> dict[str, str]:
    recipe = parse_recipe(yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text()))
    return image_labels(recipe, resolve(recipe, matrix).stack, recipe_hash(recipe), "config.json")


def test_select_says_when_the_runtime_carries_a_c_compiler(matrix):
    """Issue 33: qwen2-7b-h100 (vLLM 0.33.0: no measured Triton launchers) keeps the declared
    C compiler and select says so; qwen2-7b-h200 (vLLM 0.26.0, its launchers compiled by the
    builder) carries none, and select says nothing."""
    h100 = Candidate(Published("r/x", "t-h100", "sha256:" + "1" * 64, _recipe_labels(matrix, "qwen2-7b-h100")))
    h200 = Candidate(Published("r/x", "t-h200", "sha256:" + "2" * 64, _recipe_labels(matrix, "qwen2-7b-h200")))
    assert h100.toolchain == "gcc,libc6-dev,python3-dev"
    assert h100.toolchain_note() == (
        "t-h100: the runtime carries a C compiler (gcc, libc6-dev, python3-dev) as its declared "
        "fallback: Triton compiles its launchers at each first start (compat/triton_launchers.yaml "
        "has no confirmed row for this stack)")
    assert h200.toolchain == "" and h200.toolchain_note() == ""
    older = Candidate(Published("r/x", "t-old", "sha256:" + "3" * 64, {}))  # built before the label
    assert older.toolchain == "" and older.toolchain_note() == ""
