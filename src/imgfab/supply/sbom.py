"""The SBOM of a pushed image: CycloneDX 1.6 JSON made with cyclonedx-python-lib, checked
against the CycloneDX 1.6 JSON schema (the library's strict validator: no unknown property)
before it is returned.

What it lists, each a component with a package URL (purl-spec v1.0.1,
package-url/purl-spec@v1.0.1:docs/types/definitions/{pypi,deb,oci}-definition.md):

- the image itself (``metadata.component``, ``container``): name ``REGISTRY/REPOSITORY``,
  version the tag, hash and ``pkg:oci/<last path part>@sha256:…?repository_url=…&tag=…``
  with the pushed digest;
- its runtime base (``container``) by digest, the same way;
- the distribution (``operating-system``) and every installed dpkg package (``library``,
  ``pkg:deb/<ID>/<name>@<version>?arch=<arch>&distro=<ID>-<VERSION_ID>``);
- every package of the payload lock (``library``, ``pkg:pypi/<name>@<version>``) with all
  its SHA-256 hashes (one per wheel file the lock allows);
- the probe imgfab copies into every image (``/opt/imgfab/imgfab``, ``application``).

The lock's installer (uv) is not listed: the builder stage installs it into /opt/imgfab/uv and
the runtime copies only the staged payload groups (templates/builder-vllm.j2, runtime.j2), so
it is not in the image; the provenance names it among the build's dependencies.

The graph is flat: the image depends on every other component. ``metadata.tools`` is imgfab.

Pure: the same inputs give the same bytes (sorted keys; the serial number is a UUID5 of the
image digest; the timestamp is the build's ``created`` time, never the clock's). The library
writes purls in its canonical form (``:`` and ``/`` left unescaped in versions and qualifier
values), which every purl parser reads like the escaped form.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timezone

from cyclonedx.model import HashAlgorithm, HashType, Property, XsUri
from cyclonedx.model import ExternalReference, ExternalReferenceType
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output import make_outputter
from cyclonedx.schema import OutputFormat, SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL

from imgfab import __version__
from imgfab.docker.registry_http import ImageRef
from imgfab.errors import ValidationFailed
from imgfab.payload.lockfile import Lock
from imgfab.render.context import Source
from imgfab.render.source import public_url
from imgfab.supply.dpkg import distro, installed_packages

# UUID5 namespace of imgfab's SBOM serial numbers (a name under it: the image digest).
SERIAL_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/imgfab/imgfab/sbom")
IN_IMAGE_PATH = "/opt/imgfab/imgfab"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _failed(message: str, fix: str) -> ValidationFailed:
    return ValidationFailed(message, field="sbom", fix=fix)


def _created(created: str) -> datetime:
    try:
        moment = datetime.fromisoformat(created)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise _failed(f"created {created!r} is not an RFC 3339 time with a zone",
                      "pass the build's created time, e.g. 2026-01-31T12:00:00Z")
    return moment.astimezone(timezone.utc)


def _oci_purl(ref: ImageRef) -> PackageURL:
    qualifiers = {"repository_url": ref.name}
    if ref.tag:
        qualifiers["tag"] = ref.tag
    return PackageURL("oci", name=ref.repository.rsplit("/", 1)[-1], version=ref.digest,
                      qualifiers=qualifiers)


def _container(ref: ImageRef, what: str) -> Component:
    if not ref.digest or not _DIGEST.fullmatch(ref.digest):
        raise _failed(f"the {what} {ref.name} has no sha256 digest",
                      f"pass the {what} as host/repository[:tag]@sha256:<64 hex>")
    purl = _oci_purl(ref)
    return Component(type=ComponentType.CONTAINER, name=ref.name, version=ref.tag or ref.digest,
                     bom_ref=purl.to_string(), purl=purl,
                     hashes=[HashType(alg=HashAlgorithm.SHA_256, content=ref.digest.split(":", 1)[1])])


def _python_packages(lock: Lock) -> list[Component]:
    if lock.refused or lock.unhashed or not lock.packages:
        why = (f"it was refused ({lock.refused})" if lock.refused else
               f"{', '.join(lock.unhashed)} have no hashes" if lock.unhashed else "it pins no package")
        raise _failed(f"the lock cannot describe a built image: {why}", "pass the lock the image was built from")
    components = []
    for name, (version, hashes) in sorted(lock.packages.items()):
        purl = PackageURL("pypi", name=name, version=version)
        components.append(Component(
            type=ComponentType.LIBRARY, name=name, version=version, bom_ref=purl.to_string(), purl=purl,
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=h.split(":", 1)[1]) for h in sorted(hashes)]))
    return components


def _os_packages(dpkg_status: str, os_release: str) -> list[Component]:
    release = distro(os_release)
    system = Component(type=ComponentType.OPERATING_SYSTEM, name=release.id,
                       version=release.version_id or release.codename, bom_ref=f"os:{release.qualifier}")
    components = [system]
    for package in installed_packages(dpkg_status):
        purl = PackageURL("deb", namespace=release.id, name=package.name.lower(), version=package.version,
                          qualifiers={"arch": package.arch, "distro": release.qualifier})
        components.append(Component(type=ComponentType.LIBRARY, name=package.name, version=package.version,
                                    bom_ref=purl.to_string(), purl=purl))
    return components


def _image(image: ImageRef, lock: Lock, source: Source | None) -> Component:
    if not image.tag:
        raise _failed(f"the image {image.name} has no tag", "pass the pushed image as host/repository:tag@sha256:…")
    component = _container(image, "image")
    component.properties.add(Property(name="imgfab:lock.fingerprint", value=lock.fingerprint))
    url = public_url(source.url) if source and source.url else ""
    if url:
        component.external_references.add(ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(url)))
    if source and source.revision:
        component.properties.add(Property(name="imgfab:source.revision", value=source.revision))
    return component


def validate_sbom(text: str) -> None:
    """Check ``text`` against the CycloneDX 1.6 JSON schema (strict: no unknown property).
    Raises ValidationFailed naming the first violation."""
    try:
        error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    except ValueError as exc:  # not JSON at all
        raise _failed(f"the SBOM is not JSON: {exc}", "build it with build_sbom") from exc
    if error is not None:
        detail = getattr(error.data, "message", str(error))
        raise _failed(f"the SBOM breaks the CycloneDX 1.6 schema: {detail}", "fix the SBOM builder")


def build_sbom(*, image: ImageRef, base: ImageRef, lock_text: str, dpkg_status: str, os_release: str,
               created: str, source: Source | None = None, imgfab_version: str = __version__) -> str:
    """The CycloneDX 1.6 JSON text of a pushed image's SBOM, schema-checked.

    ``image``: the pushed image, ``ImageRef.parse("host/repo:tag@sha256:…")`` (tag and digest
    required). ``base``: the runtime base as built, pinned (``…/nvidia/cuda:12.8.2-base-ubuntu24.04@sha256:…``).
    ``lock_text``: the payload lock the image was built from (``recipes/<name>.lock``).
    ``dpkg_status`` / ``os_release``: the texts of the image's ``/var/lib/dpkg/status`` and
    ``/etc/os-release``. ``created``: the build's created time (RFC 3339 with a zone: the
    ``org.opencontainers.image.created`` label). ``source``: the checkout (its URL becomes a
    ``vcs`` reference, its revision a property), when known.

    Raises ValidationFailed (one line) for an input that cannot describe a built image (no
    digest, a refused or unhashed lock, an unfinished dpkg state) or a document the schema rejects.
    """
    lock = Lock.parse(lock_text)
    subject = _image(image, lock, source)
    parts: list[Component] = [_container(base, "base image"), *_python_packages(lock),
                              *_os_packages(dpkg_status, os_release)]
    parts.append(Component(type=ComponentType.APPLICATION, name="imgfab", version=imgfab_version,
                           bom_ref="imgfab-in-image", description="the probe and its rules, run at start",
                           properties=[Property(name="imgfab:path", value=IN_IMAGE_PATH)]))
    tool = Component(type=ComponentType.APPLICATION, name="imgfab", version=imgfab_version, bom_ref="imgfab-tool")
    bom = Bom(serial_number=uuid.uuid5(SERIAL_NAMESPACE, str(image.digest)),
              metadata=BomMetaData(timestamp=_created(created), component=subject,
                                   tools=ToolRepository(components=[tool])))
    bom.components.update(parts)
    bom.register_dependency(subject, parts)
    text = make_outputter(bom, OutputFormat.JSON, SchemaVersion.V1_6).output_as_string()
    text = json.dumps(json.loads(text), sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    validate_sbom(text)
    return text

