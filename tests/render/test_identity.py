"""The image's identity: a tag never names two different builds (issue 18).

The tag is the readable stack part plus a fingerprint of every file the image is built from
and of the base images as the build uses them; the run artifacts name the fully qualified
reference; the OCI labels carry real values from fixed inputs.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess

import pytest
import yaml

from imgfab.recipe import parse_recipe
from imgfab.render.context import (NAMING_FILES, Source, context_image, image_identity,
                                   render_context, stack_tag)
from imgfab.render.source import public_url, source_of
from imgfab.stack.resolve import resolve

from conftest import REPO

BASE = yaml.safe_load((REPO / "recipes" / "llama31-8b-l4.yaml").read_text())


def _render(matrix, data=None, **kwargs) -> dict[str, str]:
    recipe = parse_recipe(copy.deepcopy(data or BASE))
    return render_context(recipe, resolve(recipe, matrix).stack, matrix, **kwargs)


def _changed(section: str, key: str, value) -> dict:
    data = copy.deepcopy(BASE)
    data[section][key] = value
    return data


def test_tag_is_the_stack_part_and_a_fingerprint(matrix):
    files = _render(matrix)
    image = context_image(files)
    recipe = parse_recipe(copy.deepcopy(BASE))
    assert re.fullmatch(r"[0-9a-f]{12}", image["identity"])
    assert image["tag"] == f"{stack_tag(resolve(recipe, matrix).stack)}-{image['identity']}"
    assert image["ref"] == f"{recipe.image.repository}:{image['tag']}"
    # the image says its own tag and its readable version
    labels = json.loads(files["image.json"])
    assert labels["org.opencontainers.image.ref.name"] == image["tag"]
    assert labels["org.opencontainers.image.version"] == image["tag"].rsplit("-", 1)[0]
    assert f'org.opencontainers.image.ref.name="{image["tag"]}"' in files["Dockerfile"]


@pytest.mark.parametrize(("section", "key", "value"), [
    ("serve", "max_model_len", 4096),   # the collision: a serving change
    ("serve", "port", 8001),
    ("model", "revision", "1" * 40),     # another model revision
    ("model", "license", "MIT"),        # a label
])
def test_recipes_that_differ_in_one_setting_get_different_tags(matrix, section, key, value):
    first, second = _render(matrix), _render(matrix, _changed(section, key, value))
    assert context_image(first)["tag"] != context_image(second)["tag"]
    assert context_image(first)["tag"].rsplit("-", 1)[0] == context_image(second)["tag"].rsplit("-", 1)[0]


def test_the_bases_as_built_are_part_of_the_identity(matrix):
    recipe = parse_recipe(copy.deepcopy(BASE))
    stack = resolve(recipe, matrix).stack
    plain = {"BUILDER_IMAGE": stack.builder_image, "RUNTIME_IMAGE": stack.runtime_image}
    pinned = {k: f"mirror.example/{v}@sha256:{'a' * 64}" for k, v in plain.items()}
    tags = {context_image(_render(matrix, bases=b))["tag"] for b in (None, plain, pinned)}
    assert len(tags) == 2  # None means the Dockerfile's defaults: the plain refs
    labels = json.loads(_render(matrix, bases=pinned)["image.json"])
    assert labels["org.opencontainers.image.base.name"] == f"mirror.example/{stack.runtime_image}"
    assert labels["org.opencontainers.image.base.digest"] == f"sha256:{'a' * 64}"
    assert "org.opencontainers.image.base.digest" not in json.loads(_render(matrix)["image.json"])


def test_where_the_image_is_pushed_is_not_what_it_is(matrix):
    """The registry changes the run artifacts (naming files), never the tag."""
    local, remote = _render(matrix), _render(matrix, registry="registry.example:5000/team")
    assert context_image(local)["tag"] == context_image(remote)["tag"]
    assert {n for n in local if local[n] != remote[n]} <= set(NAMING_FILES)
    ref = context_image(remote)["ref"]
    assert ref == f"registry.example:5000/team/{BASE['image']['repository']}:{context_image(remote)['tag']}"
    for name in ("run.sh", "compose.yaml", "k8s.yaml"):
        assert ref in remote[name], name
        assert f"{BASE['image']['repository']}:" not in remote[name].replace(ref, ""), name
    digest_ref = f"registry.example:5000/team/{BASE['image']['repository']}@sha256:{'b' * 64}"
    pinned = _render(matrix, registry="registry.example:5000/team", image_ref=digest_ref)
    assert all(digest_ref in pinned[n] for n in ("run.sh", "compose.yaml", "k8s.yaml"))


def test_identity_covers_every_build_file_and_no_naming_file():
    files = {"Dockerfile": "FROM x\n", "entrypoint.sh": "exec a\n", "run.sh": "docker run x\n"}
    base = image_identity(files)
    assert image_identity(files | {"run.sh": "docker run y\n"}) == base
    assert image_identity(files | {"entrypoint.sh": "exec b\n"}) != base
    assert image_identity(files | {"imgfab/extra.py": ""}) != base
    assert image_identity(files, {"RUNTIME_IMAGE": "a"}) != image_identity(files, {"RUNTIME_IMAGE": "b"})


def test_source_labels_come_from_the_source(matrix):
    source = Source(url="https://git.example/team/recipes", revision="c" * 40,
                    created="2026-12-01T00:00:00Z")
    labels = json.loads(_render(matrix, source=source)["image.json"])
    assert labels["org.opencontainers.image.source"] == source.url
    assert labels["org.opencontainers.image.revision"] == source.revision
    assert labels["org.opencontainers.image.created"] == source.created
    assert labels["org.opencontainers.image.licenses"] == BASE["model"]["license"]
    assert _render(matrix, source=source) == _render(matrix, source=source)  # byte-identical
    assert context_image(_render(matrix, source=source))["tag"] != context_image(_render(matrix))["tag"]


@pytest.mark.parametrize(("url", "public"), [
    ("https://user:token@git.example/team/recipes.git", "https://git.example/team/recipes"),
    ("git@github.com:owner/repo.git", "https://github.com/owner/repo"),
    ("ssh://git@git.example:2222/team/recipes.git", "https://git.example:2222/team/recipes"),
    ("/srv/git/recipes", ""),
    ("file:///srv/git/recipes", ""),
])
def test_public_url_never_carries_credentials(url, public):
    assert public_url(url) == public


def _git(cwd, *args):
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example",
                        "GIT_AUTHOR_DATE": "1764547200 +0000",
                        "GIT_COMMITTER_DATE": "1764547200 +0000", "PATH": "/usr/bin:/bin"})


def test_source_of_a_checkout_is_fixed_by_its_commit(tmp_path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert source_of(tmp_path / "r.yaml") == Source()  # not a checkout: nothing
    _git(tmp_path, "init", "-q")
    (tmp_path / "r.yaml").write_text("name: x\n")
    _git(tmp_path, "add", "r.yaml")
    _git(tmp_path, "commit", "-qm", "r")
    _git(tmp_path, "remote", "add", "origin", "https://ci:secret@git.example/team/recipes.git")
    source = source_of(tmp_path / "r.yaml")
    assert re.fullmatch(r"[0-9a-f]{40}", source.revision)
    assert source.url == "https://git.example/team/recipes"
    assert source.created == "2025-12-01T00:00:00Z"  # the commit's time, not the clock's
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert source_of(tmp_path / "r.yaml").created == "2023-11-14T22:13:20Z"


@pytest.mark.parametrize("bad", ["Apache 2.0", "(MIT OR Apache-2.0)", "MIT;rm", ""])
def test_a_license_that_is_not_spdx_is_refused_naming_the_field(bad):
    from imgfab.errors import RecipeError

    with pytest.raises(RecipeError) as caught:
        parse_recipe(_changed("model", "license", bad))
    assert caught.value.field == "model.license" and "SPDX" in caught.value.message
