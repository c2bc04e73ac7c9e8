"""No tag outlives a build that did not pass verify (issue 21): UnverifiedTags takes back the
tags the build moved, and only those, when its block ends without ``verified()``."""

from __future__ import annotations

import pytest

from imgfab.docker import engine
from imgfab.docker.unverified import UnverifiedTags
from imgfab.errors import EngineError

OLD, NEW = "sha256:" + "a" * 64, "sha256:" + "b" * 64


@pytest.fixture
def daemon(monkeypatch):
    """A fake engine: tag → image id; removals recorded."""
    tags: dict[str, str] = {}
    removed: list[str] = []

    def inspect_image(ref):
        if ref not in tags:
            raise EngineError(f"inspect {ref}: image not found")
        return {"Id": tags[ref]}

    def remove_image(ref, force=False):
        removed.append(ref)
        tags.pop(ref, None)

    monkeypatch.setattr(engine, "inspect_image", inspect_image)
    monkeypatch.setattr(engine, "remove_image", remove_image)
    return tags, removed


def test_a_failure_after_the_build_takes_back_the_moved_tags(daemon):
    tags, removed = daemon
    tags["r:old"] = OLD
    with pytest.raises(EngineError, match="docker save failed"):
        with UnverifiedTags(["r:new", "r:old", "r:kept"]):
            tags.update({"r:new": NEW, "r:old": NEW})  # what docker build --tag does
            raise EngineError("docker save failed")
    assert sorted(removed) == ["r:new", "r:old"]


def test_an_untouched_tag_keeps_its_earlier_image(daemon):
    tags, removed = daemon
    tags["r:t"] = OLD
    with pytest.raises(KeyboardInterrupt):
        with UnverifiedTags(["r:t"]):
            raise KeyboardInterrupt
    assert removed == [] and tags == {"r:t": OLD}


def test_verified_tags_stay(daemon):
    tags, removed = daemon
    with UnverifiedTags(["r:t"]) as hold:
        tags["r:t"] = NEW
        hold.verified()
    assert removed == [] and tags == {"r:t": NEW}


def test_an_unreachable_engine_does_not_hide_the_first_error(daemon, monkeypatch):
    tags, _ = daemon

    def unreachable(ref, force=False):
        raise EngineError("engine gone")

    monkeypatch.setattr(engine, "remove_image", unreachable)
    with pytest.raises(KeyboardInterrupt):
        with UnverifiedTags(["r:t"]):
            tags["r:t"] = NEW
            raise KeyboardInterrupt


def test_build_recipe_takes_back_its_tags_when_naming_cannot_finish(daemon, monkeypatch, tmp_path):
    """The build names nothing (verify judges the ID it wrote); an engine failure half-way
    through naming the verified image (one tag given, then the engine goes away) leaves no
    tag behind: before issue 21 only a ValidationFailed removed them."""
    from types import SimpleNamespace

    from conftest import RECIPES
    from imgfab.docker import build as build_module
    from imgfab.docker import verify
    from imgfab.payload import measure

    tags, removed = daemon
    recipe = next(p for p in RECIPES if p.name == "qwen2-7b-h100.yaml")
    built_with: list[list[str]] = []

    def fake_build(context, *, tags: list[str], **kwargs):
        built_with.append(list(tags))
        daemon[0].update({ref: NEW for ref in tags})
        return engine.BuildResult(image_id=NEW, duration_s=1.0)

    def add_labels_fails(image_id, labels, refs, **_):
        daemon[0][refs[0]] = NEW
        raise EngineError(f"docker tag {refs[1]} failed: connection reset")

    monkeypatch.setattr(engine, "build", fake_build)
    monkeypatch.setattr(engine, "add_labels", add_labels_fails)
    monkeypatch.setattr(build_module, "_base_diff_ids", lambda ref: ())
    monkeypatch.setattr(verify, "verify_image", lambda ref, policy: SimpleNamespace(notes=[]))
    monkeypatch.setattr(measure, "check_image",
                        lambda *a, **k: SimpleNamespace(labels={}, notes=[]))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("IMGFAB_REGISTRY", raising=False)
    with pytest.raises(EngineError, match="connection reset"):
        build_module.build_recipe(str(recipe), build_module.BuildOptions(registry="reg.example"),
                                  context_dir=tmp_path / "ctx")
    assert built_with == [[]]
    assert len(removed) == 1 and tags == {}
