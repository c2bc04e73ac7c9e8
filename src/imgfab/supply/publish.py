"""After a push: what travels with the image, written, attached and checked.

:func:`publish` is ``imgfab build --push``'s last step (``BuildOptions.publish_hook``):

1. read the built image's ``/var/lib/dpkg/status`` and ``/etc/os-release`` (the payload is the
   truth: the OS packages come from the image, not from a list);
2. the SBOM (:mod:`imgfab.supply.sbom`: every locked Python package, the OS packages, the base
   by digest) and the provenance statement (:mod:`imgfab.supply.provenance`: subject the pushed
   digest, the recipe's and the lock's digests, the compat rows that decided the stack, the
   bases by digest, the options with secrets named, the source revision);
3. the deploy bundle (:mod:`imgfab.supply.bundle`) pinned by the digest the registry returned;
4. with a signing key: ``cosign sign`` the digest, ``cosign attest`` the SBOM
   (``--type cyclonedx``) and the provenance (``--type slsaprovenance1``), render the
   ``ClusterImagePolicy`` for the key, and verify it all back with cosign before reporting
   success (a push whose signature does not verify is an error, not a note).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from imgfab.docker.registry import Credentials, ImageRef
from imgfab.docker.toolenv import tool_env
from imgfab.errors import EngineError, ValidationFailed
from imgfab.matrix.compat import default_compat_dir
from imgfab.supply import bundle, cosign
from imgfab.supply.policy import KeyAuthority, cluster_image_policy
from imgfab.supply.provenance import (WORKSTATION_BUILDER, BuildParameters, CompatRow, SourceFile,
                                     build_provenance)
from imgfab.supply.sbom import build_sbom

SBOM_FILE = "sbom.cdx.json"
PROVENANCE_FILE = "provenance.intoto.json"
POLICY_FILE = "clusterimagepolicy.yaml"

# Run inside the image (its own python, no network): the two files the SBOM reads.
_READ_OS = """
import json, pathlib
def read(path):
    p = pathlib.Path(path)
    return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else ""
print(json.dumps({"dpkg": read("/var/lib/dpkg/status"), "os": read("/etc/os-release")}))
"""


def image_os(image: str) -> tuple[str, str]:
    """``(dpkg status, os-release)`` texts of the built ``image``."""
    from imgfab.docker.containers import run_python  # noqa: PLC0415

    read = json.loads(run_python(image, _READ_OS, timeout_s=120))
    if not read["dpkg"]:
        raise ValidationFailed(f"{image} has no /var/lib/dpkg/status to list its OS packages from",
                               field="sbom", fix="build on a Debian/Ubuntu base")
    return read["dpkg"], read["os"]


_BACKEND_FILES = {"vllm": "vllm.yaml", "tensorrt-llm": "tensorrt_llm.yaml"}


def deciding_rows(stack: Any, matrix: Any, compat_dir: Path | None = None) -> list[CompatRow]:
    """The compat rows that decided ``stack``: its backend release, torch, CUDA toolkit, base
    image, GPU, precision rule and backend profile (and TensorRT), each with its file, its own
    source and the file's sha256."""
    directory = Path(compat_dir) if compat_dir else default_compat_dir()

    def row(file: str, key: str, version: str, record: Any) -> CompatRow:
        path = directory / file
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        return CompatRow(file=f"compat/{file}", key=key, version=version,
                         source=getattr(record, "source", "") or "", sha256=digest)

    release = next((r for r in matrix.backend_releases(stack.backend)
                    if r.version == stack.backend_version), None)
    rows = [row(_BACKEND_FILES.get(stack.backend, "backends.yaml"), stack.backend,
                stack.backend_version, release),
            row("backends.yaml", f"profile {stack.backend}", stack.backend_path,
                matrix.profiles.get(stack.backend)),
            row("cuda.yaml", "cuda", stack.cuda, matrix.toolkits.get(stack.cuda)),
            row("cuda_images.yaml", "nvidia/cuda", f"{stack.cuda}-{stack.os}",
                matrix.image(stack.cuda, stack.os)),
            row("gpus.yaml", "gpu", stack.gpu, matrix.gpu(stack.gpu)),
            row("precisions.yaml", f"precision {stack.backend}", stack.precision,
                matrix.precision_rule(stack.backend, stack.precision, stack.backend_version))]
    if stack.torch:
        rows.append(row("torch.yaml", "torch", stack.torch, matrix.torch.get(stack.torch)))
    if stack.tensorrt:
        rows.append(row("tensorrt.yaml", "tensorrt", stack.tensorrt, None))
    return sorted(rows, key=lambda r: (r.file, r.key))


def builder_run(image: ImageRef) -> tuple[str, str]:
    """``(builder id, invocation id)`` of this build: a GitHub-hosted runner and its run URL
    under GitHub Actions (``GITHUB_ACTIONS=true``, as actions/attest-build-provenance names
    them), else a workstation build (SLSA Build L1 at most) named by the pushed digest."""
    env = os.environ
    if env.get("GITHUB_ACTIONS") == "true" and env.get("GITHUB_RUN_ID"):
        run = (f"{env.get('GITHUB_SERVER_URL', 'https://github.com')}/{env.get('GITHUB_REPOSITORY', '')}"
               f"/actions/runs/{env['GITHUB_RUN_ID']}/attempts/{env.get('GITHUB_RUN_ATTEMPT', '1')}")
        return "https://github.com/actions/runner/github-hosted", run
    return WORKSTATION_BUILDER, f"{image.name}@{image.digest}"


def _public_key(key: Path, credentials: Any) -> str:
    done = cosign._run(["public-key", "--key", str(key)], credentials,  # noqa: SLF001
                       password=cosign.key_password())
    if done.returncode != 0 or "PUBLIC KEY" not in done.stdout:
        raise EngineError(f"cosign public-key --key {key} failed: {cosign._gist(done)}",  # noqa: SLF001
                          field="--sign-key", fix="check the key and IMGFAB_COSIGN_PASSWORD[_FILE]")
    return done.stdout


def _relative(path: Path, source_root: Path | None) -> str:
    resolved = Path(path).resolve()
    if source_root is not None and resolved.is_relative_to(source_root):
        return resolved.relative_to(source_root).as_posix()
    return Path(path).as_posix()


def _source_root(recipe_path: str) -> Path | None:
    done = subprocess.run(["git", "-C", str(Path(recipe_path).resolve().parent), "rev-parse",
                           "--show-toplevel"], capture_output=True, text=True, check=False,
                          env=tool_env("git"))
    return Path(done.stdout.strip()).resolve() if done.returncode == 0 and done.stdout.strip() else None


def publish(built: Any, record: Any) -> dict[str, Any]:
    """Write and attach the supply chain of ``built`` (a pushed
    :class:`imgfab.docker.build.BuiltImage`) from ``record`` (its
    :class:`imgfab.docker.build.BuildRecord`); returns the ``publish`` report."""
    options = record.options
    pushed = ImageRef.parse(built.pushed)
    remote_tag = next(t for t in built.tags if t.startswith(pushed.name + ":"))
    image = ImageRef(pushed.host, pushed.repository, remote_tag.rsplit(":", 1)[1], pushed.digest)
    credentials = Credentials.load(options.registry.split("/", 1)[0], options.registry_user,
                                   options.registry_password)
    bases = {key: ImageRef.parse(ref) for key, ref in record.bases.items()}
    created = record.source.created or record.finished
    dpkg, os_release = image_os(built.tags[0])
    lock_text = record.lock.text if record.lock is not None else ""
    sbom = build_sbom(image=image, base=bases["RUNTIME_IMAGE"], lock_text=lock_text,
                      dpkg_status=dpkg, os_release=os_release, created=created,
                      source=record.source if record.source.url or record.source.revision else None)
    root = _source_root(record.recipe_path)
    recipe_file = SourceFile(_relative(Path(record.recipe_path), root),
                             Path(record.recipe_path).read_bytes())
    lock_file = SourceFile(_relative(record.lock_path, root) if record.lock_path else "",
                           lock_text.encode())
    parameters = BuildParameters(
        mirror=options.mirror, registry=options.registry, network=options.network,
        pin_digests=options.pin_digests, push=options.push, compile=options.compile,
        pip_index_url=options.pip_index_url,
        compat_dir=str(options.compat_dir) if options.compat_dir else None,
        lock=str(options.lock) if options.lock else None, secrets=record.secrets)
    builder, invocation = builder_run(image)
    provenance = build_provenance(
        image=image, recipe=recipe_file, lock=lock_file, parameters=parameters, bases=bases,
        compat_rows=deciding_rows(record.stack, record.matrix, options.compat_dir),
        source=record.source if record.source.url and record.source.revision else None,
        builder_id=builder, invocation_id=invocation,
        started_on=record.started, finished_on=record.finished)
    extra = {SBOM_FILE: sbom, PROVENANCE_FILE: provenance}
    notes: list[str] = []
    if options.sign_key is not None:
        extra[POLICY_FILE] = cluster_image_policy(
            pushed.name, KeyAuthority(public_key=_public_key(options.sign_key, credentials)))
    digest_ref = f"{pushed.name}@{pushed.digest}"
    files = bundle.bundle_files(record.rerender(digest_ref), digest_ref, tag_ref=remote_tag,
                                extra=extra)
    directory = bundle.write_bundle(Path(built.context), files)
    report: dict[str, Any] = {"bundle": str(directory), "digest": pushed.digest,
                              "image": digest_ref, "sbom": str(directory / SBOM_FILE),
                              "provenance": str(directory / PROVENANCE_FILE), "signed": False,
                              "attestations": [], "notes": notes}
    if options.sign_key is None:
        return report
    cosign.sign(digest_ref, options.sign_key, credentials)
    with tempfile.TemporaryDirectory(prefix="imgfab-attest-") as scratch:
        predicate = Path(scratch) / "provenance.predicate.json"
        predicate.write_text(json.dumps(json.loads(provenance)["predicate"], sort_keys=True))
        cosign.attest(digest_ref, directory / SBOM_FILE, "cyclonedx", options.sign_key, credentials)
        cosign.attest(digest_ref, predicate, "slsaprovenance1", options.sign_key, credentials)
        public = Path(scratch) / "cosign.pub"
        public.write_text(_public_key(options.sign_key, credentials))
        verdict = cosign.verify(digest_ref, cosign.Trust(key=public), credentials)
    if not verdict.verified:
        raise ValidationFailed(f"{digest_ref} was signed but does not verify: "
                               f"{'; '.join(verdict.problems)}", field="--sign-key",
                               fix="check the key pair and the registry")
    notes.append(cosign.NO_TLOG_NOTE)
    report |= {"signed": True, "attestations": sorted(verdict.attestations),
               "policy": str(directory / POLICY_FILE)}
    return report
