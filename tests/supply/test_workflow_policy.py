"""`imgfab ci github --policy` (issue 37, item 4): the keyless ClusterImagePolicy of what the
workflow's release job signs, validated against the policy-controller CRD as the keyed
policies are (test_policy), with the identity checked by hand-written subjects."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from imgfab.errors import RecipeError
from imgfab.supply.policy import KeylessAuthority, cluster_image_policy
from test_policy import _admission_errors, _as_version, _errors, _served_versions

ISSUER = "https://token.actions.githubusercontent.com"
RECIPE = REPO / "recipes" / "qwen2-7b-h100.yaml"


def _ci_github(tmp_path, *args):
    (tmp_path / "recipes").mkdir(exist_ok=True)
    shutil.copy(RECIPE, tmp_path / "recipes" / RECIPE.name)
    shutil.copy(RECIPE.with_suffix(".lock"), tmp_path / "recipes" / RECIPE.with_suffix(".lock").name)
    return subprocess.run([sys.executable, "-m", "imgfab.cli", "ci", "github", "--imgfab-version",
                           "0.9.1", "--imgfab-sha256", "ab" * 32, *args],
                          capture_output=True, text=True, cwd=tmp_path)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[list[dict], str]:
    root = tmp_path_factory.mktemp("models")
    result = _ci_github(root, "--repository", "acme/models", "--policy", "policy.yaml")
    assert result.returncode == 0, result.stderr
    text = (root / "policy.yaml").read_text(encoding="utf-8")
    return list(yaml.safe_load_all(text)), result.stdout


def test_the_policy_names_the_release_jobs_identity(written):
    (document,), _ = written
    spec = document["spec"]
    # ghcr.io: the workflow promotes to ghcr.io/<owner, lower-cased>/<image.repository>
    assert spec["images"] == [{"glob": "ghcr.io/acme/llm/qwen2-7b@*"},
                              {"glob": "ghcr.io/acme/llm/qwen2-7b:*"}]
    for authority in spec["authorities"]:
        (identity,) = authority["keyless"]["identities"]
        assert identity == {
            "issuer": ISSUER,
            "subjectRegExp": r"^https://github\.com/acme/models/\.github/workflows/images\.yml@refs/tags/v.+$"}
        assert authority["keyless"]["url"] == "https://fulcio.sigstore.dev"
        assert authority["signatureFormat"] == "legacy"  # cosign 2.5 signs in the legacy format


def test_the_subject_regexp_admits_tags_of_this_workflow_only(written):
    (document,), _ = written
    pattern = re.compile(document["spec"]["authorities"][0]["keyless"]["identities"][0]["subjectRegExp"])
    assert pattern.search("https://github.com/acme/models/.github/workflows/images.yml@refs/tags/v1.2.3")
    for subject in ("https://github.com/acme/models/.github/workflows/images.yml@refs/heads/main",
                    "https://github.com/acme/models-evil/.github/workflows/images.yml@refs/tags/v1",
                    "https://github.com/acme/modelsX.github/workflows/images.yml@refs/tags/v1",
                    "https://github.com/evil/acme/models/.github/workflows/images.yml@refs/tags/v1",
                    "https://github.com/acme/models/.github/workflows/other.yml@refs/tags/v1",
                    "https://github.com/acme/models/.github/workflows/images.yml@refs/tags/1.0",
                    "https://github.com/acme/models/.github/workflows/images.yml@refs/tags/v1\nx"):
        assert not pattern.search(subject), subject


def test_the_workflow_verifies_an_identity_the_policy_admits(written):
    """The release job's cosign verify identity, as Actions fills it in for a v* tag, matches
    the policy's regexp: the workflow and the cluster agree on who signed."""
    (document,), stdout = written
    pattern = re.compile(document["spec"]["authorities"][0]["keyless"]["identities"][0]["subjectRegExp"])
    release = yaml.safe_load(stdout)["jobs"]["release"]
    (step,) = [s for s in release["steps"] if "cosign verify" in s.get("run", "")]
    assert '--certificate-identity "$IDENTITY"' in step["run"]
    assert f"--certificate-oidc-issuer {ISSUER}" in step["run"]
    identity = (step["env"]["IDENTITY"].replace("${{ github.server_url }}", "https://github.com")
                .replace("${{ github.repository }}", "acme/models")
                .replace("${{ github.ref }}", "refs/tags/v1.2.3"))
    assert identity == "https://github.com/acme/models/.github/workflows/images.yml@refs/tags/v1.2.3"
    assert pattern.search(identity)


@pytest.mark.parametrize("version", _served_versions(), ids=lambda version: version["name"])
def test_the_written_policy_validates_against_the_crd(written, version):
    for document in written[0]:
        assert _errors(_as_version(document, version), version) == []
        assert _admission_errors(document["spec"]) == []


def test_another_registry_and_one_policy_per_image_repository(tmp_path):
    shutil.copytree(REPO / "recipes", tmp_path / "recipes")
    result = _ci_github(tmp_path, "--registry", "registry.example:5000/team", "--repository",
                        "Acme/models", "--policy", "p.yaml")
    assert result.returncode == 0, result.stderr
    globs = [d["spec"]["images"][0]["glob"]
             for d in yaml.safe_load_all((tmp_path / "p.yaml").read_text())]
    assert globs == sorted(globs) and len(globs) == len(set(globs)) >= 2
    assert "registry.example:5000/team/llm/qwen2-7b@*" in globs
    assert all(g.startswith("registry.example:5000/team/") for g in globs)


@pytest.mark.parametrize("args, field", [
    (("--policy", "p.yaml"), "--repository"),
    (("--repository", "acme", "--policy", "p.yaml"), "--repository"),
    (("--repository", "acme/mo dels", "--policy", "p.yaml"), "--repository"),
    (("--repository", "acme/..", "--policy", "p.yaml"), "--repository"),
    (("--repository", "acme/models", "--policy", "no/such/dir/p.yaml"), "--policy"),
])
def test_policy_refusals_are_one_line_and_write_nothing(tmp_path, args, field):
    result = _ci_github(tmp_path, *args)
    assert result.returncode in (1, 2) and result.stdout == "", result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"imgfab: {field}: ") and "; fix: " in line
    assert not (tmp_path / "p.yaml").exists()


def test_keyless_identity_takes_one_subject_form_anchored():
    for authority in (KeylessAuthority(ISSUER),
                      KeylessAuthority(ISSUER, "s", subject_regexp="^s$"),
                      KeylessAuthority(ISSUER, subject_regexp="https://github.com/acme/.+"),
                      KeylessAuthority(ISSUER, subject_regexp="^https://(github.com$")):
        with pytest.raises(RecipeError):
            cluster_image_policy("r.example/llm/x", authority)
