"""From the build to the host (issue 18), on the local stack: the real registry with auth, the
real cosign 2.5 and oras 1.2 (Debian trixie's, installed by scripts/local-stack.sh), kustomize,
docker-compose and kubernetes-validate as the consumers of the deploy bundle.

One image is built, pushed and signed by `imgfab build --push --sign-key` into a repository of
its own; then it is checked the way a host and a cluster check it, and tampered with the three
ways an attacker (or a careless second build) would: an unsigned image under the signed tag, a
signature by another key, an attestation whose subject is another digest.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from fake_payload import INDEX_BUILD_ENV
from test_build import MIRROR, VLLM, _docker, _index_url, _lock_of, work  # noqa: F401

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
REGISTRY = os.environ.get("IMGFAB_REGISTRY", "127.0.0.1:5000")
COSIGN = os.environ.get("IMGFAB_COSIGN", "")
ORAS = os.environ.get("IMGFAB_ORAS", "")
SIGN_KEY = os.environ.get("IMGFAB_SIGN_KEY", "")
VERIFY_KEY = os.environ.get("IMGFAB_VERIFY_KEY", "")
KUSTOMIZE = os.environ.get("IMGFAB_KUSTOMIZE", "")
HOST = ("--driver", "580.65.06", "--gpu", "H100")  # the qwen2-7b-h100 image fits it


def imgfab(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgfab.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def cosign(*args: str, password: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if password is not None:
        env["COSIGN_PASSWORD"] = password
    elif os.environ.get("IMGFAB_COSIGN_PASSWORD_FILE"):
        env["COSIGN_PASSWORD"] = Path(os.environ["IMGFAB_COSIGN_PASSWORD_FILE"]).read_text().strip()
    return subprocess.run([COSIGN, *args], capture_output=True, text=True, env=env, timeout=300)


def digest_of(ref: str) -> str:
    from imgfab.docker import registry

    return registry.resolve_digest(ref, registry.Credentials.load(REGISTRY)).rsplit("@", 1)[1]


@pytest.fixture(scope="module")
def signed(work, tmp_path_factory):  # noqa: F811
    """`imgfab build --push --sign-key` of the qwen2-7b-h100 recipe into its own repository."""
    for tool, name in ((COSIGN, "IMGFAB_COSIGN"), (SIGN_KEY, "IMGFAB_SIGN_KEY"), (ORAS, "IMGFAB_ORAS")):
        assert tool and Path(tool).exists(), f"{name} missing: scripts/local-stack.sh up installs it"
    root, ca, _ = work
    directory = tmp_path_factory.mktemp("signed")
    repository = f"imgfab-test/signed-{uuid.uuid4().hex[:8]}"
    recipe = directory / VLLM.name
    recipe.write_text(VLLM.read_text().replace("repository: imgfab-test/qwen2-7b",
                                               f"repository: {repository}"))
    env = dict(os.environ, **INDEX_BUILD_ENV)
    result = imgfab("build", str(recipe), "--json", "--pip-index-url", _index_url(VLLM, root),
                    "--lock", _lock_of(VLLM, root), "--network", "host", "--mirror", MIRROR,
                    "--ca-cert", str(ca), "--output", str(directory / "ctx"), "--registry", REGISTRY,
                    "--push", "--sign-key", SIGN_KEY, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    built = json.loads(result.stdout)["images"][0]
    built["recipe_path"] = recipe
    built["repository"] = f"{REGISTRY}/{repository}"
    return built


def test_the_push_is_signed_attested_and_bundled(signed):
    publish = signed["publish"]
    name, digest = signed["pushed"].split("@")
    assert name == signed["repository"] and publish["digest"] == digest
    assert publish["signed"] is True and publish["attestations"] == ["cyclonedx", "slsaprovenance1"]
    bundle = Path(publish["bundle"])
    assert bundle == Path(signed["context"]) / "deploy"
    assert sorted(p.name for p in bundle.iterdir() if not p.name.startswith(".")) == [
        "bundle.json", "clusterimagepolicy.yaml", "compose.yaml", "k8s.yaml",
        "kustomization.yaml", "provenance.intoto.json", "run.sh", "sbom.cdx.json"]
    # the bases were pinned by digest for the push, and the image says so
    for ref in signed["base_images"].values():
        assert "@sha256:" in ref
    # the tag is the readable stack part plus the fingerprint
    assert re.fullmatch(r"vllm[\d.]+-cu[\d.]+-sm90-fp8-[0-9a-f]{12}", signed["tags"][1].rsplit(":", 1)[1])


def test_cosign_verifies_the_signature_and_both_attestations(signed):
    """The real consumers, by hand, as an operator would run them."""
    ref = signed["pushed"]
    digest = ref.split("@")[1]
    verified = cosign("verify", "--key", VERIFY_KEY, "--insecure-ignore-tlog", ref)
    assert verified.returncode == 0, verified.stderr
    payloads = json.loads(verified.stdout)
    assert {p["critical"]["image"]["docker-manifest-digest"] for p in payloads} == {digest}
    bundle = Path(signed["publish"]["bundle"])
    expected = {"cyclonedx": json.loads((bundle / "sbom.cdx.json").read_text()),
                "slsaprovenance1": json.loads((bundle / "provenance.intoto.json").read_text())["predicate"]}
    for kind, predicate in expected.items():
        done = cosign("verify-attestation", "--key", VERIFY_KEY, "--insecure-ignore-tlog",
                      "--type", kind, ref)
        assert done.returncode == 0, (kind, done.stderr)
        # cosign 2.5 re-serialises an slsaprovenance1 predicate through in-toto-golang's v1
        # struct, whose JSON tag spells runDetails.metadata.invocationId "invocationID"
        # (seen here; the SLSA v1.0 spec says invocationId): the one field compared renamed.
        statements = [json.loads(base64.b64decode(json.loads(line)["payload"])
                                 .replace(b'"invocationID"', b'"invocationId"'))
                      for line in done.stdout.splitlines() if line.strip()]
        ours = [s for s in statements if s["predicate"] == predicate]
        assert ours, kind
        assert ours[0]["subject"][0]["digest"]["sha256"] == digest.split(":")[1]
    # the provenance names what decided the build
    provenance = expected["slsaprovenance1"]
    dependencies = {d.get("uri", ""): d for d in provenance["buildDefinition"]["resolvedDependencies"]}
    assert any(u.endswith("/nvidia/cuda:12.8.2-base-ubuntu24.04@" + signed["base_images"]["RUNTIME_IMAGE"].split("@")[1])
               or signed["base_images"]["RUNTIME_IMAGE"].split("@")[1] in u for u in dependencies)
    assert any(u == "compat/vllm.yaml" for u in dependencies)
    text = json.dumps(provenance)
    assert "IMGFAB-SECRET-MARKER" not in text and "ca-cert" in text


def test_the_sbom_names_every_package_of_the_lock_and_the_image_os(signed, work):  # noqa: F811
    from imgfab.payload.lockfile import Lock

    sbom = json.loads((Path(signed["publish"]["bundle"]) / "sbom.cdx.json").read_text())
    assert sbom["specVersion"] == "1.6" and sbom["bomFormat"] == "CycloneDX"
    components = {c.get("purl", ""): c for c in sbom["components"]}
    lock = Lock.parse(Path(_lock_of(VLLM, work[0])).read_text())  # the lock the build installed
    assert lock.packages
    for name, (version, hashes) in lock.packages.items():
        component = components.get(f"pkg:pypi/{name}@{version}")
        assert component is not None, name
        assert sorted(f"sha256:{h['content']}" for h in component["hashes"]) == sorted(hashes)
    # OS packages read from the image's own dpkg status (the stand-in base is Debian)
    debs = [p for p in components if p.startswith("pkg:deb/")]
    assert any(p.startswith("pkg:deb/debian/python3@") for p in debs), debs[:5]
    runtime_digest = signed["base_images"]["RUNTIME_IMAGE"].split("@")[1]
    assert any(runtime_digest in p.replace("%3A", ":") for p in components if p.startswith("pkg:oci/"))


def test_the_bundle_names_exactly_the_digest_the_registry_serves(signed, tmp_path):
    """docker-compose config, kustomize build + kubernetes-validate --strict, and the run.sh
    stub all see REGISTRY/REPO@<the digest the registry serves for the pushed tag>."""
    bundle = Path(signed["publish"]["bundle"])
    served = f"{signed['repository']}@{digest_of(signed['tags'][1])}"
    assert served == signed["pushed"]
    key = tmp_path / "api-key"
    key.write_text("k-123")
    env = dict(os.environ, WEIGHTS_DIR="/srv/weights", API_KEY_FILE=str(key))
    env.pop("DOCKER_HOST", None)
    compose = subprocess.run(["docker-compose", "-f", str(bundle / "compose.yaml"), "config"],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
    assert compose.returncode == 0, compose.stderr
    (service,) = yaml.safe_load(compose.stdout)["services"].values()
    assert service["image"] == served
    assert KUSTOMIZE and Path(KUSTOMIZE).exists(), "IMGFAB_KUSTOMIZE missing: scripts/local-stack.sh up"
    built = subprocess.run([KUSTOMIZE, "build", str(bundle)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (tmp_path / "kustomized.yaml").write_text(built.stdout)
    validate = shutil.which("kubernetes-validate") or str(Path(sys.executable).parent / "kubernetes-validate")
    for path in (bundle / "k8s.yaml", tmp_path / "kustomized.yaml"):
        checked = subprocess.run([validate, "--strict", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        images = [c["image"] for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Deployment"
                  for c in d["spec"]["template"]["spec"]["containers"]]
        assert images == [served], path
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "docker").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$STUB_LOG"\n')
    (stubs / "docker").chmod(0o755)
    log = tmp_path / "argv"
    ran = subprocess.run(["bash", str(bundle / "run.sh")], capture_output=True, text=True,
                         env=dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}",
                                  STUB_LOG=str(log), WEIGHTS_DIR="/srv/weights",
                                  API_KEY_FILE=str(key)))
    assert ran.returncode == 0, ran.stderr
    assert served in log.read_text().splitlines()
    assert json.loads((bundle / "bundle.json").read_text())["image"] == served


def test_the_cluster_image_policy_names_the_repository_and_the_key(signed):
    policy = yaml.safe_load((Path(signed["publish"]["bundle"]) / "clusterimagepolicy.yaml").read_text())
    assert policy["kind"] == "ClusterImagePolicy"
    assert {"glob": f"{signed['repository']}@*"} in policy["spec"]["images"]
    keys = [a["key"]["data"] for a in policy["spec"]["authorities"] if "key" in a]
    assert keys and all(k.strip() == Path(VERIFY_KEY).read_text().strip() for k in keys)


def _select(repository: str, *args: str) -> subprocess.CompletedProcess:
    return imgfab("select", "--registry", repository, *HOST, *args)


def _other_image(signed, tmp_path, label: str) -> str:
    """Another image with the same imgfab labels (it fits the same host): the signed one plus
    a label, built on this engine."""
    (tmp_path / "Dockerfile").write_text(f"FROM {signed['tags'][0]}\nLABEL tamper={label}\n")
    tag = f"imgfab-test/tamper:{label}-{uuid.uuid4().hex[:6]}"
    _docker("build", "-q", "-t", tag, str(tmp_path))
    return tag


def _push_over(local: str, target: str) -> str:
    """Push ``local`` over ``target``'s tag, as a second build or an attacker would (the tag
    moved on purpose). Through imgfab's push, which retries what is transient (a reset or a 5xx
    from the registry): a bare ``docker push`` here failed once in CI with no message kept, and
    the tests after it then saw the moved local tag."""
    from imgfab.docker import registry

    pushed = registry.push(local, target, credentials=registry.Credentials.load(REGISTRY), retag=True)
    return pushed.split("@", 1)[1]


def test_select_verify_key_picks_the_signed_digest_and_rejects_each_tampering(signed, tmp_path):
    repository = signed["repository"]
    tag_ref = signed["tags"][1]
    picked = _select(repository, "--verify-key", VERIFY_KEY)
    assert picked.returncode == 0, picked.stderr
    assert picked.stdout.strip() == signed["pushed"]

    # 1. an unsigned image pushed under the signed tag
    unsigned = _push_over(_other_image(signed, tmp_path, "unsigned"), tag_ref)
    assert _select(repository).stdout.strip() == f"{repository}@{unsigned}"  # trusted blindly
    rejected = _select(repository, "--verify-key", VERIFY_KEY, "--explain")
    assert rejected.returncode == 1 and rejected.stderr.count("\n") == 1, rejected.stderr
    assert "signature: none verifies" in rejected.stdout, rejected.stdout

    # 2. signed, but by another key
    other = tmp_path / "other"
    other.mkdir()
    made = subprocess.run([COSIGN, "generate-key-pair"], cwd=other, capture_output=True, text=True,
                          env=dict(os.environ, COSIGN_PASSWORD="other"))
    assert made.returncode == 0, made.stderr
    ref = f"{repository}@{unsigned}"
    assert cosign("sign", "--key", str(other / "cosign.key"), "--tlog-upload=false", "--yes", ref,
                  password="other").returncode == 0
    rejected = _select(repository, "--verify-key", VERIFY_KEY, "--explain")
    assert rejected.returncode == 1 and "signature: none verifies" in rejected.stdout
    assert _select(repository, "--verify-key", str(other / "cosign.pub")).returncode == 1  # no attestations

    # 3. signed by the right key, with the signed image's attestations copied over: their
    #    subject is the other digest
    assert cosign("sign", "--key", SIGN_KEY, "--tlog-upload=false", "--yes", ref).returncode == 0
    signed_digest = signed["pushed"].split("@")[1]
    copied = subprocess.run([ORAS, "cp", "--from-plain-http", "--to-plain-http",
                             f"{repository}:{signed_digest.replace(':', '-')}.att",
                             f"{repository}:{unsigned.replace(':', '-')}.att"],
                            capture_output=True, text=True)
    assert copied.returncode == 0, copied.stderr
    rejected = _select(repository, "--verify-key", VERIFY_KEY, "--explain")
    assert rejected.returncode == 1, rejected.stdout
    assert "attestation cyclonedx" in rejected.stdout and "subject" in rejected.stdout
    assert "signature: none verifies" not in rejected.stdout  # the signature itself is good

    # the tag back on the signed digest: picked again
    subprocess.run([ORAS, "cp", "--from-plain-http", "--to-plain-http", signed["pushed"], tag_ref],
                   capture_output=True, text=True, check=True)
    assert _select(repository, "--verify-key", VERIFY_KEY).stdout.strip() == signed["pushed"]


def test_push_refuses_to_move_a_tag_to_another_digest(signed, tmp_path):
    from imgfab.docker import registry

    repository = f"{REGISTRY}/imgfab-test/retag-{uuid.uuid4().hex[:8]}"
    first = imgfab("push", signed["tags"][0], "--registry", REGISTRY)
    assert first.returncode == 0, first.stderr  # the signed repository's tag, same image: a no-op
    target = f"{repository}:v1"
    credentials = registry.Credentials.load(REGISTRY)
    held = registry.push(signed["tags"][0], target, credentials=credentials)
    other = _other_image(signed, tmp_path, "retag")
    _docker("tag", other, f"{repository.split('/', 1)[1]}:v1")
    moved = imgfab("push", f"{repository.split('/', 1)[1]}:v1", "--registry", REGISTRY)
    assert moved.returncode == 2 and moved.stderr.count("\n") == 1, moved.stderr
    assert held.split("@")[1] in moved.stderr and "--retag" in moved.stderr
    assert _docker("image", "inspect", "-f", "{{.Id}}", other).stdout.strip() in moved.stderr
    assert digest_of(target) == held.split("@")[1], "the refused push moved nothing"
    forced = imgfab("push", f"{repository.split('/', 1)[1]}:v1", "--registry", REGISTRY, "--retag")
    assert forced.returncode == 0, forced.stderr
    assert digest_of(target) != held.split("@")[1]


def test_promote_copies_by_digest_with_attestations_and_signs(signed):
    target_repo = f"{REGISTRY}/imgfab-test/released-{uuid.uuid4().hex[:8]}"
    done = imgfab("promote", signed["pushed"], "--to", f"{target_repo}:v1", "--sign-key", SIGN_KEY,
                  "--verify-key", VERIFY_KEY, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    digest = signed["pushed"].split("@")[1]
    assert report["promoted"] == f"{target_repo}@{digest}" and report["attestations"] is True
    assert report["source_verified"] is True, report
    assert digest_of(f"{target_repo}:v1") == digest
    for args in (("verify",), ("verify-attestation", "--type", "cyclonedx"),
                 ("verify-attestation", "--type", "slsaprovenance1")):
        checked = cosign(*args, "--key", VERIFY_KEY, "--insecure-ignore-tlog", report["promoted"])
        assert checked.returncode == 0, (args, checked.stderr)
    assert _select(target_repo, "--verify-key", VERIFY_KEY).stdout.strip() == report["promoted"]
    # a tag is never moved by a promotion unless told
    again = imgfab("promote", f"{signed['repository']}@sha256:{'0' * 64}", "--to", f"{target_repo}:v1")
    assert again.returncode == 2 and "already names" in again.stderr
    tagged = imgfab("promote", signed["tags"][1], "--to", f"{target_repo}:v2")
    assert tagged.returncode == 2 and "digest reference" in tagged.stderr


def test_promote_signs_nothing_it_cannot_verify(signed, tmp_path):
    # issue 34: an unsigned, unattested source exited 0 with "signed": true, "attestations":
    # false. Now it is exit 1 and nothing is copied, unless --no-verify-source, said in the output.
    repository = f"{REGISTRY}/imgfab-test/unsigned-{uuid.uuid4().hex[:8]}"
    unsigned = _push_over(_other_image(signed, tmp_path, "unverified"), f"{repository}:v1")
    source = f"{repository}@{unsigned}"
    target_repo = f"{REGISTRY}/imgfab-test/released-{uuid.uuid4().hex[:8]}"
    bare = imgfab("promote", source, "--to", f"{target_repo}:v1", "--sign-key", SIGN_KEY)
    assert bare.returncode == 2 and "--verify-key" in bare.stderr, bare.stderr
    refused = imgfab("promote", source, "--to", f"{target_repo}:v1", "--sign-key", SIGN_KEY,
                     "--verify-key", VERIFY_KEY)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "does not verify" in refused.stderr and "signature: none verifies" in refused.stderr
    from imgfab.docker import registry

    assert registry.tag_holder(f"{target_repo}:v1", registry.Credentials.load(REGISTRY)) is None  # nothing copied
    forced = imgfab("promote", source, "--to", f"{target_repo}:v1", "--sign-key", SIGN_KEY,
                    "--no-verify-source", "--json")
    assert forced.returncode == 0, forced.stderr
    report = json.loads(forced.stdout)
    assert report["signed"] is True and report["source_verified"] is False
    assert report["verification"] == "not verified: --no-verify-source"


def test_the_workflow_release_step_runs(signed, tmp_path):
    """The release job's script from `imgfab ci github`, run for real: jq, imgfab promote,
    cosign. Keyless signing needs Fulcio and an OIDC token, which do not exist here: a cosign
    shim (the one test double) turns the keyless calls into key-based ones, nothing else."""
    from imgfab.render.ci import PROMOTE

    name = "x"
    (tmp_path / "build" / name).mkdir(parents=True)
    shutil.copytree(signed["publish"]["bundle"], tmp_path / "build" / name / "deploy")
    report = {"schema_version": 1, "command": "build", "ok": True, "exit_code": 0,
              "images": [{"pushed": signed["pushed"], "tags": [signed["tags"][0]]}]}
    (tmp_path / "imgfab-report.json").write_text(json.dumps(report))
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "cosign").write_text(f"""#!/bin/bash
args=()
for a in "$@"; do case "$a" in --certificate-identity|--certificate-oidc-issuer) skip=1; continue;; esac
  if [ -n "$skip" ]; then skip=; continue; fi; args+=("$a"); done
case "${{args[0]}}" in
  sign|attest) exec {COSIGN} "${{args[0]}}" --key {SIGN_KEY} --tlog-upload=false "${{args[@]:1}}";;
  verify*) exec {COSIGN} "${{args[0]}}" --key {VERIFY_KEY} --insecure-ignore-tlog "${{args[@]:1}}";;
esac
exec {COSIGN} "${{args[@]}}"
""")
    (shims / "cosign").chmod(0o755)
    (shims / "imgfab").write_text(f'#!/bin/sh\nexec {sys.executable} -m imgfab.cli "$@"\n')
    (shims / "imgfab").chmod(0o755)
    target_registry = f"{REGISTRY}/imgfab-test/wf-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, PATH=f"{shims}:{os.environ['PATH']}", NAME=name,
               IMGFAB_REGISTRY=target_registry, IDENTITY="https://example/wf@refs/tags/v1",
               GITHUB_STEP_SUMMARY=str(tmp_path / "summary"),
               COSIGN_PASSWORD=Path(os.environ["IMGFAB_COSIGN_PASSWORD_FILE"]).read_text().strip())
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", PROMOTE], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-2000:]
    promoted = json.loads((tmp_path / "promoted.json").read_text())["promoted"]
    assert promoted == f"{target_registry}/{signed['tags'][0].split(':')[0]}@{signed['pushed'].split('@')[1]}"
    assert _select(promoted.split("@")[0], "--verify-key", VERIFY_KEY).stdout.strip() == promoted
