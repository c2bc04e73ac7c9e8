"""The admission policy of what ``imgfab ci github``'s workflow signs.

The workflow's release job signs each promoted image keylessly: its Fulcio certificate carries
the OIDC issuer of GitHub Actions and, as subject, the workflow file at the tag it ran from
(``https://github.com/OWNER/NAME/.github/workflows/images.yml@refs/tags/v1.2.3``).
:func:`workflow_policies` writes one Sigstore ``ClusterImagePolicy`` per image repository the
release job promotes to (:func:`~imgfab.supply.policy.cluster_image_policy`), admitting only
images signed by that identity at a ``v*`` tag
(:func:`~imgfab.render.ci.signer_identity_regexp`): not a branch, not another repository.
"""

from __future__ import annotations

from imgfab.render.ci import ISSUER, signer_identity_regexp
from imgfab.supply.policy import KeylessAuthority, cluster_image_policy

# cosign 2.5 (the release the workflow installs, render.ci.COSIGN_RELEASE) signs and attests
# in the legacy format unless told --new-bundle-format.
SIGNATURE_FORMAT = "legacy"


def workflow_authority(repository: str) -> KeylessAuthority:
    """The release job of the workflow in GitHub repository ``repository`` (``OWNER/NAME``,
    checked by :func:`~imgfab.render.ci_values.check_repository`) at any ``v*`` tag."""
    return KeylessAuthority(ISSUER, subject_regexp=signer_identity_regexp(repository),
                            signature_format=SIGNATURE_FORMAT)


def promoted_registry(registry: str, repository: str) -> str:
    """Where the release job promotes to: GHCR under the repository owner, lower-cased (as the
    workflow's own GHCR step writes IMGFAB_REGISTRY), any other registry as given."""
    return f"ghcr.io/{repository.split('/', 1)[0].lower()}" if registry == "ghcr.io" else registry


def workflow_policies(repository: str, registry: str, image_repositories: list[str]) -> str:
    """The ``ClusterImagePolicy`` documents (YAML, ``---`` between them, sorted) of every image
    repository (``image.repository`` of each recipe released, e.g. ``llm/qwen2-7b``) under
    ``registry`` as the workflow pushes it. RecipeError for a repository the policy-controller
    cannot name."""
    authority = workflow_authority(repository)
    base = promoted_registry(registry, repository)
    documents = [cluster_image_policy(f"{base}/{name}", authority)
                 for name in sorted(set(image_repositories))]
    return "---\n".join(documents)

