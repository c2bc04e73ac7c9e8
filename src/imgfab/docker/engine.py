"""The Docker engine's images: BuildKit builds through the docker CLI, inspect, history, save,
tag, push, remove, and the engine's own facts. Containers live in :mod:`imgfab.docker.containers`
(re-exported here); with :mod:`imgfab.docker.registry`, these are the only code that talks to
Docker (the SDK's ``docker.from_env()`` honours ``DOCKER_HOST``, ``DOCKER_TLS_VERIFY`` and
``DOCKER_CERT_PATH``).

Every failure raises :class:`imgfab.errors.EngineError` with one line saying what failed and
the fix. ``docker`` is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from secrets import token_hex
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgfab.errors import EngineError
from imgfab.docker.toolenv import tool_env
from imgfab.docker.containers import (_client, _one_line, container_logs, container_running,
                                      container_started_at,
                                      exec_in, remove_container, remove_volume, run_container,
                                      run_python)

# The engine's whole surface: images and builds here, containers in imgfab.docker.containers.
__all__ = ["COMPRESSIONS", "MIN_ENGINE", "EngineFacts", "add_labels", "build", "buildx_version",
           "check_engine", "compile_caps", "container_logs", "container_running", "container_started_at",
           "docker_cli",
           "docker_info", "engine_facts", "exec_in", "image_history", "inspect_image", "push_image",
           "remove_container", "remove_image", "remove_volume", "run_container", "run_python",
           "save_image", "save_stream", "tag"]


# --- containers: run, inspect, exec, remove (smoke tests) -------------------------------------


_PUSHED = re.compile(r"^(\S+): digest: (sha256:[0-9a-f]{64}) size: \d+$")


class LayerBytes:
    """The bytes of a push or pull stream, over all its layers: each layer's last
    ``progressDetail`` (current of total), and whole once the daemon says it is done. Layers
    whose size the daemon never says count only when they are done."""

    DONE = ("Pushed", "Layer already exists", "Download complete", "Pull complete",
            "Already exists", "Mounted from")

    def __init__(self) -> None:
        self._layers: dict[str, tuple[int, int]] = {}

    def see(self, item: dict[str, Any]) -> bool:
        """Take one stream item; True when the totals moved."""
        layer, status = str(item.get("id") or ""), str(item.get("status") or "")
        detail = item.get("progressDetail") or {}
        if not layer or not status:
            return False
        current, total = self._layers.get(layer, (0, 0))
        if status in ("Pushing", "Downloading") and detail.get("total"):
            current, total = int(detail.get("current") or 0), int(detail["total"])
        elif status.startswith(self.DONE):
            current = total
        else:
            return False
        if self._layers.get(layer) == (current, total):
            return False
        self._layers[layer] = (current, total)
        return True

    @property
    def done(self) -> int:
        return sum(current for current, _ in self._layers.values())

    @property
    def total(self) -> int:
        return sum(total for _, total in self._layers.values())


def push_image(local_ref: str, repository: str, tag: str, *,
               auth_config: dict[str, str] | None = None, on_line: Any = None,
               progress: Any = None) -> str:
    """Tag ``local_ref`` as ``repository:tag`` and push it through the daemon (one attempt).

    Returns the manifest digest the daemon reports (the push stream's ``aux.Digest``).
    The SDK reports registry failures inside the stream, not as exceptions: every item is
    checked for ``error``, which raises :class:`imgfab.errors.RegistryError` carrying the
    daemon's message verbatim (:mod:`imgfab.docker.registry` decides whether it is worth a retry).
    ``on_line(text)`` receives each progress line; ``progress`` (:class:`imgfab.progress.Progress`)
    the bytes sent over all layers. Raises :class:`EngineError` when the image is missing or the
    engine is unreachable.
    """
    from docker.errors import DockerException, ImageNotFound  # noqa: PLC0415
    from requests.exceptions import RequestException  # noqa: PLC0415
    from urllib3.exceptions import HTTPError as Urllib3Error  # noqa: PLC0415

    from imgfab.errors import RegistryError  # noqa: PLC0415

    client = _client()
    # A first push into a new repository uploads every layer; the daemon's stream stays quiet
    # for minutes while layers wait, past the SDK's 60 s read timeout.
    client.api.timeout = _SAVE_TIMEOUT_S
    try:
        client.api.tag(local_ref, repository, tag, force=True)
    except ImageNotFound:
        raise EngineError(f"image {local_ref} is not on the engine", field="engine",
                          fix="build it (imgfab build) or docker pull it first") from None
    except DockerException as exc:
        raise EngineError(f"docker tag {local_ref} {repository}:{tag} failed: {_one_line(exc)}",
                          field="engine", fix="check the engine is reachable") from None
    digest = ""
    reported: dict[str, int] = {}  # layer id → last tenth of its upload reported
    sent = LayerBytes()
    try:
        for item in client.api.push(repository, tag=tag, stream=True, decode=True,
                                    auth_config=auth_config):
            if progress is not None and sent.see(item):
                progress.bytes(f"push {repository}:{tag}", sent.done, sent.total, verb="sent")
            if item.get("error"):
                raise RegistryError(" ".join(str(item["error"]).split()),
                                    field=f"push {repository}:{tag}")
            digest = (item.get("aux") or {}).get("Digest") or digest
            # The containerd image store (Docker 26) sends no aux record: only the classic
            # engine's closing status line, "<tag>: digest: sha256:… size: N".
            closing = _PUSHED.match(str(item.get("status") or ""))
            if closing and closing.group(1) == tag:
                digest = digest or closing.group(2)
            if on_line is None or not item.get("status"):
                continue
            detail = item.get("progressDetail") or {}
            if item["status"] == "Pushing" and detail.get("total"):
                # The daemon sends an update every few KB: report each layer per tenth only.
                tenth = int(10 * detail.get("current", 0) / detail["total"])
                if reported.get(item.get("id", "")) == tenth:
                    continue
                reported[item.get("id", "")] = tenth
            on_line(" ".join(filter(None, (item.get("id"), item["status"], item.get("progress")))))
    except DockerException as exc:
        raise EngineError(f"docker push {repository}:{tag} failed: {_one_line(exc)}",
                          field="engine", fix="check the engine is reachable") from None
    except (RequestException, Urllib3Error) as exc:  # the stream is read through urllib3
        raise EngineError(f"the engine dropped the push of {repository}:{tag}: "
                          f"{_one_line(exc)}", field="engine",
                          fix="check the engine is reachable") from None
    if not digest:
        raise RegistryError(f"the push of {repository}:{tag} ended without a digest",
                            field="registry", fix="retry; see the daemon log")
    return digest

# --- end of containers ------------------------------------------------------------------------

# --- images: build, inspect, history, save, tag, remove ---------------------------------------
# The docker SDK cannot run BuildKit builds, so `build` drives the docker CLI as a subprocess
# (DOCKER_BUILDKIT=1, with DOCKER_HOST / DOCKER_CONFIG inherited); everything else about
# images goes through the SDK.

# `#12 [runtime 3/9] COPY ...` opens a step; `#12 CACHED` / `#12 DONE 1.2s` / `#12 ERROR: ...`
# close it. `[internal]` and `[auth]` vertices are not Dockerfile steps.
_STEP_LINE = re.compile(r"^#(\d+) \[([^\]\s]+) (\d+)/(\d+)\] (.*)$")
_STATUS_LINE = re.compile(r"^#(\d+) (CACHED|DONE [0-9.]+s|ERROR:? ?.*)$")
_LOG_KEEP_LINES = 4000
# The engine exports a multi-GB image before the first byte of `docker save` arrives (about
# 60 s for a real vLLM payload on this 2-core stack): the SDK's 60 s default read timeout fails.
_SAVE_TIMEOUT_S = 1800


@dataclass
class BuildStep:
    """One Dockerfile step as BuildKit reported it: ``[stage index/total] instruction``."""

    vertex: int
    stage: str
    index: int
    total: int
    instruction: str
    cached: bool = False
    done: bool = False
    error: str | None = None


@dataclass
class BuildResult:
    """``image_id`` (``sha256:…``), wall time, every step (in first-seen order) and the log.

    ``hold_ref`` is the private name the build gave the image (``imgfab-unverified/…``): on the
    containerd image store an image without a name is not kept, so the caller removes it only
    once the image has its real names (or is rejected)."""

    image_id: str
    duration_s: float
    hold_ref: str = ""
    steps: list[BuildStep] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    @property
    def cached_steps(self) -> int:
        return sum(1 for step in self.steps if step.cached)

    def stage_steps(self, stage: str) -> list[BuildStep]:
        """The steps of ``stage`` (e.g. ``builder``), in Dockerfile order."""
        return sorted((s for s in self.steps if s.stage == stage), key=lambda s: s.index)

    def cached_by_stage(self) -> dict[str, tuple[int, int]]:
        """stage → (cached steps, steps)."""
        counts: dict[str, tuple[int, int]] = {}
        for step in self.steps:
            cached, total = counts.get(step.stage, (0, 0))
            counts[step.stage] = (cached + step.cached, total + 1)
        return counts


class BuildLogParser:
    """Feeds on ``--progress=plain`` lines; keeps the steps and which were cached."""

    def __init__(self) -> None:
        self.steps: dict[int, BuildStep] = {}

    def feed(self, line: str) -> None:
        match = _STEP_LINE.match(line)
        if match:
            vertex = int(match.group(1))
            if vertex not in self.steps:
                self.steps[vertex] = BuildStep(vertex, match.group(2), int(match.group(3)),
                                               int(match.group(4)), match.group(5))
            return
        match = _STATUS_LINE.match(line)
        if match and int(match.group(1)) in self.steps:
            step, status = self.steps[int(match.group(1))], match.group(2)
            if status == "CACHED":
                step.cached = step.done = True
            elif status.startswith("DONE"):
                step.done = True
            else:
                step.error = status.partition(" ")[2] or status

    def failed_step(self) -> BuildStep | None:
        return next((s for s in self.steps.values() if s.error), None)


# The oldest engine imgfab builds on: Docker 23.0 (API 1.42) ships BuildKit 0.11, whose built-in
# Dockerfile frontend has COPY --link, and which takes SOURCE_DATE_EPOCH for the image config and
# history. Docker 20.10 (BuildKit 0.8) has neither, and reached end of life in 2023.
MIN_ENGINE = "23.0"
# Layer compression of the image as built and pushed. zstd layers are pulled only by Docker >= 23
# or containerd >= 1.5, and the engine keeps them as built only with the containerd image store
# (the classic store keeps layers uncompressed and pushes gzip).
COMPRESSIONS = ("gzip", "zstd")


@dataclass(frozen=True)
class EngineFacts:
    """What the engine is (``docker info``): its version, its image store and storage."""

    version: str  # ServerVersion, e.g. "26.1.5+dfsg1"
    containerd_store: bool  # DriverStatus driver-type io.containerd.snapshotter.v1
    storage: str  # overlayfs / native (containerd store) or overlay2 / vfs (classic)

    @property
    def release(self) -> tuple[int, ...]:
        """The version's leading numbers, ``(26, 1, 5)``; ``()`` when it has none."""
        match = re.match(r"(\d+(?:\.\d+)*)", self.version)
        return tuple(int(part) for part in match.group(1).split(".")) if match else ()

    def too_old(self) -> bool:
        minimum = tuple(int(part) for part in MIN_ENGINE.split("."))
        return bool(self.release) and self.release < minimum


def engine_facts(info: dict[str, Any] | None = None) -> EngineFacts:
    """The engine's :class:`EngineFacts`, from ``docker info`` (``info`` when given)."""
    info = docker_info() if info is None else info
    status = {str(pair[0]): str(pair[1]) for pair in (info.get("DriverStatus") or [])
              if isinstance(pair, (list, tuple)) and len(pair) == 2}
    return EngineFacts(version=str(info.get("ServerVersion") or ""),
                       containerd_store=status.get("driver-type") == "io.containerd.snapshotter.v1",
                       storage=str(info.get("Driver") or ""))


def check_engine(compression: str, facts: EngineFacts | None = None) -> EngineFacts:
    """The engine's facts, when it can build an image with ``compression``; else EngineError
    with one line naming the minimum."""
    facts = engine_facts() if facts is None else facts
    if facts.too_old():
        raise EngineError(f"Docker Engine {facts.version} is older than {MIN_ENGINE}, the oldest imgfab "
                          "builds on (BuildKit 0.11: COPY --link, SOURCE_DATE_EPOCH)", field="engine",
                          fix=f"upgrade the engine to Docker {MIN_ENGINE} or newer")
    if compression == "zstd" and not facts.containerd_store:
        raise EngineError(f"zstd layers need the containerd image store; this engine ({facts.version}) "
                          f"uses the classic store ({facts.storage}), which pushes gzip",
                          field="--compression",
                          fix='set {"features": {"containerd-snapshotter": true}} in daemon.json, '
                              "or build with --compression gzip")
    return facts


def build_output_args(compression: str, epoch: int) -> list[str]:
    """The flags that make a build's image the same bytes from every cold cache: BuildKit's own
    provenance and SBOM attestations off (imgfab attests its own, signed, on the digest; buildx's
    would make the image an index with an ``unknown/unknown`` entry), ``SOURCE_DATE_EPOCH`` for
    the config's and history's times, and the layers compressed as asked, base layers included
    (``force-compression``), with OCI media types."""
    if compression not in COMPRESSIONS:
        raise EngineError(f"unknown compression {compression!r}", field="--compression",
                          fix=f"use one of {', '.join(COMPRESSIONS)}")
    from imgfab.render.context import image_output  # noqa: PLC0415

    return ["--provenance=false", "--sbom=false", "--build-arg", f"SOURCE_DATE_EPOCH={int(epoch)}",
            "--output", image_output(compression)]


def buildx_version() -> str | None:
    """``docker buildx version`` of the CLI builds go through (``IMGFAB_DOCKER_CLI`` or
    ``docker``), e.g. ``github.com/docker/buildx 0.13.1+ds1 0.13.1+ds1-3``; None when there
    is no CLI or no buildx plugin."""
    cli = os.environ.get("IMGFAB_DOCKER_CLI") or shutil.which("docker")
    if not cli:
        return None
    try:
        done = subprocess.run([cli, "buildx", "version"], env=_build_env(), capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
    return line if done.returncode == 0 and "buildx" in line else None


def docker_cli(*, buildx: bool = False) -> str:
    """The docker CLI that runs BuildKit builds: ``IMGFAB_DOCKER_CLI`` or ``docker`` on PATH.

    Raises :class:`EngineError` when there is none, or when it cannot build with BuildKit
    (a CLI >= 23 without the buildx plugin refuses ``DOCKER_BUILDKIT=1`` builds), or, with
    ``buildx``, when its ``build`` is not buildx's (no ``--cache-to``, no ``--builder``: the
    classic CLI's BuildKit builds).
    """
    cli = os.environ.get("IMGFAB_DOCKER_CLI") or shutil.which("docker")
    if not cli or not os.access(cli, os.X_OK):
        raise EngineError(f"no docker CLI found ({cli or 'docker not on PATH'})", field="engine",
                          fix="install the docker CLI or set IMGFAB_DOCKER_CLI to one")
    probe = subprocess.run([cli, "build", "--help"], env=_build_env(), capture_output=True,
                           text=True, timeout=60, check=False)
    text = probe.stdout + probe.stderr
    if probe.returncode != 0 or "--secret" not in text or "buildx component" in text:
        raise EngineError(f"{cli} cannot run BuildKit builds", field="engine",
                          fix="install the buildx plugin, or set IMGFAB_DOCKER_CLI to a CLI "
                              "that has BuildKit (e.g. Debian's docker.io 20.10 /usr/bin/docker)")
    if buildx and not ("--cache-to" in text and "--builder" in text):
        raise EngineError(f"{cli} builds without buildx: no --cache-to or --builder", field="engine",
                          fix="install the docker-buildx plugin, or set IMGFAB_DOCKER_CLI to a "
                              "CLI that has it")
    return cli


def _build_env() -> dict[str, str]:
    """The docker CLI's environment: its allow-list (:mod:`imgfab.docker.toolenv`), BuildKit on."""
    return tool_env("docker", {"DOCKER_BUILDKIT": "1"})


def build(context_dir: Path, *, tags: list[str] | tuple[str, ...] = (),
          build_args: dict[str, str] | None = None, secrets: dict[str, Path] | None = None,
          network: str | None = None, target: str | None = None,
          on_line: Callable[[str], None] | None = None, no_cache: bool = False,
          compression: str = "gzip", epoch: int = 0, cache_from: tuple[str, ...] = (),
          cache_to: tuple[str, ...] = (), builder: str | None = None) -> BuildResult:
    """``docker build --progress=plain`` of ``context_dir``, streaming each log line to
    ``on_line``. ``secrets``: BuildKit secret id → file (mounted only in the steps that ask,
    never in a layer). ``compression`` and ``epoch``: :func:`build_output_args`.
    ``cache_from`` / ``cache_to``: BuildKit cache specs, checked
    (:mod:`imgfab.docker.buildcache`); ``builder``: a buildx builder by name (its driver decides
    the exporter, :func:`~imgfab.docker.buildcache.output_for_driver`). Returns a
    :class:`BuildResult`; raises :class:`EngineError` naming the failing step and the gist of
    its last log lines.
    """
    from imgfab.docker import buildcache  # noqa: PLC0415

    buildcache.check_cache_specs(cache_from, cache_to, 1)
    cli = docker_cli(buildx=bool(cache_from or cache_to or builder))
    driver = buildcache.builder_driver(cli, builder, _build_env()) if builder else "docker"
    if builder:
        buildcache.check_engine_builder(cli, builder, driver, _build_env())
    facts = check_engine(compression)  # the engine the image is verified in, whoever builds it
    if cache_to and driver == "docker" and not facts.containerd_store:
        raise EngineError(f"this engine ({facts.version}) uses the classic image store, whose "
                          "builder cannot export a build cache", field="--cache-to",
                          fix='set {"features": {"containerd-snapshotter": true}} in daemon.json, '
                              "or build with --builder on a BuildKit builder")
    # The image's ID is read back by this private name: BuildKit's --iidfile holds the config
    # digest, which is not the image ID on the containerd store (there it is the manifest's).
    hold = f"imgfab-unverified/build:{token_hex(8)}"
    with tempfile.TemporaryDirectory(prefix="imgfab-build-") as scratch:
        output = build_output_args(compression, epoch)
        output[-1] = buildcache.output_for_driver(output[-1], driver)
        argv = [cli, "build", "--progress=plain", *output]
        if builder:
            argv += ["--builder", builder]
        for spec in cache_from:
            argv += ["--cache-from", spec]
        for spec in cache_to:
            argv += ["--cache-to", spec]
        for key, value in sorted((build_args or {}).items()):
            argv += ["--build-arg", f"{key}={value}"]
        for secret_id, path in sorted((secrets or {}).items()):
            if not Path(path).is_file():
                raise EngineError(f"build secret {secret_id}: {path} is not a file",
                                  field="engine", fix="pass an existing file")
            argv += ["--secret", f"id={secret_id},src={Path(path).resolve()}"]
        if network:
            argv += ["--network", network]
        if target:
            argv += ["--target", target]
        if no_cache:
            argv.append("--no-cache")
        for tag_ref in (hold, *tags):
            argv += ["--tag", tag_ref]
        argv.append(str(context_dir))
        parser = BuildLogParser()
        log: deque[str] = deque(maxlen=_LOG_KEEP_LINES)
        started = time.monotonic()
        try:
            # A session of its own: the CLI's plugins (docker-buildx) are in its process group,
            # which is stopped whole when imgfab is interrupted (stop_process_group).
            process = subprocess.Popen(argv, env=_build_env(), stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, errors="replace",
                                       bufsize=1, start_new_session=True)
        except OSError as exc:
            raise EngineError(f"cannot run {cli}: {exc}", field="engine",
                              fix="check IMGFAB_DOCKER_CLI") from None
        try:
            assert process.stdout is not None
            for raw in process.stdout:
                line = raw.rstrip("\n")
                log.append(line)
                parser.feed(line)
                if on_line:
                    on_line(line)
            code = process.wait()
        except BaseException:  # a signal, or on_line failing: the build must not go on
            stop_process_group(process)
            raise
        duration = time.monotonic() - started
        if code != 0:
            raise EngineError(_build_failure(parser, list(log), code), field="engine",
                              fix="see the step's log above (--debug keeps the traceback)")
    image_id = str(inspect_image(hold).get("Id") or "")
    if not image_id:
        raise EngineError("docker build succeeded but its image has no ID", field="engine",
                          fix=f"docker image inspect {hold}")
    return BuildResult(image_id=image_id, duration_s=duration, hold_ref=hold,
                       steps=sorted(parser.steps.values(), key=lambda s: s.vertex),
                       log=list(log))


# How long a stopped build's CLI gets to cancel the build on the daemon before SIGKILL.
_STOP_GRACE_S = 10


def stop_process_group(process: subprocess.Popen[str], grace_s: float = _STOP_GRACE_S) -> None:
    """Stop ``process`` and every process in its group (it leads one: ``start_new_session``):
    SIGTERM, up to ``grace_s`` for the leader to exit, then SIGKILL to whatever is left."""
    import signal  # noqa: PLC0415

    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, signum)
        except (ProcessLookupError, PermissionError):  # no such group: stop the leader alone
            if process.poll() is None:
                process.send_signal(signum)
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


def _build_failure(parser: BuildLogParser, log: list[str], code: int) -> str:
    step = parser.failed_step()
    where = (f"step [{step.stage} {step.index}/{step.total}] {step.instruction[:120]}"
             if step else f"docker build (exit {code})")
    # The gist: the last non-empty output lines of the failing vertex, else of the log.
    prefix = f"#{step.vertex} " if step else ""
    lines = [line for line in log if line.startswith(prefix) and line.strip()]
    gist_lines = [re.sub(r"^#\d+ (\d+\.\d+ )?", "", line) for line in lines
                  if not _STATUS_LINE.match(line) and not _STEP_LINE.match(line)][-3:]
    final = next((line for line in reversed(log) if line.startswith(("error:", "ERROR:",
                                                                     "failed to solve"))), "")
    parts = [part.strip() for part in gist_lines + [final] if part.strip()]
    gist = " | ".join(dict.fromkeys(parts))
    return f"{where} failed: {gist[-400:] or 'no output'}"


def _sdk_image_call(what: str, call: Callable[[], Any]) -> Any:
    from docker.errors import DockerException, ImageNotFound  # noqa: PLC0415

    try:
        return call()
    except ImageNotFound:
        raise EngineError(f"{what}: image not found", field="engine",
                          fix="build it (imgfab build) or docker pull it first") from None
    except DockerException as exc:
        raise EngineError(f"{what} failed: {_one_line(exc)}", field="engine",
                          fix="check the engine is reachable") from None


def pull_image(ref: str, *, auth_config: dict[str, str] | None = None, progress: Any = None) -> None:
    """``docker pull ref`` (a tag or a digest reference) through the daemon, reporting the bytes
    downloaded over all layers to ``progress``. Registry failures arrive inside the stream and
    raise :class:`imgfab.errors.RegistryError` with the daemon's message; an unreachable engine
    raises :class:`EngineError`."""
    from docker.errors import DockerException  # noqa: PLC0415
    from requests.exceptions import RequestException  # noqa: PLC0415
    from urllib3.exceptions import HTTPError as Urllib3Error  # noqa: PLC0415

    from imgfab.errors import RegistryError  # noqa: PLC0415

    client = _client()
    client.api.timeout = _SAVE_TIMEOUT_S
    if progress is not None:
        progress.step(f"pulling {ref}")
    read = LayerBytes()
    try:
        for item in client.api.pull(ref, stream=True, decode=True, auth_config=auth_config):
            if item.get("error"):
                raise RegistryError(" ".join(str(item["error"]).split()), field=f"pull {ref}",
                                    fix="check the reference and the registry's credentials")
            if progress is not None and read.see(item):
                progress.bytes(f"pull {ref}", read.done, read.total)
    except DockerException as exc:
        raise RegistryError(f"docker pull {ref} failed: {_one_line(exc)}", field=f"pull {ref}",
                            fix="check the reference and the registry's credentials") from None
    except (RequestException, Urllib3Error) as exc:
        raise EngineError(f"the engine dropped the pull of {ref}: {_one_line(exc)}",
                          field="engine", fix="check the engine is reachable") from None


def has_image(ref: str) -> bool:
    """Whether the engine holds ``ref`` (a name, tag, digest reference or ID)."""
    from docker.errors import DockerException, ImageNotFound  # noqa: PLC0415

    client = _client()
    try:
        client.api.inspect_image(ref)
    except ImageNotFound:
        return False
    except DockerException as exc:
        raise EngineError(f"inspect {ref} failed: {_one_line(exc)}", field="engine",
                          fix="check the engine is reachable") from None
    return True


def inspect_image(ref: str) -> dict[str, Any]:
    """The engine's ``docker image inspect`` record of ``ref`` (Config, Size, RepoTags, …)."""
    client = _client()
    return _sdk_image_call(f"inspect {ref}", lambda: client.api.inspect_image(ref))


def image_history(ref: str) -> list[dict[str, Any]]:
    """``docker history`` of ``ref``, newest layer first (CreatedBy, Size, …)."""
    client = _client()
    return _sdk_image_call(f"history of {ref}", lambda: client.api.history(ref))


def save_image(ref: str, path: Path) -> Path:
    """Write ``docker save ref`` (a tar of the layers and config) to ``path``, streaming."""
    client = _client()
    client.api.timeout = _SAVE_TIMEOUT_S
    path = Path(path)

    def write() -> Path:
        stream = client.api.get_image(ref)
        with open(path, "wb") as out:
            for chunk in stream:
                out.write(chunk)
        return path

    return _sdk_image_call(f"docker save {ref}", write)


def save_stream(ref: str) -> Iterator[bytes]:
    """``docker save ref`` as a stream of byte chunks (nothing written to disk)."""
    client = _client()
    client.api.timeout = _SAVE_TIMEOUT_S
    return _sdk_image_call(f"docker save {ref}", lambda: client.api.get_image(ref))


def tag(ref: str, target: str) -> None:
    """Give image ``ref`` the name ``target`` (``repository:tag``)."""
    repository, _, tag_name = target.rpartition(":")
    if not repository or "/" in tag_name:
        repository, tag_name = target, "latest"
    client = _client()
    _sdk_image_call(f"tag {ref} as {target}",
                    lambda: client.api.tag(ref, repository, tag_name, force=True))


def remove_image(ref: str, *, force: bool = False) -> None:
    """Remove image ``ref`` (a name or an id); already gone is fine."""
    from docker.errors import ImageNotFound  # noqa: PLC0415

    client = _client()

    def remove() -> None:
        try:
            client.api.remove_image(ref, force=force)
        except ImageNotFound:
            return

    _sdk_image_call(f"remove image {ref}", remove)

# --- end of images ----------------------------------------------------------------------------


# --- engine facts ------------------------------------------------------------------------------

def docker_info() -> dict[str, Any]:
    """``docker info`` as a dict (ServerVersion, Runtimes, CgroupDriver, ...)."""
    from docker.errors import DockerException  # noqa: PLC0415

    try:
        return _client().info()
    except DockerException as exc:
        raise EngineError(f"Docker engine not reachable: {_one_line(exc)}", field="engine",
                          fix="start the Docker engine (systemctl start docker) or set DOCKER_HOST") from None


def compile_caps() -> tuple[bool, bool]:
    """``(buildkit_device, gpu_visible)`` for compiling a TensorRT engine on this engine.

    ``RUN --device`` needs a Dockerfile frontend newer than the one built into Docker 20.10
    (and a ``# syntax=`` pull), so imgfab never claims it. A GPU is usable by ``docker run
    --gpus`` when the engine has the nvidia runtime or CDI spec directories configured.
    """
    info = docker_info()
    gpu_visible = "nvidia" in (info.get("Runtimes") or {}) or bool(info.get("CDISpecDirs"))
    return False, gpu_visible


def add_labels(image: str, labels: dict[str, str], tags: list[str] | tuple[str, ...], *,
               compression: str = "gzip", epoch: int = 0) -> str:
    """A child of ``image`` that differs only in ``labels`` (no layer), tagged ``tags``.

    Built from a two-line Dockerfile on stdin with ``image``'s own :func:`build_output_args`;
    returns the new image id. Raises EngineError. ``image`` may be an image ID
    (``sha256:…``): BuildKit resolves ``FROM`` by name only, so the ID gets a private, random
    name for this build, removed afterwards.
    """
    source = image
    if image.startswith("sha256:"):
        source = f"imgfab-labelling/{image[7:19]}:{token_hex(8)}"
        tag(image, source)
    lines = [f"FROM {source}"]
    if labels:
        lines.append("LABEL " + " ".join(f"{key}={json.dumps(value)}" for key, value in sorted(labels.items())))
    named = list(tags) or [f"imgfab-unverified/labelled:{token_hex(8)}"]
    command = [docker_cli(), "build", "--quiet", *build_output_args(compression, epoch),
               *(arg for t in named for arg in ("--tag", t)), "-"]
    try:
        done = subprocess.run(command, input="\n".join(lines) + "\n", capture_output=True,
                              text=True, env=_build_env(), timeout=300, check=False)
    finally:
        if source != image:
            try:
                remove_image(source)
            except EngineError:
                pass
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise EngineError(f"labelling {image} failed: {tail}", field="engine", fix="see the message")
    # --quiet prints the config digest; the image ID (the manifest's, on the containerd store)
    # is what the name now points at.
    return str(inspect_image(named[0]).get("Id") or "")
