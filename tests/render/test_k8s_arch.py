"""Issue 35 (the right architecture): every node-affinity term of every rendered k8s.yaml names
the image's CPU architecture, ``kubernetes.io/arch In [amd64]``. Kubernetes ORs the terms of
``nodeSelectorTerms``, so a single term without it would admit a GH200 node (a Hopper GPU that
passes the H100 rules, on an arm64 Grace CPU) and the pod would die with ``exec format error``.

Walks every object of every example recipe's k8s.yaml (each engine strategy) and of the 405B
LeaderWorkerSet (leader and worker pods), wherever an affinity sits.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import yaml

from imgfab.errors import RecipeError
from test_artifacts import CASES, IDS, _gfd_node, _node_matches, _placement, _render
from test_multinode import _render as _render_405b

from conftest import REPO

ARCH = {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}


def _affinities(node: Any, path: str = "") -> Iterator[tuple[str, dict]]:
    """Every ``affinity`` mapping under ``node``, with where it sits."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "affinity" and isinstance(value, dict):
                yield f"{path}.affinity", value
            yield from _affinities(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _affinities(value, f"{path}[{index}]")


def _pod_specs(node: Any) -> int:
    """How many pod specs (a mapping with ``containers``) sit under ``node``."""
    if isinstance(node, dict):
        return ("containers" in node) + sum(_pod_specs(v) for v in node.values())
    if isinstance(node, list):
        return sum(_pod_specs(v) for v in node)
    return 0


def _terms(affinity: dict) -> list[tuple[str, dict]]:
    """Every node-selector term of an affinity: the required ones and the preferred ones."""
    node = affinity.get("nodeAffinity") or {}
    required = (node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms") or []
    preferred = [p["preference"] for p in node.get("preferredDuringSchedulingIgnoredDuringExecution") or []]
    return [("required", t) for t in required] + [("preferred", t) for t in preferred]


def _check_every_term(k8s_yaml: str) -> int:
    """Assert each pod spec has an affinity and each of its terms carries ARCH; the term count."""
    checked = 0
    for doc in (d for d in yaml.safe_load_all(k8s_yaml) if d):
        affinities = list(_affinities(doc))
        assert len(affinities) == _pod_specs(doc), (doc["kind"], [p for p, _ in affinities])
        for where, affinity in affinities:
            terms = _terms(affinity)
            assert terms, f"{doc['kind']} {where}: no node-selector term"
            for kind, term in terms:
                expressions = term.get("matchExpressions") or []
                arch = [e for e in expressions if e.get("key") == "kubernetes.io/arch"]
                assert arch == [ARCH], f"{doc['kind']} {where} ({kind} term): {expressions}"
                checked += 1
    return checked


@pytest.mark.parametrize(("name", "strategy"), CASES, ids=IDS)
def test_every_affinity_term_names_the_architecture(name, strategy, matrix, tmp_path):
    _, _, files = _render(name, strategy, matrix, tmp_path / "ctx")
    assert _check_every_term(files["k8s.yaml"]) >= 1


def test_every_leaderworkerset_term_names_the_architecture(tmp_path):
    _, _, files = _render_405b(tmp_path)
    kinds = [d["kind"] for d in yaml.safe_load_all(files["k8s.yaml"]) if d]
    assert "LeaderWorkerSet" in kinds
    assert _check_every_term(files["k8s.yaml"]) >= 2  # the leader's and the worker's


def test_a_gh200_node_gets_no_amd64_pod(matrix, tmp_path):
    """The issue's case: a GH200 node's GPU labels pass the H100 recipe's rules; its arch does not."""
    data = yaml.safe_load((REPO / "recipes" / "qwen2-7b-h100.yaml").read_text())
    terms, _ = _placement(data, matrix, tmp_path)
    gh200 = _gfd_node("9.0", 97871, 1, "NVIDIA-GH200-480GB", arch="arm64")  # nvidia-smi's 97871 MiB
    assert not _node_matches(terms, gh200)
    assert _node_matches(terms, dict(gh200, **{"kubernetes.io/arch": "amd64"}))  # only the arch refuses


def test_the_arch_term_comes_from_the_image_label():
    from imgfab.render.placement import platform_terms

    assert platform_terms({"org.imgfab.platform": "linux/arm64"}) == [
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}]
    for bad in ({}, {"org.imgfab.platform": "amd64"}, {"org.imgfab.platform": "windows/amd64"},
                {"org.imgfab.platform": "linux/"}):
        with pytest.raises(ValueError, match="kubernetes.io/arch"):
            platform_terms(bad)


def test_a_render_without_the_platform_label_is_refused(matrix, monkeypatch):
    """No label, no placement: never a term without the architecture."""
    from imgfab.recipe import load_recipe
    from imgfab.render import context
    from imgfab.stack.resolve import resolve

    labels = context.image_labels
    monkeypatch.setattr(context, "image_labels", lambda *a, **k: {
        k2: v for k2, v in labels(*a, **k).items() if k2 != "org.imgfab.platform"})
    recipe = load_recipe(REPO / "recipes" / "qwen2-7b-h100.yaml")
    with pytest.raises(RecipeError, match="org.imgfab.platform"):
        context.render_context(recipe, resolve(recipe, matrix).stack, matrix)
