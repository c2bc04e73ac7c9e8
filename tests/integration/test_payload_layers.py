"""The payload's layers, built for real with the light payload: reproducible and shared.

The vLLM recipe is locked against a fake index served by the local stack's nginx (tests/fixtures/fake_payload.py:
fake wheels for its pins, the real uv wheel). Then:

- two builds of that lock, both with ``--no-cache`` (every step runs again: a new venv, new
  files, new mtimes before imgfab-stage normalises them) give the same payload layer digests.
  (Without --no-cache, BuildKit may reuse an older COPY result whose content checksum matches:
  its cache key ignores mtimes and entry order, so it would not test the normalisation.) uv's download cache is a BuildKit cache mount and is kept; it holds the wheels the
  lock's hashes pin, so it cannot change what is installed;
- a second recipe locking the same packages (llama31-8b-l4: another GPU, model and serving
  settings) gets the very same payload layers, so a registry stores them once;
- the runtime has one payload layer per ``# layer`` group of the lock, in that order;
- issue 19: a third build of the first recipe, from a cold cache (``docker builder prune -af``
  and ``--no-cache``), is the very same image: the same image ID, which on the containerd image
  store is the manifest's digest, so every compressed layer and the config are byte-identical
  and a CI rebuild after no change pushes nothing. Its layers are zstd with OCI media types, as
  the real ``docker save`` (OCI layout) of the engine shows, and verify's fail-closed scan reads
  every one of them from that save.

    source .stack/env && python -m pytest -m integration tests/integration/test_payload_layers.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from fake_payload import INDEX_BUILD_ENV  # noqa: E402
VLLM = REPO / "recipes" / "qwen2-7b-h100.yaml"
SAME_STACK = REPO / "recipes" / "llama31-8b-l4.yaml"
DOCKER = os.environ.get("IMGFAB_DOCKER_CLI", "/usr/bin/docker")
MIRROR = os.environ.get("IMGFAB_MIRROR", "127.0.0.1:5000/mirror")

if not os.environ.get("DOCKER_HOST"):
    if os.environ.get("CI") == "true":
        pytest.fail("DOCKER_HOST is unset under CI=true: the integration stack is missing",
                    pytrace=False)
    pytest.skip("DOCKER_HOST unset: source .stack/env to run the integration tests",
                allow_module_level=True)


def _recipe_copy(recipe: Path, directory: Path, repository: str) -> Path:
    """The recipe under a test repository (never an example recipe's own tag)."""
    text = recipe.read_text()
    own = next(line.split(":", 1)[1].strip() for line in text.splitlines()
               if line.strip().startswith("repository:"))
    copy = directory / recipe.name
    copy.write_text(text.replace(f"repository: {own}", f"repository: {repository}"))
    return copy


def _build(recipe: Path, url: str, lock: Path, out: Path, *extra: str) -> dict:
    env = dict(os.environ, **INDEX_BUILD_ENV)
    result = subprocess.run(
        [sys.executable, "-m", "imgfab.cli", "build", str(recipe), "--json", "--pip-index-url", url,
         "--lock", str(lock), "--network", "host", "--mirror", MIRROR, "--output", str(out), *extra],
        capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)["images"][0]


def payload_layers(built: dict, groups: list[str]) -> dict[str, str]:
    """``{group: diff id}``: the runtime's payload COPYs follow its base and its OS layer."""
    from imgfab.docker import registry

    ref = built["tags"][0]
    layers = json.loads(subprocess.run([DOCKER, "image", "inspect", ref], capture_output=True,
                                       text=True, check=True).stdout)[0]["RootFS"]["Layers"]
    base = built["base_images"]["RUNTIME_IMAGE"]
    config = registry.image_config(base, registry.Credentials.load(registry.ImageRef.parse(base).host))
    base_layers = config["rootfs"]["diff_ids"]
    assert layers[:len(base_layers)] == base_layers
    first = len(base_layers) + 1
    return dict(zip(groups, layers[first:first + len(groups)]))


def _rootfs(ref: str) -> list[str]:
    return json.loads(subprocess.run([DOCKER, "image", "inspect", ref], capture_output=True,
                                     text=True, check=True).stdout)[0]["RootFS"]["Layers"]


def _history(ref: str) -> str:
    return subprocess.run([DOCKER, "history", "--no-trunc", "--format", "{{.CreatedBy}}", ref],
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    from fake_payload import locked_index
    from imgfab.payload.lock import Lock

    root = tmp_path_factory.mktemp("layers")
    refs = []
    with locked_index(VLLM, root) as (url, lock):
        first = _build(_recipe_copy(VLLM, root, "imgfab-test/layers-a"), url, lock, root / "ctx-a",
                       "--no-cache")
        refs += first["tags"]
        first_layers = _rootfs(first["tags"][0])
        again_dir = root / "again"
        again_dir.mkdir()
        second = _build(_recipe_copy(VLLM, again_dir, "imgfab-test/layers-b"), url, lock,
                        root / "ctx-b", "--no-cache")
        refs += second["tags"]
        other = _build(_recipe_copy(SAME_STACK, root, "imgfab-test/layers-c"), url, lock, root / "ctx-c")
        refs += other["tags"]
        # Cold: no build cache at all (the uv and apt cache mounts go too), every step again.
        subprocess.run([DOCKER, "builder", "prune", "-af"], capture_output=True, check=True)
        cold = _build(root / VLLM.name, url, lock, root / "ctx-cold", "--no-cache")
        yield {"lock": Lock.parse(lock.read_text()), "first": first, "second": second,
               "other": other, "cold": cold, "first_layers": first_layers,
               "cold_layers": _rootfs(cold["tags"][0])}
    for ref in refs:
        subprocess.run([DOCKER, "image", "rm", "-f", ref], capture_output=True)


def _runtime_groups(lock) -> list[str]:
    """The lock's groups the runtime copies: the CUDA compiler wheels (``toolkit-*``) stay in the
    builder, whose kernels stage compiled with them (issue 33); its output is a layer of its own."""
    return [group for group in lock.layers() if not group.startswith("toolkit-")]


def test_one_layer_per_lock_group_in_order(builds):
    locked = builds["lock"].layers()
    assert locked[:2] == ["venv", "toolkit-1"], locked  # the H100 lock pins the compiler wheels
    groups = _runtime_groups(builds["lock"])
    assert groups[0] == "venv" and len(groups) >= 3, groups  # venv, torch-1, vllm-1 at least
    copies = [line.split("/opt/imgfab/layers/", 1)[1].split("/", 1)[0]
              for line in _history(builds["first"]["tags"][0]).splitlines()[::-1]
              if "/opt/imgfab/layers/" in line]
    assert copies == groups + ["kernels"]
    layers = payload_layers(builds["first"], groups)
    assert len(set(layers.values())) == len(groups), "each group is a layer of its own"


def test_two_builds_of_one_lock_give_the_same_payload_layers(builds):
    groups = _runtime_groups(builds["lock"])
    # --no-cache: at most the stage bases count as cached; the install and the COPYs ran again.
    assert builds["first"]["cached_steps"] <= 1 and builds["second"]["cached_steps"] <= 1
    assert payload_layers(builds["first"], groups) == payload_layers(builds["second"], groups)


def test_recipes_locking_the_same_packages_share_payload_layers(builds):
    """The lock's layers only: the kernels layer above them is compiled for each recipe's GPU."""
    groups = _runtime_groups(builds["lock"])
    assert payload_layers(builds["first"], groups) == payload_layers(builds["other"], groups)


def test_payload_layers_are_root_owned_at_the_epoch(builds):
    ref = builds["first"]["tags"][0]
    out = subprocess.run([DOCKER, "run", "--rm", "--entrypoint", "sh", ref, "-c",
                          "find /opt/venv -newermt @1 -print | head -5; "
                          "find /opt/venv ! -user 0 -print | head -5"],
                         capture_output=True, text=True, check=True).stdout
    assert out == "", f"payload files not normalised:\n{out}"


def test_cubins_for_other_gpus_are_cut_and_the_arch_label_follows(builds):
    """The fake vllm wheel ships a Blackwell-only cubin (sm100f in its name and its ELF header)
    and one without an architecture in its name. The H100 recipe's lock serves 9.0: the first
    is gone from the image, the second stays, and the image no longer claims 10.0."""
    lock = builds["lock"]
    assert lock.cubins_cut == ("sm100f",)
    ref = builds["first"]["tags"][0]
    out = subprocess.run([DOCKER, "run", "--rm", "--entrypoint", "sh", ref, "-c",
                          "ls /opt/venv/lib/python3*/site-packages/vllm/_cubins/"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["kernel.fake_grouped_gemm.0074.cubin"]
    labels = json.loads(subprocess.run([DOCKER, "image", "inspect", ref], capture_output=True, text=True,
                                       check=True).stdout)[0]["Config"]["Labels"]
    archs = labels["org.imgfab.archs"].split(",")
    assert "9.0" in archs and "10.0" not in archs, archs


def test_a_cold_rebuild_is_the_same_image(builds):
    """Every layer (the OS layer, the payload, the probe, the entrypoint, image.json) and the
    config: the same bytes from a cold cache."""
    first, cold = builds["first_layers"], builds["cold_layers"]
    differing = [i for i, (a, b) in enumerate(zip(first, cold)) if a != b]
    assert len(first) == len(cold) and not differing, \
        f"layers {differing} of {len(first)} differ between two cold builds"
    assert builds["cold"]["cached_steps"] <= 1
    assert builds["first"]["image_id"] == builds["cold"]["image_id"], "the config differs"


def test_the_real_oci_save_is_zstd_and_verify_reads_every_layer(builds, tmp_path):
    """The engine's own ``docker save`` (the containerd store writes the OCI layout): index.json,
    oci-layout, blobs/sha256; each layer a zstd blob with an OCI media type; and verify's
    single-pass scan of that stream (issue 12, unchanged) reads every layer the manifest lists,
    hashing each to the diff id inspect reports, and finds nothing to fail."""
    import tarfile

    from imgfab.docker import engine
    from imgfab.docker.layers import _scan_layers
    from imgfab.docker.verify import VerifyPolicy, layer_findings

    ref = builds["first"]["tags"][0]
    saved = engine.save_image(ref, tmp_path / "image.tar")
    with tarfile.open(saved) as archive:
        names = set(archive.getnames())
        assert {"oci-layout", "index.json", "manifest.json"} <= names, sorted(names)[:8]
        index = json.load(archive.extractfile("index.json"))
        manifest_digest = index["manifests"][0]["digest"]
        manifest = json.load(archive.extractfile(f"blobs/sha256/{manifest_digest[7:]}"))
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    media = {layer["mediaType"] for layer in manifest["layers"]}
    assert media == {"application/vnd.oci.image.layer.v1.tar+zstd"}, media
    labels = json.loads(subprocess.run([DOCKER, "image", "inspect", ref], capture_output=True,
                                       text=True, check=True).stdout)[0]["Config"]["Labels"]
    assert labels["org.imgfab.layers.compression"] == "zstd"
    assert labels["org.imgfab.pull.requires"] == "docker>=23.0|containerd>=1.5"

    policy = VerifyPolicy(mount_path="/models/qwen2-7b", required_labels={}, secrets={})
    with open(saved, "rb") as stream:
        scan = _scan_layers(iter(lambda: stream.read(1 << 20), b""), policy)
    assert scan.unscanned == [], scan.unscanned
    assert scan.diff_ids == _rootfs(ref)
    findings = {f.check: f for f in layer_findings(scan, policy)}
    for check in ("layers", "weights", "secrets"):  # tools: the build's own policy judged them
        assert findings[check].passed, f"{check}: {findings[check].detail}"
