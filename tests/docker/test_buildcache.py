"""Build caches and builders (issue 37): the specs imgfab passes to buildx, refused in one line
when they cannot work; the bake file's per-target cache entries; and what reaches the docker CLI
for a builder of each driver.

The engine is a stand-in at its edge here: a recording docker CLI script (a ``remote`` BuildKit
builder cannot be installed from the registries this machine reaches). The real buildx, its
registry cache and a builder by name are tested on the local engine in
tests/integration/test_build_cache.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from imgfab.docker import buildcache, engine
from imgfab.errors import EngineError, RecipeError

from conftest import REPO

L4 = REPO / "recipes/llama31-8b-l4.yaml"
H100 = REPO / "recipes/qwen2-7b-h100.yaml"


@pytest.mark.parametrize("spec", [
    "type=registry,ref=127.0.0.1:5000/cache/qwen:{recipe},mode=max",
    "type=registry,ref=registry.example/team/cache@sha256:" + "a" * 64,
    "type=local,src=/var/cache/buildkit",
])
def test_cache_from_specs_that_buildx_reads(spec):
    assert buildcache.check_cache_spec(spec, field="--cache-from") == spec


@pytest.mark.parametrize("spec, message", [
    ("ref=reg/cache:x", "the cache spec names no type="),
    ("type=gha", "cache type 'gha' is not one imgfab passes to buildx"),
    ("type=inline", "cache type 'inline' is not one imgfab passes to buildx"),  # from: no inline
    ("type=registry", "a registry cache names its ref="),
    ("type=local,dest=/tmp/x", "a local cache names its src="),
    ("type=registry,ref=reg/c:x,ref=reg/c:y", "cache spec key 'ref' is given twice"),
    ("type=registry,ref=reg/c x", "cache spec key 'ref': its value is empty"),
    ("type=registry,,ref=reg/c:x", "cache spec part 2 is not KEY=VALUE"),
])
def test_cache_from_specs_refused_in_one_line(spec, message):
    with pytest.raises(RecipeError) as caught:
        buildcache.check_cache_spec(spec, field="--cache-from")
    assert caught.value.field == "--cache-from"
    assert str(caught.value).startswith(message), str(caught.value)


def test_cache_to_takes_inline_and_a_local_dest():
    assert buildcache.check_cache_spec("type=inline", field="--cache-to") == "type=inline"
    buildcache.check_cache_spec("type=local,dest=/tmp/c,mode=max", field="--cache-to")
    with pytest.raises(RecipeError, match="a local cache names its dest="):
        buildcache.check_cache_spec("type=local,src=/tmp/c", field="--cache-to")


def test_a_credential_in_a_spec_is_refused_without_its_value():
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    with pytest.raises(RecipeError) as caught:
        buildcache.check_cache_spec(f"type=registry,ref=r/c:x,secret_access_key={secret}",
                                    field="--cache-to")
    line = caught.value.one_line()
    assert secret not in line and "'secret_access_key' carries a credential" in line


def test_one_cache_to_for_several_recipes_needs_the_recipe_placeholder():
    with pytest.raises(RecipeError) as caught:
        buildcache.check_cache_specs([], ["type=registry,ref=r/cache:all,mode=max"], 2)
    assert caught.value.field == "--cache-to" and "{recipe}" in caught.value.fix
    buildcache.check_cache_specs([], ["type=registry,ref=r/cache:{recipe},mode=max"], 2)
    buildcache.check_cache_specs(["type=registry,ref=r/cache:shared"], [], 2)  # reading is fine


def test_the_placeholder_becomes_each_recipe_name():
    assert buildcache.for_recipe(["type=registry,ref=r/c:{recipe},mode=max", "type=local,src=/c"],
                                 "qwen2-7b-h100") == \
        ["type=registry,ref=r/c:qwen2-7b-h100,mode=max", "type=local,src=/c"]


def test_the_exporter_follows_the_builders_driver():
    image = "type=image,compression=zstd,force-compression=true,oci-mediatypes=true"
    assert buildcache.output_for_driver(image, "docker") == image
    assert buildcache.output_for_driver(image, "remote") == \
        "type=docker,compression=zstd,force-compression=true,oci-mediatypes=true"


def _imgfab(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def test_bake_writes_each_targets_own_cache_refs(tmp_path):
    result = _imgfab("bake", str(L4), str(H100), "-o", "out/docker-bake.json", "-q",
                     "--cache-from", "type=registry,ref=reg.example/cache:{recipe}",
                     "--cache-to", "type=registry,ref=reg.example/cache:{recipe},mode=max",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    targets = json.loads((tmp_path / "out/docker-bake.json").read_text())["target"]
    assert targets["llama31-8b-l4"]["cache-from"] == ["type=registry,ref=reg.example/cache:llama31-8b-l4"]
    assert targets["llama31-8b-l4"]["cache-to"] == \
        ["type=registry,ref=reg.example/cache:llama31-8b-l4,mode=max"]
    assert targets["qwen2-7b-h100"]["cache-to"] == \
        ["type=registry,ref=reg.example/cache:qwen2-7b-h100,mode=max"]
    plain = _imgfab("bake", str(L4), "-o", "plain/docker-bake.json", "-q", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    target = json.loads((tmp_path / "plain/docker-bake.json").read_text())["target"]["llama31-8b-l4"]
    assert "cache-from" not in target and "cache-to" not in target


def test_bake_and_build_refuse_a_shared_cache_to_before_writing(tmp_path):
    for command in (["bake", "-o", "out/docker-bake.json"], ["build", "--bake", "out/docker-bake.json"]):
        result = _imgfab(*command, str(L4), str(H100), "--cache-to", "type=registry,ref=r/c:all",
                         cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("imgfab: --cache-to: one --cache-to for 2 recipes"), result.stderr
        assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
        assert not (tmp_path / "out").exists()


def test_a_builder_name_is_checked_and_bake_needs_build_to_use_it(tmp_path):
    bad = _imgfab("build", str(L4), "--builder", "-rm", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("imgfab: --builder: the builder name"), bad.stderr
    unused = _imgfab("bake", str(L4), "--builder", "fleet", "-o", "o/docker-bake.json", cwd=tmp_path)
    assert unused.returncode == 2 and "add --build" in unused.stderr, unused.stderr
    assert not (tmp_path / "o").exists()


def _recording_cli(tmp_path: Path, driver: str | None) -> tuple[Path, Path]:
    """A docker CLI that answers like buildx does (``build --help`` with its flags, ``buildx
    inspect`` with the builder's driver, or no such builder) and records every argv."""
    record = tmp_path / "argv.jsonl"
    cli = tmp_path / "docker"
    inspect = (f"printf 'Name: $3\\nDriver: {driver}\\n'; exit 0" if driver
               else "echo \"ERROR: no builder \\\"$3\\\" found\" >&2; exit 1")
    cli.write_text(f"""#!/bin/sh
{sys.executable} -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "$@" >> {record}
case "$1 $2" in
  "build --help") echo "--secret --cache-from --cache-to --builder"; exit 0;;
  "buildx inspect") {inspect};;
  "context show") echo default; exit 0;;
  "build "*) echo "#1 DONE"; exit 0;;
esac
exit 0
""")
    cli.chmod(0o755)
    return cli, record


def _argv(record: Path) -> list[list[str]]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_a_remote_builder_gets_the_builder_the_caches_and_a_loading_exporter(tmp_path, monkeypatch):
    cli, record = _recording_cli(tmp_path, "remote")
    monkeypatch.setenv("IMGFAB_DOCKER_CLI", str(cli))
    monkeypatch.setattr(engine, "check_engine", lambda compression, facts=None: engine.EngineFacts(
        version="26.1.5", containerd_store=True, storage="overlayfs"))
    monkeypatch.setattr(engine, "inspect_image", lambda ref: {"Id": "sha256:" + "1" * 64})
    engine.build(tmp_path, compression="zstd", epoch=1, builder="fleet",
                 cache_from=("type=registry,ref=reg/c:x",),
                 cache_to=("type=registry,ref=reg/c:x,mode=max",))
    calls = _argv(record)
    assert ["buildx", "inspect", "fleet"] in calls
    build = next(c for c in calls if c[0] == "build" and c[1] != "--help")
    assert build[build.index("--builder") + 1] == "fleet"
    assert build[build.index("--cache-from") + 1] == "type=registry,ref=reg/c:x"
    assert build[build.index("--cache-to") + 1] == "type=registry,ref=reg/c:x,mode=max"
    assert build[build.index("--output") + 1] == \
        "type=docker,compression=zstd,force-compression=true,oci-mediatypes=true"


def test_an_unknown_builder_is_one_line_at_exit_1(tmp_path, monkeypatch):
    cli, record = _recording_cli(tmp_path, None)
    monkeypatch.setenv("IMGFAB_DOCKER_CLI", str(cli))
    with pytest.raises(EngineError) as caught:
        engine.build(tmp_path, compression="gzip", builder="nowhere")
    assert caught.value.exit_code == 1 and caught.value.field == "--builder"
    assert str(caught.value) == "buildx has no builder 'nowhere'"
    assert not any(c[0] == "build" and c[1] != "--help" for c in _argv(record))


def test_a_classic_store_docker_builder_cannot_export_a_cache(tmp_path, monkeypatch):
    cli, record = _recording_cli(tmp_path, "docker")
    monkeypatch.setenv("IMGFAB_DOCKER_CLI", str(cli))
    monkeypatch.setattr(engine, "check_engine", lambda compression, facts=None: engine.EngineFacts(
        version="26.1.5", containerd_store=False, storage="overlay2"))
    with pytest.raises(EngineError) as caught:
        engine.build(tmp_path, compression="gzip", cache_to=("type=registry,ref=r/c:x",))
    assert caught.value.field == "--cache-to" and "classic image store" in str(caught.value)


def test_a_cli_without_buildx_is_refused_for_caches(tmp_path, monkeypatch):
    cli = tmp_path / "docker"
    cli.write_text("#!/bin/sh\necho '--secret --cache-from'\n")  # the classic CLI's build
    cli.chmod(0o755)
    monkeypatch.setenv("IMGFAB_DOCKER_CLI", str(cli))
    assert engine.docker_cli() == str(cli)
    with pytest.raises(EngineError, match="builds without buildx"):
        engine.docker_cli(buildx=True)


def _layout(root: Path, files: dict[str, bytes]) -> Path:
    """An OCI layout as BuildKit's local cache exporter writes one: a gzip layer holding
    ``files`` and a JSON blob (the cache config) beside it."""
    import gzip
    import hashlib
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    for blob in (gzip.compress(raw.getvalue(), mtime=0), b'{"layers": []}'):
        (blobs / hashlib.sha256(blob).hexdigest()).write_bytes(blob)
    return root


def _policy(secret: bytes):
    from imgfab.docker.verify import VerifyPolicy

    return VerifyPolicy(mount_path="/models", required_labels={}, secrets={"pip-conf": secret})


PIP_CONF = b"[global]\nindex-url = https://ci:s3cret-Pa55word@pypi.corp.example/simple\n"


def test_a_cache_layer_holding_the_pip_conf_password_fails_the_build(tmp_path):
    from imgfab.docker.cache_scan import scan_cache
    from imgfab.errors import ValidationFailed

    dest = _layout(tmp_path / "cache", {"root/.config/pip/pip.conf": PIP_CONF,
                                        "opt/venv/ok.py": b"print(1)\n"})
    with pytest.raises(ValidationFailed) as caught:
        scan_cache(f"type=local,dest={dest},mode=max", _policy(PIP_CONF))
    line = caught.value.one_line()
    assert caught.value.field == "--cache-to" and "holds a build secret: pip-conf" in line, line
    assert "s3cret-Pa55word" not in line


def test_a_clean_cache_is_counted(tmp_path):
    from imgfab.docker.cache_scan import scan_cache

    dest = _layout(tmp_path / "cache", {"opt/venv/ok.py": b"print(1)\n"})
    scan = scan_cache(f"type=local,dest={dest}", _policy(PIP_CONF)).to_dict()
    assert scan["layers"] == 1 and scan["secrets"] == [] and scan["bytes"] > 0


def test_another_contexts_engine_is_not_taken_as_a_builder(tmp_path, monkeypatch):
    """buildx builds on a docker-driver builder only as the current context (measured on
    buildx 0.13: "use `docker --context=NAME buildx` to switch"), and imgfab verifies there."""
    cli, record = _recording_cli(tmp_path, "docker")
    monkeypatch.setenv("IMGFAB_DOCKER_CLI", str(cli))
    monkeypatch.setattr(engine, "check_engine", lambda compression, facts=None: engine.EngineFacts(
        version="26.1.5", containerd_store=True, storage="overlayfs"))
    monkeypatch.setattr(engine, "inspect_image", lambda ref: {"Id": "sha256:" + "1" * 64})
    with pytest.raises(EngineError) as caught:
        engine.build(tmp_path, compression="gzip", builder="gpu-box")
    assert caught.value.field == "--builder" and "engine of docker context 'gpu-box'" in str(caught.value)
    assert not any(c[0] == "build" and c[1] != "--help" for c in _argv(record))
    engine.build(tmp_path, compression="gzip", builder="default")  # the current context: built
    build = next(c for c in _argv(record) if c[0] == "build" and c[1] != "--help")
    assert build[build.index("--builder") + 1] == "default"
    assert build[build.index("--output") + 1].startswith("type=image,")
