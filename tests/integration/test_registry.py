"""imgfab.docker.registry against the local stack's registry (docker distribution, htpasswd auth).

Needs `scripts/local-stack.sh up` and `source .stack/env`. Without DOCKER_HOST the module is
skipped locally; under CI=true a missing or dead stack fails instead.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from flaky_proxy import FlakyProxy

pytestmark = pytest.mark.integration

REGISTRY = os.environ.get("IMGFAB_REGISTRY", "127.0.0.1:5000")
MIRROR = os.environ.get("IMGFAB_MIRROR", f"{REGISTRY}/mirror")


def _stack_problem() -> str | None:
    if not os.environ.get("DOCKER_HOST"):
        return "DOCKER_HOST is unset: run scripts/local-stack.sh up and source .stack/env"
    for name in ("IMGFAB_REGISTRY_USER", "IMGFAB_REGISTRY_PASSWORD_FILE"):
        if not os.environ.get(name):
            return f"{name} is unset: source .stack/env"
    try:
        import docker

        docker.from_env().ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "no engine"
        return f"the Docker engine at {os.environ['DOCKER_HOST']} does not answer: {exc}"
    host, _, port = REGISTRY.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        return f"registry {REGISTRY} does not answer: {exc}"
    return None


@pytest.fixture(scope="module", autouse=True)
def stack():
    problem = _stack_problem()
    if problem:
        if os.environ.get("CI", "").lower() == "true" or os.environ.get("DOCKER_HOST"):
            pytest.fail(f"local stack is down: {problem}")
        pytest.skip(f"local stack not configured: {problem}")


@pytest.fixture(scope="module")
def docker_client():
    import docker

    return docker.from_env()


@pytest.fixture(scope="module")
def credentials():
    from imgfab.docker.registry import Credentials

    return Credentials.load(REGISTRY)


@pytest.fixture(scope="module")
def password() -> str:
    return Path(os.environ["IMGFAB_REGISTRY_PASSWORD_FILE"]).read_text().strip()


@pytest.fixture
def tiny_image(docker_client):
    """A one-file image imported from an in-memory tar, labelled with a unique id."""
    made: list[str] = []

    def make(repository: str = "imgfab-test/tiny") -> tuple[str, str]:
        token = uuid.uuid4().hex[:10]
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            data = f"imgfab registry test {token}\n".encode()
            info = tarfile.TarInfo("hello.txt")
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
        ref = f"{repository}:{token}"
        docker_client.api.import_image_from_data(
            buf.getvalue(), repository=repository, tag=token,
            changes=[f"LABEL org.imgfab.test.token={token}", "LABEL org.imgfab.test=registry"])
        made.append(ref)
        return ref, token

    yield make
    for ref in made:
        for image in [ref] + [t for t in _tags_of(docker_client, ref) if t != ref]:
            try:
                docker_client.api.remove_image(image, force=True)
            except Exception:  # noqa: BLE001 - gone already is fine
                pass


def _tags_of(docker_client, ref: str) -> list[str]:
    try:
        return docker_client.images.get(ref).tags
    except Exception:  # noqa: BLE001
        return []


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def imgfab(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True,
                          text=True, input=stdin, timeout=300)


# --- push -------------------------------------------------------------------------------------

def test_push_returns_digest_ref_that_head_confirms(tiny_image, credentials):
    from imgfab.docker.registry import image_config, list_tags, push, resolve_digest

    local, token = tiny_image()
    target = f"{REGISTRY}/imgfab-test/pushed:{token}"
    lines: list[str] = []
    ref = push(local, target, credentials=credentials, on_line=lines.append)
    assert ref.startswith(f"{REGISTRY}/imgfab-test/pushed@sha256:") and len(ref.split("@")[1]) == 71
    assert resolve_digest(target, credentials) == f"{target}@{ref.split('@')[1]}"
    assert token in list_tags(f"{REGISTRY}/imgfab-test/pushed", credentials)
    assert image_config(ref, credentials)["config"]["Labels"]["org.imgfab.test.token"] == token
    assert any("Pushed" in line or "Layer already exists" in line for line in lines)


def test_cli_push_prints_the_digest_ref(tiny_image, password):
    local, token = tiny_image("imgfab-test/cli")
    result = imgfab("push", local, "--registry", REGISTRY, "--registry-user", "imgfab",
                    "--password-stdin", stdin=password + "\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(f"{REGISTRY}/imgfab-test/cli@sha256:")
    assert password not in result.stdout + result.stderr


def test_wrong_password_exits_1_one_line_and_pushes_nothing(tiny_image, credentials):
    from imgfab.docker.registry import list_tags

    repository = f"imgfab-test/refused-{uuid.uuid4().hex[:8]}"
    local, _ = tiny_image(repository)
    result = imgfab("push", local, "--registry", REGISTRY, "--registry-user", "imgfab",
                    "--password-stdin", stdin="not-the-password\n")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert (f"registry {REGISTRY} refused the credentials for user imgfab (401)" in lines[0]
            and "--registry-user / the password" in lines[0]), lines[0]
    assert "not-the-password" not in result.stderr + result.stdout
    assert result.stdout == ""
    assert list_tags(f"{REGISTRY}/{repository}", credentials) == []


def test_wrong_password_is_not_retried(tiny_image, password):
    from imgfab.errors import RegistryError
    from imgfab.docker.registry import Credentials, push

    local, token = tiny_image()
    with FlakyProxy(("127.0.0.1", int(REGISTRY.rsplit(":", 1)[1])), drop=0) as proxy:
        bad = Credentials(f"127.0.0.1:{proxy.port}", "imgfab", "wrong")
        with pytest.raises(RegistryError, match=r"refused the credentials.*\(401\)"):
            push(local, f"127.0.0.1:{proxy.port}/imgfab-test/tiny:{token}", credentials=bad,
                 attempts=5)
        # One auth probe: the anonymous GET /v2/ and the one with credentials, no retry.
        assert proxy.forwarded <= 2, proxy.seen


def test_flaky_network_push_is_retried_then_succeeds(tiny_image, password, monkeypatch,
                                                     credentials):
    """The daemon's first two connections are reset: failed attempts, then one pushes. Docker
    20.10 failed an attempt per reset; Docker 26's containerd-store push opens more than one
    connection per attempt, so both resets may land in one attempt (one retry, or two).
    Credentials are keyed by host:port, so the proxy's address gets them explicitly."""
    from imgfab.docker import registry
    from imgfab.docker.registry import Credentials, push, resolve_digest

    monkeypatch.setattr(registry, "BACKOFF_S", 0.1)
    local, token = tiny_image()
    daemon = lambda first: b"User-Agent: docker/" in first  # noqa: E731
    with FlakyProxy(("127.0.0.1", int(REGISTRY.rsplit(":", 1)[1])), drop=2,
                    match=daemon) as proxy:
        proxied = Credentials(f"127.0.0.1:{proxy.port}", "imgfab", password)
        lines: list[str] = []
        ref = push(local, f"127.0.0.1:{proxy.port}/imgfab-test/flaky:{token}",
                   credentials=proxied, attempts=5, on_line=lines.append)
        assert proxy.dropped == 2
    retries = [line for line in lines if line.startswith("retrying")]
    assert 1 <= len(retries) <= 2 and all("connection reset" in line for line in retries), retries
    digest = ref.split("@")[1]
    assert resolve_digest(f"{REGISTRY}/imgfab-test/flaky:{token}", credentials).endswith(digest)


def test_flaky_auth_probe_is_retried(tiny_image, password, monkeypatch):
    from imgfab.docker import registry
    from imgfab.docker.registry import Credentials, push

    monkeypatch.setattr(registry, "BACKOFF_S", 0.1)
    local, token = tiny_image()
    imgfab_probe = lambda first: b"User-Agent: imgfab" in first  # noqa: E731
    with FlakyProxy(("127.0.0.1", int(REGISTRY.rsplit(":", 1)[1])), drop=1,
                    match=imgfab_probe) as proxy:
        lines: list[str] = []
        ref = push(local, f"127.0.0.1:{proxy.port}/imgfab-test/flaky:{token}",
                   credentials=Credentials(f"127.0.0.1:{proxy.port}", "imgfab", password),
                   on_line=lines.append)
        assert proxy.dropped == 1 and "@sha256:" in ref
    assert sum(line.startswith("retrying") for line in lines) == 1


def test_gives_up_after_attempts_with_the_last_error(tiny_image, password, monkeypatch):
    from imgfab.docker import registry
    from imgfab.errors import RegistryError
    from imgfab.docker.registry import Credentials, push

    monkeypatch.setattr(registry, "BACKOFF_S", 0.05)
    local, token = tiny_image()
    with FlakyProxy(("127.0.0.1", int(REGISTRY.rsplit(":", 1)[1])), drop=99) as proxy:
        with pytest.raises(RegistryError) as caught:
            push(local, f"127.0.0.1:{proxy.port}/imgfab-test/flaky:{token}",
                 credentials=Credentials(f"127.0.0.1:{proxy.port}", "imgfab", password),
                 attempts=3)
        assert proxy.dropped == 3
    assert "connection reset" in caught.value.message and "3 attempts" in caught.value.message


def test_registry_down_exits_1_one_line(tiny_image):
    local, _ = tiny_image()
    port = _closed_port()
    result = imgfab("push", local, "--registry", f"127.0.0.1:{port}", "--registry-user",
                    "imgfab", "--password-stdin", "--attempts", "1", stdin="x\n")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert (f"cannot reach registry 127.0.0.1:{port}: connection refused" in lines[0]
            and "check that the registry is running and HOST[:PORT] is right" in lines[0]
            and "local-stack" not in lines[0]), lines[0]


def test_registry_down_read_api_is_one_error():
    from imgfab.errors import RegistryError
    from imgfab.docker.registry import Credentials, resolve_digest

    port = _closed_port()
    with pytest.raises(RegistryError, match=f"cannot reach registry 127.0.0.1:{port}: "
                                            "connection refused"):
        resolve_digest(f"127.0.0.1:{port}/x/y:1", Credentials(f"127.0.0.1:{port}"))


# --- read API ---------------------------------------------------------------------------------

def test_resolve_digest_on_a_mirror_ref(credentials):
    from imgfab.docker.registry import list_tags, resolve_digest

    tags = list_tags(f"{MIRROR}/nvidia/cuda", credentials)
    assert tags, "scripts/local-stack.sh up pushes stand-ins under the mirror"
    ref = f"{MIRROR}/nvidia/cuda:{sorted(tags)[0]}"
    pinned = resolve_digest(ref, None)  # None: credentials from the Docker config
    assert pinned.startswith(ref + "@sha256:")
    assert resolve_digest(pinned, credentials) == pinned


def test_resolve_digest_unknown_tag_is_one_error(credentials):
    from imgfab.errors import RegistryError
    from imgfab.docker.registry import resolve_digest

    with pytest.raises(RegistryError, match="is not in registry"):
        resolve_digest(f"{MIRROR}/nvidia/cuda:no-such-tag", credentials)


def test_list_tags_follows_link_pagination(tiny_image, credentials, docker_client):
    from imgfab.docker.registry import list_tags, push

    local, _ = tiny_image()
    repository = f"{REGISTRY}/imgfab-test/paged-{uuid.uuid4().hex[:8]}"
    wanted = [f"t{i}" for i in range(5)]
    for tag in wanted:
        push(local, f"{repository}:{tag}", credentials=credentials)
        docker_client.api.remove_image(f"{repository}:{tag}")
    assert sorted(list_tags(repository, credentials, page_size=2)) == wanted
    assert sorted(list_tags(repository, credentials)) == wanted


def test_image_config_labels_from_the_mirror(credentials):
    from imgfab.docker.registry import image_config, list_tags

    tag = sorted(list_tags(f"{MIRROR}/nvidia/cuda", credentials))[0]
    config = image_config(f"{MIRROR}/nvidia/cuda:{tag}", credentials)
    assert config["config"]["Labels"]["org.imgfab.stand-in"] == "true"
    assert config["os"] == "linux"


def test_credentials_never_show_the_password(credentials, password):
    assert password not in repr(credentials) and password not in str(credentials)
    assert "***" in repr(credentials)


# --- progress of push and pull (issue 23) -------------------------------------------------------

@pytest.fixture
def sized_image(docker_client):
    """An image of one 20 MB layer of random bytes: the daemon reports its upload in parts."""
    token = uuid.uuid4().hex[:10]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(20_000_000)
        info = tarfile.TarInfo("blob")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    local = f"imgfab-test/sized:{token}"
    docker_client.api.import_image_from_data(buf.getvalue(), repository="imgfab-test/sized", tag=token)
    yield local, token
    for ref in (local, f"{REGISTRY}/imgfab-test/sized:{token}"):
        try:
            docker_client.api.remove_image(ref, force=True)
        except Exception:  # noqa: BLE001 - gone already is fine
            pass


def _uploaded_image(credentials, repository: str, tag: str, size: int) -> None:
    """An image of one ``size``-byte layer of random bytes, put in the registry through its HTTP
    API (docker distribution, basic auth), so that the engine never held any of its bytes.

    A pull of an image this engine pushed is not cold: with the containerd image store, removing
    the image leaves its blobs in the content store until containerd's garbage collection runs,
    and a pull then reads 0 B of them ("Already exists")."""
    import hashlib
    import json

    import requests

    session = requests.Session()
    session.auth = (str(credentials.username), str(credentials.password))
    base = f"http://{REGISTRY}/v2/{repository}"

    def blob(data: bytes) -> str:
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        start = session.post(f"{base}/blobs/uploads/", timeout=30)
        assert start.status_code == 202, start.text
        location = start.headers["Location"]
        if location.startswith("/"):
            location = f"http://{REGISTRY}{location}"
        done = session.put(location, params={"digest": digest}, data=data, timeout=120,
                           headers={"Content-Type": "application/octet-stream"})
        assert done.status_code == 201, done.text
        return digest

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(size)
        info = tarfile.TarInfo("blob")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    layer = buf.getvalue()
    layer_digest = blob(layer)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}).encode()
    config_digest = blob(config)
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": config_digest, "size": len(config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                            "digest": layer_digest, "size": len(layer)}]}
    put = session.put(f"{base}/manifests/{tag}", data=json.dumps(manifest).encode(), timeout=30,
                      headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
    assert put.status_code == 201, put.text


def test_a_push_reports_every_byte_sent(sized_image, credentials):
    from imgfab.docker.registry import push
    from imgfab.progress import Progress

    local, token = sized_image
    sent = io.StringIO()
    push(local, f"{REGISTRY}/imgfab-test/sized:{token}", credentials=credentials,
         progress=Progress("plain", stream=sent, interval_s=0))
    lines = sent.getvalue().splitlines()
    assert lines and lines[-1].endswith(f"push {REGISTRY}/imgfab-test/sized:{token}: 20.0 MB of 20.0 MB sent"), lines


def test_a_cold_pull_reports_every_byte_read(credentials, docker_client):
    from imgfab.docker import engine
    from imgfab.progress import Progress

    token = uuid.uuid4().hex[:10]
    target = f"{REGISTRY}/imgfab-test/cold:{token}"
    _uploaded_image(credentials, "imgfab-test/cold", token, 20_000_000)
    assert not engine.has_image(target)
    read = io.StringIO()
    try:
        engine.pull_image(target, auth_config=credentials.auth_config(),
                          progress=Progress("plain", stream=read, interval_s=0))
        lines = read.getvalue().splitlines()
        assert lines[0].endswith(f"pulling {target}")
        # 20,000,000 bytes of file in a tar (a header and padding add under 10 kB): "20.0 MB".
        assert lines[-1].endswith(f"pull {target}: 20.0 MB of 20.0 MB read"), lines
        assert engine.has_image(target)
    finally:
        try:
            docker_client.api.remove_image(target, force=True)
        except Exception:  # noqa: BLE001 - not pulled is fine
            pass


def test_a_pull_of_a_missing_tag_is_one_registry_error(credentials):
    from imgfab.docker import engine
    from imgfab.errors import RegistryError

    with pytest.raises(RegistryError) as caught:
        engine.pull_image(f"{REGISTRY}/imgfab-test/sized:absent-{uuid.uuid4().hex[:6]}",
                          auth_config=credentials.auth_config())
    assert "\n" not in caught.value.one_line() and "pull" in caught.value.one_line()


def test_cli_push_shows_progress_on_stderr_and_none_with_q(sized_image, password):
    local, token = sized_image
    user = os.environ["IMGFAB_REGISTRY_USER"]
    loud = imgfab("push", local, "--registry", REGISTRY, "--registry-user", user,
                  "--password-stdin", stdin=password)
    assert loud.returncode == 0, loud.stderr
    assert "20.0 MB of 20.0 MB sent" in loud.stderr
    quiet = imgfab("push", local, "--registry", REGISTRY, "--registry-user", user,
                   "--password-stdin", "-q", stdin=password)
    assert quiet.returncode == 0, quiet.stderr
    assert "sent" not in quiet.stderr and quiet.stdout.strip() == loud.stdout.strip()
