"""The deploy bundle of a pushed image: ``<context>/deploy/``, every artifact pinned by digest.

After a push, the context is rendered again with the run artifacts naming
``REGISTRY/REPO@sha256:…``, exactly the digest the registry returned; the bundle holds them
(``run.sh``, ``compose.yaml``, ``k8s.yaml``), a ``kustomization.yaml`` whose ``images:`` entry
names that digest, the SBOM, the provenance statement, the ``ClusterImagePolicy`` when the image
is signed, and ``bundle.json`` saying what is where. A new render of the context keeps the
bundle (:data:`imgfab.render.context.KEPT_DIRS`); a new push replaces it whole, atomically.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from imgfab.errors import ValidationFailed
from imgfab.render.context import write_context

RUN_ARTIFACTS = ("run.sh", "compose.yaml", "k8s.yaml")
DIRECTORY = "deploy"


def kustomization(digest_ref: str) -> str:
    """``kustomization.yaml`` over ``k8s.yaml`` whose ``images:`` entry pins ``digest_ref``'s
    repository to its digest (kustomize matches the name without tag or digest)."""
    name, _, digest = digest_ref.partition("@")
    document = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "resources": ["k8s.yaml"], "images": [{"name": name, "digest": digest}]}
    return "# Rendered by imgfab: the pushed digest, as the registry returned it.\n" + \
        yaml.safe_dump(document, sort_keys=False)


def bundle_files(rendered: dict[str, str], digest_ref: str, *, tag_ref: str,
                 extra: dict[str, str] | None = None) -> dict[str, str]:
    """The bundle's files: the run artifacts of ``rendered`` (a context rendered with
    ``image_ref=digest_ref``), the kustomization, ``extra`` (SBOM, provenance, policy) and
    ``bundle.json``. Raises :class:`ValidationFailed` if a run artifact does not name
    ``digest_ref`` (the render was not made for this digest)."""
    if "@sha256:" not in digest_ref:
        raise ValidationFailed(f"{digest_ref} is not a digest reference", field="deploy",
                               fix="write the bundle from the digest the push returned")
    files = {name: rendered[name] for name in RUN_ARTIFACTS}
    for name, text in files.items():
        if digest_ref not in text:
            raise ValidationFailed(f"the bundle's {name} does not name {digest_ref}",
                                   field="deploy", fix="render the bundle with image_ref set")
    files["kustomization.yaml"] = kustomization(digest_ref)
    files |= extra or {}
    files["bundle.json"] = json.dumps({
        "image": digest_ref, "digest": digest_ref.split("@", 1)[1], "tag": tag_ref,
        "files": sorted(files)}, indent=2, sort_keys=True) + "\n"
    return files


def write_bundle(context: Path, files: dict[str, str]) -> Path:
    """Write ``files`` to ``context/deploy`` atomically (the previous bundle is replaced
    whole, or kept when anything fails); returns the directory."""
    return write_context(files, Path(context) / DIRECTORY)
