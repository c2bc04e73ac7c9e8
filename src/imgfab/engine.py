"""The only module that talks to Docker (through the ``docker`` SDK, ``docker.from_env()``,
which honours ``DOCKER_HOST``, ``DOCKER_TLS_VERIFY`` and ``DOCKER_CERT_PATH``).

Every failure raises :class:`imgfab.errors.EngineError` with one line saying what failed and
the fix. ``docker`` is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

from typing import Any

from imgfab.errors import EngineError


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


# --- containers: run, inspect, exec, remove (smoke tests) -------------------------------------

def run_container(image: str, *, gpus: str | int | list[str] | None = "all",
                  shm_size: str | int | None = None,
                  ulimits: dict[str, int | tuple[int, int]] | None = None,
                  mounts: list[tuple[str, str, bool]] | None = None,
                  ports: dict[int | str, int | tuple[str, int]] | None = None,
                  env: dict[str, str] | None = None, name: str | None = None) -> Any:
    """Start ``image`` detached and return the SDK's ``Container``.

    ``gpus``: ``"all"``, a count, a list of device ids or UUIDs, or None for no GPU (as
    ``docker run --gpus``). ``shm_size``: bytes or ``"16g"``. ``ulimits``: name → limit or
    ``(soft, hard)`` (``-1`` = unlimited). ``mounts``: ``(host path, container path,
    read_only)`` bind mounts. ``ports``: container port → host port or ``(host ip, host
    port)``. Raises :class:`EngineError` (image missing, GPU runtime missing, name taken, …).
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
    binds = [Mount(target=target, source=source, type="bind", read_only=read_only)
             for source, target, read_only in (mounts or [])]
    published = {f"{port}/tcp" if str(port).isdigit() else str(port): host
                 for port, host in (ports or {}).items()}
    client = _client()
    try:
        return client.containers.run(
            image, detach=True, name=name, environment=dict(env or {}),
            device_requests=device_requests or None, shm_size=shm_size, ulimits=limits or None,
            mounts=binds or None, ports=published or None)
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


def container_logs(container: Any, *, tail: int = 200) -> str:
    """The last ``tail`` lines of the container's stdout and stderr, as text."""
    from docker.errors import DockerException  # noqa: PLC0415

    try:
        data = container.logs(stdout=True, stderr=True, tail=tail)
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

# --- end of containers ------------------------------------------------------------------------
