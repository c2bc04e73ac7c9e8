"""verify judges the image the build wrote, by its ID, and caches only what it hashed (issue 21).

Before: build verified by tag, inspect and save each looked the tag up, and scan results were
cached under inspect's diff ids without checking the saved layers hash to them. Two builds of
one ``repository:tag`` could make verify judge one image's layers under another's diff ids,
and a leaking image then passed from the cache.

Now: the build tags nothing until the ID from ``--iidfile`` passes verify and the payload
check; verify saves by the ID inspect answered; every saved layer is hashed as read and must
equal the config's and inspect's diff id; results are cached under those hashes only.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from types import SimpleNamespace

import pytest

from imgfab.docker import build as build_module
from imgfab.docker import engine, verify
from imgfab.docker.build import BuildOptions, build_recipe
from imgfab.docker.verify import VerifyPolicy, verify_image
from imgfab.errors import EngineError, ValidationFailed
from imgfab.payload import measure

from conftest import RECIPES
from test_verify_layouts import CLEAN, DIRTY, SECRET, FakeEngine, layer_tar, save_archive

RECIPE = next(p for p in RECIPES if p.name == "qwen2-7b-h100.yaml")
BUILT = "sha256:" + "b" * 64
POLICY = VerifyPolicy(mount_path="/models/m", required_labels={}, secrets={"ca-cert": SECRET})


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("IMGFAB_REGISTRY", raising=False)
    return tmp_path / "cache" / "imgfab" / "verify"


@pytest.fixture
def pipeline(monkeypatch):
    """The engine and the checks at their edges, recording what each is handed; the build
    stops when the verified image is labelled and tagged."""
    state = {"calls": [], "reject": False, "holders": lambda ref: ref}

    def fake_build(context, *, tags, **kwargs):
        state["calls"].append(("build", list(tags)))
        return engine.BuildResult(BUILT, 1.0)

    def fake_verify(ref, policy):
        state["calls"].append(("verify", ref))
        if state["reject"]:
            raise ValidationFailed("image failed 1 check(s): secrets", field="verify", fix="x")
        return SimpleNamespace(notes=[])

    def fake_check(ref, *args, **kwargs):
        state["calls"].append(("check", ref))
        return SimpleNamespace(labels={}, notes=[])

    def fake_label(image, labels, tags, **_):
        state["calls"].append(("label", image, list(tags)))
        raise EngineError("stopped by the test")

    monkeypatch.setattr(engine, "build", fake_build)
    monkeypatch.setattr(build_module, "_base_diff_ids", lambda ref: ())
    monkeypatch.setattr(verify, "verify_image", fake_verify)
    monkeypatch.setattr(measure, "check_image", fake_check)
    monkeypatch.setattr(engine, "add_labels", fake_label)
    monkeypatch.setattr(engine, "inspect_image",
                        lambda ref: {"Id": state["holders"](ref)})
    monkeypatch.setattr(engine, "remove_image",
                        lambda ref, force=False: state["calls"].append(("remove", ref)))
    return state


def test_the_build_verifies_and_tags_the_id_it_wrote(tmp_path, pipeline):
    with pytest.raises(EngineError, match="stopped by the test"):
        build_recipe(str(RECIPE), BuildOptions(), context_dir=tmp_path / "ctx")
    calls = pipeline["calls"]
    assert calls[0] == ("build", []), "nothing is tagged before verify"
    assert calls[1:3] == [("verify", BUILT), ("check", BUILT)]
    assert calls[3][:2] == ("label", BUILT) and calls[3][2], "the tags go on the verified ID"


def test_a_rejected_image_loses_its_names_but_not_another_builds(tmp_path, pipeline):
    pipeline["reject"] = True
    # The local tag names this image (an earlier identical build); the remote one another's.
    pipeline["holders"] = lambda ref: "sha256:" + "c" * 64 if ref.startswith("reg.example/") \
        else BUILT
    with pytest.raises(ValidationFailed):
        build_recipe(str(RECIPE), BuildOptions(registry="reg.example"),
                     context_dir=tmp_path / "ctx")
    removed = [c[1] for c in pipeline["calls"] if c[0] == "remove"]
    assert len(removed) == 2 and not removed[0].startswith("reg.example/") and \
        removed[1] == BUILT, removed
    assert not any(c[0] == "label" for c in pipeline["calls"])


def test_verify_saves_the_id_inspect_answered_not_the_tag():
    archive = save_archive([layer_tar(CLEAN)], "oci")
    fake = FakeEngine(archive, 1)
    report = verify_image("t:1", POLICY, engine=fake, raise_on_failure=False)
    assert report.passed, report.to_dict()
    assert ("inspect", "t:1") in fake.refs
    assert ("save", "sha256:" + "1" * 64) in fake.refs and ("save", "t:1") not in fake.refs


def test_layers_that_hash_to_other_diff_ids_fail_and_poison_no_cache(cache):
    leaking = save_archive([layer_tar(CLEAN), layer_tar(DIRTY)], "oci")
    clean = save_archive([layer_tar(CLEAN), layer_tar(CLEAN)], "oci")
    claims = [_sha(layer_tar(CLEAN)), _sha(layer_tar(DIRTY))]
    # inspect describes the leaking image, save hands over a clean one (a moved tag)
    first = verify_image("t:1", POLICY, engine=FakeEngine(clean, 2, layers=claims),
                         raise_on_failure=False)
    layers = next(f for f in first.findings if f.check == "layers")
    assert not layers.passed and "hashes to" in layers.detail
    # the leaking image itself, verified next: judged by its own bytes, not a cached verdict
    second = verify_image("t:1", POLICY, engine=FakeEngine(leaking, 2, layers=claims),
                          raise_on_failure=False)
    assert {f.check: f.passed for f in second.findings}["secrets"] is False


def test_the_cache_is_keyed_by_the_hashes_of_the_bytes_scanned(cache):
    clean = save_archive([layer_tar(CLEAN)], "oci")
    made_up = "sha256:" + "9" * 64
    verify_image("t:1", POLICY, engine=FakeEngine(clean, 1, layers=[made_up]),
                 raise_on_failure=False)
    stored = {p.name for p in cache.glob("*.json")}
    assert stored == {verify._layer_key(_sha(layer_tar(CLEAN)), POLICY) + ".json"}


def test_a_config_that_lists_other_diff_ids_fails():
    wrong = [_sha(layer_tar(CLEAN)), _sha(layer_tar(CLEAN))]
    archive = save_archive([layer_tar(CLEAN), layer_tar(DIRTY)], "legacy", declared=wrong)
    scan = verify._scan_layers(iter([archive]), POLICY)
    assert len(scan.unscanned) == 1 and "the image config lists" in scan.unscanned[0]


def test_a_missing_image_config_fails_closed():
    archive = save_archive([layer_tar(CLEAN)], "legacy")
    source, target = tarfile.open(fileobj=io.BytesIO(archive)), io.BytesIO()
    with tarfile.open(fileobj=target, mode="w") as out:
        for member in source:
            if member.name != "cfg.json":
                out.addfile(member, source.extractfile(member))
    scan = verify._scan_layers(iter([target.getvalue()]), POLICY)
    assert scan.unscanned == ["cfg.json (the image config: not in the archive, or it lists no "
                              "rootfs.diff_ids)"]


@pytest.mark.parametrize("layer", [
    layer_tar(CLEAN) + b"hidden " + SECRET,  # bytes after the tar's end blocks
    b"\0" * 1024 + layer_tar(DIRTY),  # an "empty" tar hiding a whole one
])
def test_bytes_no_tar_reader_sees_fail_the_layer(layer):
    archive = save_archive([layer], "oci")
    report = verify_image("t:1", POLICY, engine=FakeEngine(archive, 1), raise_on_failure=False)
    layers = next(f for f in report.findings if f.check == "layers")
    assert not layers.passed and "end-of-archive" in layers.detail


def test_labelling_an_id_builds_from_a_private_name_of_exactly_it(tmp_path, monkeypatch):
    """BuildKit resolves FROM by name only: the ID gets a random name for the labelling build,
    removed afterwards, so the labelled image descends from the verified ID itself."""
    seen = tmp_path / "dockerfile"
    fake = tmp_path / "docker"
    fake.write_text(f"#!/bin/sh\n[ \"$2\" = --help ] && {{ echo ' --secret'; exit 0; }}\n"
                    f"cat > {seen}\necho sha256:{'d' * 64}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("IMGFAB_DOCKER_CLI", str(fake))
    calls = []
    monkeypatch.setattr(engine, "tag", lambda ref, target: calls.append(("tag", ref, target)))
    monkeypatch.setattr(engine, "remove_image",
                        lambda ref, force=False: calls.append(("remove", ref)))
    # --quiet prints the config digest; on the containerd store the image ID is the manifest's,
    # which is what the tag then names (inspect's answer).
    monkeypatch.setattr(engine, "inspect_image",
                        lambda ref: {"Id": "sha256:" + "e" * 64} if ref == "r:t" else {})
    assert engine.add_labels(BUILT, {"a": "b"}, ["r:t"]) == "sha256:" + "e" * 64
    (_, ref, name), removed = calls
    assert ref == BUILT and seen.read_text().startswith(f"FROM {name}\n")
    assert removed == ("remove", name) and name != BUILT and ":" in name


@pytest.mark.parametrize("cut", [0, 700, 1600])
def test_a_cut_short_save_stream_fails_closed_without_an_exception(cut):
    archive = save_archive([layer_tar(CLEAN), layer_tar(DIRTY)], "oci", compress="gzip")
    claims = FakeEngine(archive, 2).inspect_image("t:1")["RootFS"]["Layers"]
    report = verify_image("t:1", POLICY, engine=FakeEngine(archive[:cut], 2, layers=claims),
                          raise_on_failure=False)
    layers = next(f for f in report.findings if f.check == "layers")
    assert not layers.passed and "docker save stream (unreadable" in layers.detail


def test_a_corrupt_zstd_layer_fails_closed_without_an_exception():
    archive = save_archive([layer_tar(DIRTY)], "oci", compress="zstd")
    at = archive.index(b"\x28\xb5\x2f\xfd") + 40
    damaged = archive[:at] + bytes([archive[at] ^ 0xff]) + archive[at + 1:]
    claims = FakeEngine(archive, 1).inspect_image("t:1")["RootFS"]["Layers"]
    report = verify_image("t:1", POLICY, engine=FakeEngine(damaged, 1, layers=claims),
                          raise_on_failure=False)
    assert {f.check: f.passed for f in report.findings}["layers"] is False
