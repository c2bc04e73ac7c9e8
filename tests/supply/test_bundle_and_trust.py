"""The deploy bundle's files, the trust arguments cosign gets, select's trust step, and the
compat rows the provenance names (pure parts; tests/integration/test_supply.py runs them
against the registry with the real cosign, kustomize, docker-compose and kubernetes-validate)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from imgfab.errors import RecipeError, ValidationFailed
from imgfab.ops.select import HostGpu, Published, choose, choose_verified
from imgfab.recipe import load_recipe
from imgfab.render.context import RENDER_MARKER, render_context, write_context
from imgfab.stack.resolve import resolve
from imgfab.supply import bundle
from imgfab.supply.cosign import Trust, subject_digests
from imgfab.supply.publish import deciding_rows

from conftest import REPO

REF = "127.0.0.1:5000/llm/qwen2-7b"
DIGEST = "sha256:" + "d" * 64


def _rendered(matrix, image_ref=None):
    recipe = load_recipe(REPO / "recipes" / "qwen2-7b-h100.yaml")
    stack = resolve(recipe, matrix).stack
    return recipe, stack, render_context(recipe, stack, matrix, registry="127.0.0.1:5000",
                                         image_ref=image_ref)


def test_bundle_names_the_digest_everywhere(matrix):
    _, _, rendered = _rendered(matrix, image_ref=f"{REF}@{DIGEST}")
    files = bundle.bundle_files(rendered, f"{REF}@{DIGEST}", tag_ref=f"{REF}:t",
                                extra={"sbom.cdx.json": "{}\n"})
    assert sorted(files) == ["bundle.json", "compose.yaml", "k8s.yaml", "kustomization.yaml",
                             "run.sh", "sbom.cdx.json"]
    assert yaml.safe_load(files["compose.yaml"])["services"]["qwen2-7b-h100"]["image"] == f"{REF}@{DIGEST}"
    kustomization = yaml.safe_load(files["kustomization.yaml"])
    assert kustomization["images"] == [{"name": REF, "digest": DIGEST}]
    assert kustomization["resources"] == ["k8s.yaml"]
    assert json.loads(files["bundle.json"])["digest"] == DIGEST


def test_bundle_refuses_a_render_that_names_a_tag(matrix):
    _, _, rendered = _rendered(matrix)  # the pre-push render: REG/REPO:TAG
    with pytest.raises(ValidationFailed):
        bundle.bundle_files(rendered, f"{REF}@{DIGEST}", tag_ref=f"{REF}:t")
    with pytest.raises(ValidationFailed):
        bundle.bundle_files(rendered, f"{REF}:t", tag_ref=f"{REF}:t")


def test_a_new_render_keeps_the_last_pushed_bundle(matrix, tmp_path):
    _, _, rendered = _rendered(matrix)
    context = write_context(rendered, tmp_path / "ctx")
    _, _, pinned = _rendered(matrix, image_ref=f"{REF}@{DIGEST}")
    bundle.write_bundle(context, bundle.bundle_files(pinned, f"{REF}@{DIGEST}", tag_ref=f"{REF}:t"))
    write_context(rendered, context)  # imgfab render / build again, before the next push
    assert DIGEST in (context / "deploy" / "k8s.yaml").read_text()
    assert (context / "deploy" / RENDER_MARKER).is_file()
    # a directory that is not a render of ours carries nothing over, even with --force
    other = tmp_path / "other"
    (other / "deploy").mkdir(parents=True)
    (other / "deploy" / "x").write_text("x")
    write_context(rendered, other, force=True)
    assert not (other / "deploy").exists()


def test_trust_arguments():
    assert Trust(key="k.pub").args() == ["--key", "k.pub", "--insecure-ignore-tlog"]
    assert Trust(key="k.pub", tlog=True).args() == ["--key", "k.pub"]
    keyless = Trust(identity="https://github.com/o/r/.github/workflows/images.yml@refs/tags/v1",
                    issuer="https://token.actions.githubusercontent.com", tlog=True)
    assert keyless.args() == ["--certificate-identity", keyless.identity,
                              "--certificate-oidc-issuer", keyless.issuer]
    for bad in ({}, {"identity": "x"}, {"key": "k.pub", "identity": "x", "issuer": "y"}):
        with pytest.raises(RecipeError):
            Trust(**bad)


def test_subject_digests_reads_only_well_formed_subjects():
    statement = {"subject": [{"name": "x", "digest": {"sha256": "a" * 64}}, {"name": "y"}, "z"]}
    assert subject_digests(statement) == {"sha256:" + "a" * 64}
    assert subject_digests({"subject": "nope"}) == set()


def _published(matrix, tag: str, digest: str) -> Published:
    from imgfab.recipe import recipe_hash
    from imgfab.render.context import image_labels

    recipe, stack, _ = _rendered(matrix)
    labels = image_labels(recipe, stack, recipe_hash(recipe), "config.json")
    return Published(REF, tag, digest, copy.deepcopy(labels))


def test_select_takes_the_newest_fitting_candidate_that_verifies(matrix):
    images = [_published(matrix, "a", "sha256:" + "1" * 64), _published(matrix, "b", "sha256:" + "2" * 64)]
    host = HostGpu(driver="580.65.06", gpu="H100-SXM", compute_capability="9.0", platform="linux/amd64")
    checked = []

    def verify(image):
        checked.append(image.tag)
        return [] if image.tag == "a" else ["signature: none verifies with key k.pub"]

    best, candidates = choose_verified(images, host, verify)
    assert best is not None and best.image.tag == "a"
    by_tag = {c.image.tag: c for c in candidates}
    assert not by_tag["b"].fits and "signature: none verifies" in by_tag["b"].reason()
    assert checked == ["b", "a"]  # newest first (tag name breaks the tie), stops at the first pass
    # nothing verifies: no choice, every fitting candidate rejected with its reason
    best, candidates = choose_verified(images, host, lambda image: ["attestation cyclonedx: x"])
    assert best is None and all("attestation cyclonedx" in c.reason() for c in candidates)
    # without the trust step the same images are chosen by fit alone
    assert choose(images, host)[0] is not None


def test_a_candidate_that_does_not_fit_is_not_verified(matrix):
    images = [_published(matrix, "a", "sha256:" + "1" * 64)]
    host = HostGpu(driver="470.57.02", gpu="H100-SXM", compute_capability="9.0", platform="linux/amd64")
    calls = []
    best, _ = choose_verified(images, host, lambda image: calls.append(image) or [])
    assert best is None and calls == []


def test_the_rows_that_decided_the_stack_are_named_with_their_sources(matrix):
    recipe, stack, _ = _rendered(matrix)
    rows = deciding_rows(stack, matrix)
    named = {(r.file, r.key, r.version) for r in rows}
    assert ("compat/vllm.yaml", "vllm", stack.backend_version) in named
    assert ("compat/torch.yaml", "torch", stack.torch) in named
    assert ("compat/cuda.yaml", "cuda", stack.cuda) in named
    assert ("compat/gpus.yaml", "gpu", stack.gpu) in named
    assert all(r.source and len(r.sha256) == 64 for r in rows), rows
    assert rows == sorted(rows, key=lambda r: (r.file, r.key))

