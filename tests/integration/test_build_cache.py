"""A registry build cache and a builder by name, on the local engine (issue 37).

The vLLM recipe is locked against the fake index (tests/fixtures/fake_payload.py), which the
local stack's nginx serves on loopback (``build --network host``) and on the engine's bridge
gateway (bake's default network). Then, with the real buildx, the local registry (htpasswd auth) and the containerd store:

- a build from an empty builder cache (``docker builder prune -af``) exports its cache to the
  registry (``type=registry,mode=max``, ``{recipe}`` in the ref): the cache's manifest is in
  the registry, and imgfab's secrets scan read every layer of it and found no build secret;
- after its image is removed and the builder cache pruned again, a build reading that cache
  runs none of the builder's steps (the payload install comes from the cache) and writes the
  very same image;
- ``--builder`` reaches buildx for real: the current context's builder by name (``docker``
  driver) builds the recipe; another context's engine and a builder buildx does not know are
  one line at exit 1 each (buildx itself refuses another context's docker-driver builder);
- ``imgfab bake --build --builder`` runs ``docker buildx bake`` on that builder, the target
  reading the same cache.

    source .stack/env && python -m pytest -m integration tests/integration/test_build_cache.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from fake_payload import INDEX_BUILD_ENV, INDEX_TIMEOUT_S  # noqa: E402

VLLM = REPO / "recipes" / "qwen2-7b-h100.yaml"
DOCKER = os.environ.get("IMGFAB_DOCKER_CLI", "/usr/bin/docker")
MIRROR = os.environ.get("IMGFAB_MIRROR", "127.0.0.1:5000/mirror")
REGISTRY = os.environ.get("IMGFAB_REGISTRY", "127.0.0.1:5000")

if not os.environ.get("DOCKER_HOST"):
    if os.environ.get("CI") == "true":
        pytest.fail("DOCKER_HOST is unset under CI=true: the integration stack is missing",
                    pytrace=False)
    pytest.skip("DOCKER_HOST unset: source .stack/env to run the integration tests",
                allow_module_level=True)


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=check, timeout=600)


def _imgfab(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=env or dict(os.environ, **INDEX_BUILD_ENV),
                          timeout=900)


def _recipe_copy(directory: Path, repository: str) -> Path:
    text = VLLM.read_text()
    own = next(line.split(":", 1)[1].strip() for line in text.splitlines()
               if line.strip().startswith("repository:"))
    copy = directory / VLLM.name
    copy.write_text(text.replace(f"repository: {own}", f"repository: {repository}"))
    return copy


def _build(recipe: Path, url: str, lock: Path, out: Path, *extra: str) -> dict:
    result = _imgfab("build", str(recipe), "--json", "--pip-index-url", url, "--lock", str(lock),
                     "--network", "host", "--mirror", MIRROR, "--output", str(out), *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)["images"][0]


def _forget(image: dict) -> None:
    """The image and every build cache of this engine gone: an empty local cache."""
    for ref in image["tags"]:
        _docker("image", "rm", "-f", ref, check=False)
    _docker("builder", "prune", "-af")


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    from fake_payload import installer_wheel, recipe_pins, serve_index

    root = tmp_path_factory.mktemp("buildcache")
    gateway = _docker("network", "inspect", "bridge", "--format",
                      "{{(index .IPAM.Config 0).Gateway}}").stdout.strip()
    context = f"imgfab-test-ctx-{uuid.uuid4().hex[:6]}"
    # A docker context on this engine: buildx lists it as a builder of the docker driver.
    _docker("context", "create", context, "--docker", f"host={os.environ['DOCKER_HOST']}")
    cache = f"{REGISTRY}/imgfab-test/buildcache-{uuid.uuid4().hex[:8]}:{{recipe}}"
    refs: list[str] = []
    try:
        # nginx serves the same folder on loopback (the builds: --network host) and on the
        # bridge gateway (bake's steps, on the default network)
        with serve_index(recipe_pins(VLLM), (installer_wheel(),)) as url:
            lock = root / "qwen2-7b-h100.lock"
            locked = _imgfab("lock", str(VLLM), "--index-url", url, "--output", str(lock))
            assert locked.returncode == 0, locked.stderr
            recipe = _recipe_copy(root, "imgfab-test/buildcache")
            _docker("builder", "prune", "-af")
            first = _build(recipe, url, lock, root / "ctx-1", "--cache-to",
                           f"type=registry,ref={cache},mode=max")
            refs += first["tags"]
            _forget(first)
            second = _build(recipe, url, lock, root / "ctx-2", "--cache-from",
                            f"type=registry,ref={cache}")
            refs += second["tags"]
            on_builder = _build(recipe, url, lock, root / "ctx-3", "--builder", "default",
                                "--cache-from", f"type=registry,ref={cache}")
            refs += on_builder["tags"]
            yield {"first": first, "second": second, "on_builder": on_builder, "cache": cache,
                   "context": context, "url": url, "gateway": gateway, "lock": lock,
                   "recipe": recipe, "root": root}
    finally:
        for ref in refs:
            _docker("image", "rm", "-f", ref, check=False)
        _docker("context", "rm", "-f", context, check=False)


def test_the_cache_is_in_the_registry_and_holds_no_build_secret(cached):
    from imgfab.docker.credentials import Credentials
    from imgfab.docker.registry import _manifest
    from imgfab.docker.registry_http import ImageRef, _client_for

    ref = ImageRef.parse(cached["cache"].replace("{recipe}", "qwen2-7b-h100"))
    _, index = _manifest(_client_for(ref, Credentials.load(ref.host)), ref, ref.reference)
    assert index["manifests"], index  # BuildKit's cache index: its layers and its cache config
    (scan,) = cached["first"]["cache_scans"]
    assert scan["spec"] == f"type=registry,ref={ref.name}:qwen2-7b-h100,mode=max"
    # mode=max: the builder's layers too, more than the runtime image's own
    assert scan["layers"] >= 5 and scan["bytes"] > 0 and scan["secrets"] == [], scan
    assert cached["first"]["cache_to"] == [scan["spec"]]


def test_a_build_from_an_empty_local_cache_reads_the_registry_cache(cached):
    first, second = cached["first"], cached["second"]
    assert first["cached_by_stage"]["builder"][0] == 0, first["cached_by_stage"]  # cold: ran all
    done, total = second["cached_by_stage"]["builder"]
    assert total >= 3, second["cached_by_stage"]
    # Nothing ran but each stage's FROM of an image (BuildKit resolves a base image again: DONE,
    # not CACHED): the payload install, the kernels' compile, every COPY came from the cache.
    assert second["ran"] and all(" 1/" in step.split(" FROM ", 1)[0] and " FROM " in step
                                 for step in second["ran"]), second["ran"]
    assert second["image_id"] == first["image_id"]  # and the very same image


def test_a_named_builder_builds_through_buildx(cached):
    built = cached["on_builder"]
    assert built["builder"] == "default"
    assert built["image_id"] == cached["first"]["image_id"]
    other = _imgfab("build", str(cached["recipe"]), "--lock", str(cached["lock"]),
                    "--pip-index-url", cached["url"], "--mirror", MIRROR, "--network", "host",
                    "--builder", cached["context"], "--output", str(cached["root"] / "ctx-y"))
    assert other.returncode == 1, other.stderr
    assert other.stderr.splitlines()[-1].startswith(
        f"imgfab: --builder: builder '{cached['context']}' is the engine of docker context"), other.stderr
    missing = _imgfab("build", str(cached["recipe"]), "--lock", str(cached["lock"]),
                      "--pip-index-url", cached["url"], "--mirror", MIRROR, "--network", "host",
                      "--builder", "imgfab-no-such-builder", "--output", str(cached["root"] / "ctx-x"))
    assert missing.returncode == 1, missing.stderr
    assert missing.stderr.splitlines()[-1].startswith(
        "imgfab: --builder: buildx has no builder 'imgfab-no-such-builder'"), missing.stderr


def test_bake_builds_on_a_named_builder_from_the_registry_cache(cached, tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir()
    (locks / "qwen2-7b-h100.lock").write_bytes(cached["lock"].read_bytes())
    bridge_url = cached["url"].replace("127.0.0.1", cached["gateway"], 1)
    pip_conf = (f"[global]\nindex-url = {bridge_url}\ntrusted-host = {cached['gateway']}\n"
                f"timeout = {INDEX_TIMEOUT_S}\nretries = 0\n")
    result = _imgfab("bake", str(cached["recipe"]), "-o", "out/docker-bake.json", "--mirror", MIRROR,
                     "--lock-dir", str(locks), "--cache-from", f"type=registry,ref={cached['cache']}",
                     "--build", "--builder", "default", "--json", cwd=tmp_path,
                     env=dict(os.environ, IMGFAB_PIP_CONF=pip_conf))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["built"] is True and report["builder"] == "default"
    target = json.loads((tmp_path / "out/docker-bake.json").read_text())["target"]["qwen2-7b-h100"]
    assert target["cache-from"] == [f"type=registry,ref={cached['cache'].replace('{recipe}', 'qwen2-7b-h100')}"]
    (tag,) = target["tags"]
    try:
        labels = json.loads(_docker("image", "inspect", tag).stdout)[0]["Config"]["Labels"]
        assert labels["org.imgfab.recipe.name"] == "qwen2-7b-h100"
    finally:
        _docker("image", "rm", "-f", tag, check=False)
    unknown = _imgfab("bake", str(cached["recipe"]), "-o", "out2/docker-bake.json", "--lock-dir",
                      str(locks), "--build", "--builder", "imgfab-no-such-builder", cwd=tmp_path)
    assert unknown.returncode == 1
    assert unknown.stderr.splitlines()[-1].startswith(
        "imgfab: --builder: buildx has no builder 'imgfab-no-such-builder'"), unknown.stderr
