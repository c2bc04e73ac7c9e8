"""Containers on the engine: run (with every option the run shapes use), inspect, logs, exec,
remove, volumes, and a one-off Python run inside an image (the payload measurement, the
synthetic model). Through the docker SDK (docker.from_env(): DOCKER_HOST, DOCKER_TLS_VERIFY,
DOCKER_CERT_PATH) and, for run_python, the docker CLI; every failure is one EngineError line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from imgfab.errors import EngineError
from imgfab.docker.toolenv import tool_env


def _client() -> Any:
    import docker  # noqa: PLC0415 - lazy: `imgfab render` needs no Docker
    from docker.errors import DockerException  # noqa: PLC0415

    try:
        return docker.from_env()
    except DockerException as exc:
        raise EngineError(f"cannot reach the Docker engine: {_one_line(exc)}",
                          field="engine",
                          fix="start Docker, or point DOCKER_HOST at a running engine") from None


def _one_line(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)
    return " ".join(str(explanation or exc).split())


def run_container(image: str, *, gpus: str | int | list[str] | None = "all",
                  shm_size: str | int | None = None,
                  ulimits: dict[str, int | tuple[int, int]] | None = None,
                  mounts: list[tuple[str, str, bool]] | None = None,
                  ports: dict[int | str, int | tuple[str, int]] | None = None,
                  env: dict[str, str] | None = None, name: str | None = None,
                  read_only: bool = False, tmpfs: dict[str, str] | None = None,
                  volumes: list[tuple[str | None, str]] | None = None,
                  cap_drop: list[str] | None = None, security_opt: list[str] | None = None,
                  user: str | None = None, group_add: list[str] | None = None,
                  devices: list[str] | None = None, network_mode: str | None = None) -> Any:
    """Start ``image`` detached and return the SDK's ``Container``.

    ``gpus``: ``"all"``, a count, a list of device ids or UUIDs, or None for no GPU (as
    ``docker run --gpus``). ``shm_size``: bytes or ``"16g"``. ``ulimits``: name → limit or
    ``(soft, hard)`` (``-1`` = unlimited). ``mounts``: ``(host path, container path,
    read_only)`` bind mounts. ``ports``: container port → host port or ``(host ip, host
    port)``. ``read_only``, ``tmpfs`` (path → options), ``volumes`` (``(name or None for an
    anonymous one, container path)``), ``cap_drop``, ``security_opt``, ``user``,
    ``group_add``, ``devices`` (``/dev/x`` or ``host:container``) and ``network_mode`` are
    ``docker run``'s options of those names. Raises :class:`EngineError` (image missing, GPU
    runtime missing, name taken, …).
    """
    from docker.errors import DockerException, ImageNotFound  # noqa: PLC0415
    from docker.types import DeviceRequest, Mount, Ulimit  # noqa: PLC0415

    device_requests = []
    if gpus == "all":
        device_requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    elif isinstance(gpus, int) and gpus > 0:
        device_requests = [DeviceRequest(count=gpus, capabilities=[["gpu"]])]
    elif isinstance(gpus, (list, tuple)) and gpus:
        device_requests = [DeviceRequest(device_ids=[str(g) for g in gpus],
                                         capabilities=[["gpu"]])]
    limits = [Ulimit(name=key, soft=value[0], hard=value[1]) if isinstance(value, tuple)
              else Ulimit(name=key, soft=value, hard=value)
              for key, value in sorted((ulimits or {}).items())]
    binds = [Mount(target=target, source=source, type="bind", read_only=ro)
             for source, target, ro in (mounts or [])]
    binds += [Mount(target=target, source=source, type="volume")
              for source, target in (volumes or [])]
    published = {f"{port}/tcp" if str(port).isdigit() else str(port): host
                 for port, host in (ports or {}).items()}
    client = _client()
    try:
        return client.containers.run(
            image, detach=True, name=name, environment=dict(env or {}),
            device_requests=device_requests or None, shm_size=shm_size, ulimits=limits or None,
            mounts=binds or None, ports=(published or None) if network_mode != "host" else None,
            read_only=read_only, tmpfs=dict(tmpfs) if tmpfs else None,
            cap_drop=list(cap_drop) if cap_drop else None,
            security_opt=list(security_opt) if security_opt else None, user=user,
            group_add=list(group_add) if group_add else None,
            devices=[d if ":" in d else f"{d}:{d}:rwm" for d in devices or ()] or None,
            network_mode=network_mode)
    except ImageNotFound:
        raise EngineError(f"image {image} is not on the engine", field="engine",
                          fix="build it (imgfab build) or docker pull it first") from None
    except DockerException as exc:
        message = _one_line(exc)
        fix = "see the engine's message"
        if "could not select device driver" in message:
            fix = "install the NVIDIA Container Toolkit on the engine host, or run without GPUs"
        elif "Conflict" in message or "already in use" in message:
            fix = f"remove the old container: docker rm -f {name}"
        raise EngineError(f"docker run {image} failed: {message}", field="engine",
                          fix=fix) from None


def container_running(container: Any) -> bool:
    """True while the container's state is ``running`` (re-read from the engine)."""
    from docker.errors import DockerException, NotFound  # noqa: PLC0415

    try:
        container.reload()
    except NotFound:
        return False
    except DockerException as exc:
        raise EngineError(f"cannot inspect container {container.name}: {_one_line(exc)}",
                          field="engine", fix="check the engine is reachable") from None
    return container.status == "running"


def container_started_at(container: Any) -> str:
    """The engine's RFC 3339 time the container's process started (``State.StartedAt``), as
    ``docker logs --timestamps`` writes its lines' times; "" when the engine does not say."""
    from docker.errors import DockerException  # noqa: PLC0415

    try:
        container.reload()
    except DockerException:
        return ""
    started = (container.attrs.get("State") or {}).get("StartedAt") or ""
    return "" if started.startswith("0001-") else started


def container_logs(container: Any, *, tail: int | None = 200, timestamps: bool = False) -> str:
    """The last ``tail`` lines of the container's stdout and stderr (all of them for None), as
    text; with ``timestamps``, each line starts with the engine's RFC 3339 time of it."""
    from docker.errors import DockerException  # noqa: PLC0415

    try:
        data = container.logs(stdout=True, stderr=True, tail="all" if tail is None else tail,
                              timestamps=timestamps)
    except DockerException as exc:
        raise EngineError(f"cannot read logs of container {container.name}: "
                          f"{_one_line(exc)}", field="engine",
                          fix="check the engine is reachable") from None
    return data.decode("utf-8", errors="replace")


def exec_in(container: Any, command: list[str], *,
            env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``command`` in the running container; returns ``(exit code, stdout)``.

    stderr is kept apart so that a command printing JSON on stdout stays parseable.
    """
    from docker.errors import DockerException  # noqa: PLC0415

    try:
        result = container.exec_run(command, environment=env, demux=True)
    except DockerException as exc:
        raise EngineError(f"docker exec {' '.join(command)} in {container.name} failed: "
                          f"{_one_line(exc)}", field="engine",
                          fix="the container must be running") from None
    stdout, _stderr = result.output if isinstance(result.output, tuple) else (result.output,
                                                                              None)
    return int(result.exit_code), (stdout or b"").decode("utf-8", errors="replace")


def remove_container(container: Any) -> None:
    """Stop and remove the container and its anonymous volumes; gone already is fine."""
    from docker.errors import DockerException, NotFound  # noqa: PLC0415

    try:
        container.remove(force=True, v=True)
    except NotFound:
        return
    except DockerException as exc:
        raise EngineError(f"cannot remove container {container.name}: {_one_line(exc)}",
                          field="engine", fix=f"docker rm -f {container.name}") from None


def remove_volume(name: str) -> None:
    """Remove the named volume; gone already is fine."""
    from docker.errors import DockerException, NotFound  # noqa: PLC0415

    try:
        _client().volumes.get(name).remove(force=True)
    except NotFound:
        return
    except DockerException as exc:
        raise EngineError(f"cannot remove volume {name}: {_one_line(exc)}", field="engine",
                          fix=f"docker volume rm {name}") from None


def run_python(image: str, script: str, args: list[str] | tuple[str, ...] = (), *,
               timeout_s: int = 600, mounts: list[tuple[str, str, bool]] | None = None,
               env: dict[str, str] | None = None) -> str:
    """Run ``script`` with the image's ``/opt/venv/bin/python`` (stdin, no network, no GPU) and
    return its stdout. ``mounts``: ``(host path, container path, read_only)`` binds; ``env``:
    extra variables. Raises :class:`EngineError` with the gist of stderr on failure."""
    cli = os.environ.get("IMGFAB_DOCKER_CLI") or shutil.which("docker") or "docker"
    options = [arg for source, target, ro in mounts or ()
               for arg in ("--mount", f"type=bind,source={source},target={target}"
                           + (",readonly" if ro else ""))]
    options += [arg for key, value in sorted((env or {}).items()) for arg in ("--env", f"{key}={value}")]
    command = [cli, "run", "--rm", "-i", "--network", "none", *options,
               "--entrypoint", "/opt/venv/bin/python", image, "-", *args]
    try:
        done = subprocess.run(command, input=script, capture_output=True, text=True,
                              timeout=timeout_s, check=False, env=tool_env("docker"))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineError(f"docker run {image} failed: {_one_line(exc)}", field="engine",
                          fix="check the engine (DOCKER_HOST) and run again") from None
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise EngineError(f"python in {image} exited {done.returncode}: {tail}", field="engine",
                          fix="see the message; the image's /opt/venv must have a working python")
    return done.stdout
