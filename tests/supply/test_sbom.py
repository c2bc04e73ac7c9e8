"""The SBOM builder (imgfab.supply.sbom) and the dpkg/os-release readers (imgfab.supply.dpkg).

Inputs are the real lock recipes/qwen2-7b-h100.lock and tests/fixtures/supply/dpkg-status: 21
stanzas of a Debian bookworm machine's /var/lib/dpkg/status as they were (long descriptions,
conffiles, epochs, ``+`` in names and versions), plus a libc6:i386 copy of libc6:amd64 (a
multi-arch package installed twice) and netbase in ``deinstall ok config-files`` (removed,
its conffiles left: not in the image).
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL

from imgfab.docker.registry_http import ImageRef
from imgfab.errors import ValidationFailed
from imgfab.payload.lockfile import Lock
from imgfab.render.context import Source
from imgfab.supply import sbom as sbom_module
from imgfab.supply.dpkg import distro, installed_packages
from imgfab.supply.sbom import SERIAL_NAMESPACE, build_sbom, validate_sbom

from conftest import REPO

LOCK = REPO / "recipes" / "qwen2-7b-h100.lock"
DPKG = (REPO / "tests" / "fixtures" / "supply" / "dpkg-status").read_text(encoding="utf-8")
IMAGE = "127.0.0.1:5000/imgfab/qwen2-7b-h100:vllm0.19.1-torch2.10.0-cu12.8-h100-0123456789ab@sha256:" + "a1" * 32
BASE = "127.0.0.1:5001/hub/nvidia/cuda:12.8.2-base-ubuntu24.04@sha256:" + "b2" * 32
CREATED = "2026-01-31T12:00:00Z"
DEBIAN = """PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://www.debian.org/"
"""
UBUNTU = """PRETTY_NAME="Ubuntu 24.04.2 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.2 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
UBUNTU_CODENAME=noble
LOGO=ubuntu-logo
"""


def _sbom(**changes) -> str:
    inputs = dict(image=ImageRef.parse(IMAGE), base=ImageRef.parse(BASE), lock_text=LOCK.read_text(),
                  dpkg_status=DPKG, os_release=DEBIAN, created=CREATED)
    return build_sbom(**(inputs | changes))


@pytest.fixture(scope="module")
def document() -> dict:
    return json.loads(_sbom())


def _components(document: dict, purl_type: str) -> dict[str, dict]:
    return {c["purl"]: c for c in document["components"] if c.get("purl", "").startswith(f"pkg:{purl_type}/")}


def test_every_locked_package_with_its_version_and_every_hash(document):
    lock = Lock.parse(LOCK.read_text())
    # Read independently of Lock.parse too: every "--hash=" below the header belongs to a package.
    body = LOCK.read_text().split("\n\n", 1)[1]
    assert len(lock.packages) == len(re.findall(r"^\S+==", body, re.M)) > 150
    listed = {c["name"]: c for c in _components(document, "pypi").values()}
    assert sorted(listed) == sorted(lock.packages)
    for name, (version, hashes) in lock.packages.items():
        component = listed[name]
        assert component["version"] == version
        assert component["purl"] == PackageURL("pypi", name=name, version=version).to_string()
        assert component["type"] == "library"
        assert sorted(f"sha256:{h['content']}" for h in component["hashes"]) == sorted(hashes)
        assert {h["alg"] for h in component["hashes"]} == {"SHA-256"}
    assert sum(len(c["hashes"]) for c in listed.values()) == len(re.findall(r"--hash=sha256:", body))
    assert any(len(c["hashes"]) > 1 for c in listed.values())  # some pins allow several wheels


def test_the_installer_is_not_an_image_component(document):
    # uv is installed into /opt/imgfab/uv in the builder stage; the runtime copies only the payload.
    assert Lock.parse(LOCK.read_text()).installer.startswith("uv==")
    assert not [c for c in document["components"] if c["name"] == "uv"]


def test_the_library_validator_accepts_it():
    text = _sbom()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    assert json.loads(text)["specVersion"] == "1.6"


@pytest.mark.parametrize("break_it", [
    lambda d: d["components"][0]["hashes"][0].update(content="not-hex"),
    lambda d: d.update(serialNumber="not-a-urn"),
    lambda d: d["metadata"]["component"].update(type="docker-image"),
    lambda d: d["components"][0].update(checksum="unknown property"),
], ids=["hash content", "serial number", "component type", "unknown property"])
def test_the_validator_rejects_a_broken_document(break_it):
    document = json.loads(_sbom())
    document["components"].sort(key=lambda c: "hashes" not in c)  # a hashed component first
    break_it(document)
    text = json.dumps(document)
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is not None
    with pytest.raises(ValidationFailed, match="CycloneDX 1.6 schema"):
        validate_sbom(text)


def test_build_sbom_refuses_what_the_schema_rejects(monkeypatch):
    class Broken:
        def __init__(self, *_):
            pass

        def output_as_string(self):
            return json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "version": "one"})

    monkeypatch.setattr(sbom_module, "make_outputter", Broken)
    with pytest.raises(ValidationFailed, match="CycloneDX 1.6 schema") as caught:
        _sbom()
    assert "\n" not in caught.value.one_line()


def test_deb_purls_from_the_fixture(document):
    debs = _components(document, "deb")
    assert len(debs) == 21
    for purl in ("pkg:deb/debian/libc6@2.36-9%2Bdeb12u14?arch=amd64&distro=debian-12",
                 "pkg:deb/debian/libc6@2.36-9%2Bdeb12u14?arch=i386&distro=debian-12",
                 "pkg:deb/debian/gcc@4:12.2.0-3?arch=amd64&distro=debian-12",
                 "pkg:deb/debian/tzdata@2025b-0%2Bdeb12u2?arch=all&distro=debian-12",
                 "pkg:deb/debian/libstdc%2B%2B6@12.2.0-14%2Bdeb12u1?arch=amd64&distro=debian-12"):
        assert purl in debs, sorted(debs)
    parsed = PackageURL.from_string("pkg:deb/debian/libstdc%2B%2B6@12.2.0-14%2Bdeb12u1?arch=amd64&distro=debian-12")
    assert (parsed.namespace, parsed.name, parsed.version) == ("debian", "libstdc++6", "12.2.0-14+deb12u1")
    assert debs[parsed.to_string()]["name"] == "libstdc++6"
    assert debs[parsed.to_string()]["version"] == "12.2.0-14+deb12u1"
    system = [c for c in document["components"] if c["type"] == "operating-system"]
    assert [(c["name"], c["version"]) for c in system] == [("debian", "12")]


def test_ubuntu_bases_get_ubuntu_purls():
    debs = _components(json.loads(_sbom(os_release=UBUNTU)), "deb")
    assert "pkg:deb/ubuntu/bash@5.2.15-2%2Bb8?arch=amd64&distro=ubuntu-24.04" in debs
    assert all(PackageURL.from_string(p).qualifiers["distro"] == "ubuntu-24.04" for p in debs)


def test_a_package_not_installed_is_skipped(document):
    assert "Package: netbase\nStatus: deinstall ok config-files" in DPKG
    assert not [c for c in document["components"] if c["name"] == "netbase"]
    assert len(re.findall(r"^Package: ", DPKG, re.M)) == 22
    assert len(installed_packages(DPKG)) == 21


def test_the_same_inputs_give_the_same_bytes():
    first, second = _sbom(), _sbom()
    assert first == second
    document = json.loads(first)
    assert document["serialNumber"] == f"urn:uuid:{uuid.uuid5(SERIAL_NAMESPACE, 'sha256:' + 'a1' * 32)}"
    assert document["metadata"]["timestamp"] == "2026-01-31T12:00:00+00:00"
    assert first == json.dumps(document, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    other = json.loads(_sbom(image=ImageRef.parse(IMAGE.replace("a1" * 32, "c3" * 32))))
    assert other["serialNumber"] != document["serialNumber"]


def test_the_base_by_digest(document):
    bases = [c for c in document["components"] if c["type"] == "container"]
    assert len(bases) == 1
    base = bases[0]
    assert base["hashes"] == [{"alg": "SHA-256", "content": "b2" * 32}]
    purl = PackageURL.from_string(base["purl"])
    assert (purl.type, purl.name, purl.version) == ("oci", "cuda", "sha256:" + "b2" * 32)
    assert purl.qualifiers == {"repository_url": "127.0.0.1:5001/hub/nvidia/cuda", "tag": "12.8.2-base-ubuntu24.04"}
    with pytest.raises(ValidationFailed, match="base image .* no sha256 digest"):
        _sbom(base=ImageRef.parse(BASE.split("@")[0]))


def test_the_image_is_the_metadata_component_and_depends_on_everything(document):
    image = document["metadata"]["component"]
    assert (image["type"], image["name"], image["version"]) == (
        "container", "127.0.0.1:5000/imgfab/qwen2-7b-h100", "vllm0.19.1-torch2.10.0-cu12.8-h100-0123456789ab")
    purl = PackageURL.from_string(image["purl"])
    assert (purl.name, purl.version) == ("qwen2-7b-h100", "sha256:" + "a1" * 32)
    assert purl.qualifiers["repository_url"] == "127.0.0.1:5000/imgfab/qwen2-7b-h100"
    assert [(t["name"], t["version"]) for t in document["metadata"]["tools"]["components"]] == [("imgfab", "0.1.0")]
    root = [d for d in document["dependencies"] if d["ref"] == image["bom-ref"]]
    assert sorted(root[0]["dependsOn"]) == sorted(c["bom-ref"] for c in document["components"])
    with pytest.raises(ValidationFailed, match="no tag"):
        _sbom(image=ImageRef.parse("127.0.0.1:5000/imgfab/qwen2-7b-h100@sha256:" + "a1" * 32))


def test_the_source_checkout_is_a_vcs_reference():
    source = Source(url="https://github.com/imgfab/imgfab", revision="0" * 40, created=CREATED)
    image = json.loads(_sbom(source=source))["metadata"]["component"]
    assert image["externalReferences"] == [{"type": "vcs", "url": "https://github.com/imgfab/imgfab"}]
    assert {"name": "imgfab:source.revision", "value": "0" * 40} in image["properties"]


@pytest.mark.parametrize("created", ["2026-01-31 12:00", "2026-01-31T12:00:00", "yesterday"])
def test_created_must_be_a_zoned_time(created):
    with pytest.raises(ValidationFailed, match="created"):
        _sbom(created=created)


@pytest.mark.parametrize("lock_text, why", [
    ("# refused: vllm 0.19.1 needs torch 2.10.0\n", "refused"),
    ("# fingerprint: x\n\nsix==1.17.0  # unhashed: index unreachable\n", "six have no hashes"),
    ("# fingerprint: x\n", "pins no package"),
])
def test_a_lock_that_built_nothing_is_refused(lock_text, why):
    with pytest.raises(ValidationFailed, match=why):
        _sbom(lock_text=lock_text)


# --- the dpkg and os-release readers -----------------------------------------------------------

def _stanza(name: str, status: str, arch: str = "amd64", version: str = "1.0-1") -> str:
    return (f"Package: {name}\nStatus: {status}\nArchitecture: {arch}\nVersion: {version}\n"
            "Description: a package\n a long description\n .\n with a paragraph\n")


def test_held_packages_are_installed():
    # The nvidia/cuda images apt-mark hold libcublas and libnccl: "hold ok installed".
    packages = installed_packages(_stanza("libnccl2", "hold ok installed") + "\n" + _stanza("a", "install ok installed"))
    assert [(p.name, p.version, p.arch) for p in packages] == [("a", "1.0-1", "amd64"), ("libnccl2", "1.0-1", "amd64")]


@pytest.mark.parametrize("status", ["install ok half-configured", "install ok unpacked",
                                    "install reinstreq installed", "install ok triggers-pending"])
def test_an_unfinished_install_is_refused(status):
    with pytest.raises(ValidationFailed, match="did not finish"):
        installed_packages(_stanza("a", "install ok installed") + "\n" + _stanza("b", status))


@pytest.mark.parametrize("text, match", [
    (_stanza("a", "install ok installed") + "\n" + _stanza("a", "install ok installed"), "listed twice"),
    ("Package: a\nStatus: install ok installed\nVersion: 1\n", "no Version or Architecture"),
    ("Package: a\nStatus: installed\n", "no valid Status"),
    (" continued\n", "continues no field"),
    ("not a field\n", "not 'Field: value'"),
    (_stanza("a", "purge ok not-installed"), "no installed package"),
    ("", "no installed package"),
])
def test_malformed_dpkg_status_is_refused(text, match):
    with pytest.raises(ValidationFailed, match=match):
        installed_packages(text)


def test_os_release():
    assert (distro(UBUNTU).id, distro(UBUNTU).version_id, distro(UBUNTU).codename) == ("ubuntu", "24.04", "noble")
    assert distro(DEBIAN).qualifier == "debian-12"
    assert distro('ID=debian\nVERSION_CODENAME=trixie\nPRETTY_NAME="Debian GNU/Linux trixie/sid"\n').qualifier \
        == "debian-trixie"
    assert distro("ID='ubuntu'\nVERSION_ID=\"24.04\"\n").qualifier == "ubuntu-24.04"
    for text in ("NAME=Linux\n", "ID=ubuntu\n", ""):
        with pytest.raises(ValidationFailed, match="os-release"):
            distro(text)
