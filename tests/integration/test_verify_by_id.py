"""verify by image ID on the real engine (issue 21): two images built without tags, one of
them leaking a secret, and a shared ``repository:tag`` moved between them; each ID is judged
by its own layers whatever the tag names, the cache never lends one's verdict to the other,
and labelling an ID builds from exactly that ID (BuildKit resolves FROM by name only).

Needs `scripts/local-stack.sh up` and `source .stack/env`; without DOCKER_HOST the module is
skipped locally, under CI=true or with DOCKER_HOST a dead engine fails instead.
"""

from __future__ import annotations

import os
import uuid

import pytest

pytestmark = pytest.mark.integration

BASE = "imgfab/stand-in:bookworm-minbase"  # scripts/local-stack.sh STANDIN_IMAGE
SECRET = b"-----IMGFAB VERIFY-BY-ID SECRET 7f3a-----"


@pytest.fixture(scope="module")
def engine():
    if not os.environ.get("DOCKER_HOST"):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("DOCKER_HOST is unset: source .stack/env")
        pytest.skip("DOCKER_HOST is unset: run scripts/local-stack.sh up and source .stack/env")
    from imgfab.docker import engine as module

    try:
        module.inspect_image(BASE)
    except Exception as exc:  # noqa: BLE001 - the stack is up but lacks its stand-in base
        pytest.fail(f"{BASE} is not on the engine: {exc}")
    return module


@pytest.fixture(scope="module")
def images(engine, tmp_path_factory):
    """(clean ID, leaking ID, shared tag); removed afterwards."""
    built = []
    for name, content in (("clean", b"nothing to see\n"), ("leak", b"x" + SECRET + b"\n")):
        context = tmp_path_factory.mktemp(name)
        (context / "payload.txt").write_bytes(content)
        (context / "Dockerfile").write_text(
            f"FROM {BASE}\nCOPY payload.txt /etc/imgfab-payload.txt\nUSER 1000\n"
            "ENV NVIDIA_REQUIRE_CUDA=cuda>=12\nHEALTHCHECK CMD true\n")
        built.append(engine.build(context, tags=[]).image_id)
    shared = f"imgfab-test/verify-by-id-{uuid.uuid4().hex[:8]}:t"
    yield built[0], built[1], shared
    for ref in (shared, *built):
        try:
            engine.remove_image(ref, force=True)
        except Exception:  # noqa: BLE001 - best effort clean-up
            pass


def _secrets_pass(engine, ref: str) -> bool:
    from imgfab.docker.verify import VerifyPolicy, verify_image

    policy = VerifyPolicy(mount_path="/models/m", required_labels={}, secrets={"s": SECRET})
    report = verify_image(ref, policy, engine=engine, raise_on_failure=False)
    return next(f for f in report.findings if f.check == "secrets").passed


@pytest.mark.parametrize("read", ["storage", "save"])
def test_each_id_is_judged_by_its_own_layers_whatever_the_tag_names(engine, images, tmp_path,
                                                                   monkeypatch, read):
    """``storage``: the overlay2 directories where this process can read them; ``save``: the
    docker save stream, each layer hashed against the engine's diff ids."""
    from imgfab.docker import verify

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if read == "save":
        monkeypatch.setattr(verify, "local_layer_dirs", lambda info, layers: None)
    clean, leak, shared = images
    engine.tag(leak, shared)  # the other build holds the name meanwhile
    assert _secrets_pass(engine, clean) is True
    engine.tag(clean, shared)
    assert _secrets_pass(engine, leak) is False, "not the clean verdict from the cache"
    assert _secrets_pass(engine, leak) is False, "nor on a second, cached run"


def test_labelling_an_id_descends_from_exactly_it(engine, images):
    clean, _, shared = images
    layers = engine.inspect_image(clean)["RootFS"]["Layers"]
    labelled = engine.add_labels(clean, {"org.imgfab.test": "1"}, [shared])
    info = engine.inspect_image(shared)
    assert info["Id"] == labelled and info["Config"]["Labels"]["org.imgfab.test"] == "1"
    assert info["RootFS"]["Layers"] == layers
    import docker

    names = [t for image in docker.from_env().images.list() for t in image.tags]
    assert not any(t.startswith("imgfab-labelling/") for t in names)
