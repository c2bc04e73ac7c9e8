"""The host-side smoke test: does a served image answer like an OpenAI-compatible server?

:func:`run_smoke` works against any OpenAI-compatible base URL (vLLM, trtllm-serve, SGLang):

1. polls ``GET /health`` every ``poll_interval_s`` until it answers 200, failing at
   ``health_timeout_s`` (or at once if ``alive()`` says the server process is gone);
   with an ``api_key``, asks every route the server lists without it
   (:mod:`imgfab.ops.smoke_routes`): each must refuse but ``GET /health``, and the route table
   goes into the report;
2. lists ``GET /v1/models`` and picks ``model`` (default: the first listed);
3. sends each prompt as a streaming chat completion (``stream_options.include_usage``) and
   measures time to first token and decode speed; one more non-streaming chat completion
   checks the plain response shape; with ``completions=True`` also ``/v1/completions``;
4. checks every answer is non-empty text;
5. samples GPU memory through NVML meanwhile, when ``pynvml`` and a driver are on this host
   (absent: noted, not a failure).

:func:`smoke_image` starts an image through :mod:`imgfab.docker.engine`, runs the client against it,
and on failure attaches the container's log tail and the in-image probe's JSON report
(``docker exec … python -m imgfab.in_image.probe --json``); the container is always removed.

Only ``requests`` and the standard library. Nothing here raises for a failed check: the
returned :class:`SmokeReport` says ``passed`` and lists ``failures``, one line each. Engine
errors (Docker unreachable, image missing) raise :class:`imgfab.errors.EngineError`.

>>> report = run_smoke("http://127.0.0.1:8000", health_timeout_s=600)  # doctest: +SKIP
>>> report.passed, report.ttft_ms, report.tokens_per_s                   # doctest: +SKIP
(True, 41.7, 2310.5)
"""

from __future__ import annotations

import importlib
import json
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import requests

from imgfab.render import shapes
from imgfab.errors import EngineError
from imgfab.ops.smoke_routes import OPEN_ROUTES, check_routes
from imgfab.render.shapes import Shape

DEFAULT_PROMPTS = (
    "Say hello in one short sentence.",
    "What is 2 + 2? Answer with one number.",
    "Name one primary colour.",
)
LOG_TAIL_LINES = 200
# The first line of a --log-dir log: when the container's process started (engine time).
STARTED_LINE = "imgfab-smoke: the container's process started"
PROBE_COMMAND = ["/opt/venv/bin/python", "-m", "imgfab.in_image.probe", "--json"]
PROBE_ENV = {"PYTHONPATH": "/opt/imgfab"}


@dataclass
class SmokeReport:
    """What the smoke test saw.

    ``ttft_ms`` is the median time to first token over the streamed requests;
    ``tokens_per_s`` the decode rate (tokens after the first, over the time after the first,
    summed over the streamed requests); ``peak_gpu_memory_bytes`` one peak per GPU that NVML
    on this host sees (empty when NVML is not available: see ``notes``). ``routes``: what each
    route answered without the API key (:class:`imgfab.ops.smoke_routes.RouteCheck` as a dict).
    """

    base_url: str
    passed: bool = False
    healthy_after_s: float | None = None
    routes: list[dict[str, Any]] = field(default_factory=list)
    model_ids: list[str] = field(default_factory=list)
    model: str | None = None
    answers: list[str] = field(default_factory=list)
    ttft_ms: float | None = None
    tokens_per_s: float | None = None
    completion_tokens: int = 0
    peak_gpu_memory_bytes: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    log_tail: str = ""
    probe: dict[str, Any] | None = None
    shape: str = ""  # the run shape it was started in (imgfab.render.shapes), "" for a bare URL
    noexec: list[str] = field(default_factory=list)  # code paths mounted noexec in the container

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


@dataclass(frozen=True)
class StreamResult:
    """One streamed completion: its text, and timings from the moment the request was sent."""

    text: str
    ttft_s: float | None
    decode_s: float
    tokens: int


class GpuMemorySampler:
    """Samples used memory of every GPU through NVML in a thread; keeps each GPU's peak.

    Use as a context manager; ``peaks`` is empty and ``error`` says why when NVML is absent.
    """

    def __init__(self, interval_s: float = 0.05, nvml: Any = None):
        self.interval_s = interval_s
        self.nvml = nvml
        self.peaks: list[int] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuMemorySampler:
        nvml = self.nvml
        if nvml is None:
            try:
                import pynvml as nvml  # noqa: PLC0415 - optional on the host
            except ImportError:
                self.error = "GPU memory not recorded: nvidia-ml-py is not installed here"
                return self
        try:
            nvml.nvmlInit()
            handles = [nvml.nvmlDeviceGetHandleByIndex(i)
                       for i in range(nvml.nvmlDeviceGetCount())]
        except Exception as exc:
            self.error = f"GPU memory not recorded: NVML unavailable here ({exc})"
            return self
        self.nvml, self.peaks = nvml, [0] * len(handles)
        self._sample(handles)
        self._thread = threading.Thread(target=self._run, args=(handles,), daemon=True)
        self._thread.start()
        return self

    def _sample(self, handles: list[Any]) -> None:
        for i, handle in enumerate(handles):
            self.peaks[i] = max(self.peaks[i], int(self.nvml.nvmlDeviceGetMemoryInfo(handle).used))

    def _run(self, handles: list[Any]) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample(handles)
            except Exception as exc:
                self.error = f"GPU memory sampling stopped: {exc}"
                return

    def __exit__(self, *exc_info: Any) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # shutdown failure changes no figure
                pass


def wait_for_health(session: requests.Session, base_url: str, *, timeout_s: float,
                    poll_interval_s: float,
                    alive: Callable[[], bool] | None = None) -> tuple[float | None, str]:
    """Poll ``/health`` until 200. Returns ``(seconds, "")`` or ``(None, why it failed)``.

    Never takes longer than ``timeout_s`` (plus one poll's connect timeout at most).
    """
    start = time.monotonic()
    deadline = start + timeout_s
    last = "no answer yet"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, (f"health: {base_url}/health did not answer 200 within "
                          f"{timeout_s:g}s (last: {last})")
        if alive is not None and not alive():
            return None, f"health: the server exited before {base_url}/health answered 200 " \
                         f"(last: {last})"
        wait = min(poll_interval_s, remaining)
        try:
            response = session.get(f"{base_url}/health", timeout=max(wait, 0.1))
            if response.status_code == 200:
                return time.monotonic() - start, ""
            last = f"HTTP {response.status_code}"
        except requests.RequestException as exc:
            last = type(exc).__name__
        time.sleep(max(0.0, min(wait, deadline - time.monotonic())))


def _sse_lines(response: requests.Response) -> Iterator[bytes]:
    """Lines of a server-sent-event body, each as soon as it arrives.

    ``iter_lines`` waits for a full read buffer on a body without chunked encoding, which
    would hide the first token's arrival time; ``read1`` returns what has come.
    """
    raw = response.raw
    reads: Iterator[bytes]
    if hasattr(raw, "read1"):
        reads = iter(lambda: raw.read1(65536, decode_content=True), b"")
    else:  # urllib3 < 2: one byte at a time is slow but exact, and bodies here are small
        reads = response.iter_content(chunk_size=1)
    pending = b""
    for data in reads:
        pending += data
        *lines, pending = pending.split(b"\n")
        yield from (line.rstrip(b"\r") for line in lines)
    if pending:
        yield pending


def stream_completion(session: requests.Session, url: str, body: dict[str, Any], *,
                      chat: bool, timeout_s: float, headers: dict[str, str]) -> StreamResult:
    """POST ``body`` with ``stream: true``; raises ``requests.RequestException`` or
    ``ValueError`` (a non-200 answer, a malformed event)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    sent = time.perf_counter()
    first = last = None
    pieces, usage_tokens, text = 0, None, []
    with session.post(url, json=body, stream=True, timeout=timeout_s,
                      headers=headers) as response:
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code}: {response.text[:200]}")
        for line in _sse_lines(response):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if event.get("usage"):
                usage_tokens = event["usage"].get("completion_tokens")
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if piece:
                    last = time.perf_counter()
                    first = first or last
                    pieces += 1
                    text.append(piece)
    tokens = usage_tokens if isinstance(usage_tokens, int) else pieces
    return StreamResult("".join(text), None if first is None else first - sent,
                        0.0 if first is None else last - first, tokens)


def run_smoke(base_url: str, *, model: str | None = None,
              prompts: tuple[str, ...] | list[str] = DEFAULT_PROMPTS, max_tokens: int = 32,
              health_timeout_s: float = 600.0, poll_interval_s: float = 2.0,
              request_timeout_s: float = 120.0, completions: bool = False,
              api_key: str | None = None, alive: Callable[[], bool] | None = None,
              gpu_sampler: GpuMemorySampler | None = None,
              extra_body: dict[str, Any] | None = None,
              open_routes: frozenset[tuple[str, str]] = OPEN_ROUTES) -> SmokeReport:
    """Smoke-test the server at ``base_url`` (``http://host:port``, no ``/v1``).

    ``api_key``: sent as ``Authorization: Bearer``; every listed route but ``open_routes``
    must refuse a request without it (the server is not asked further when one answers).
    ``alive``: returns False once the server process is gone (stops the health wait early).
    ``gpu_sampler``: defaults to NVML on this host, if importable. ``extra_body``: merged into
    every generation request (``{"ignore_eos": True}`` for a random-weight model, so each
    answer runs to ``max_tokens`` and decode speed is measured).
    """
    base_url = base_url.rstrip("/")
    report = SmokeReport(base_url=base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with requests.Session() as session:
        report.healthy_after_s, why = wait_for_health(
            session, base_url, timeout_s=health_timeout_s, poll_interval_s=poll_interval_s,
            alive=alive)
        if why:
            report.failures.append(why)
            return report
        if api_key:
            table, failures = check_routes(session, base_url, api_key, open_routes=open_routes,
                                           timeout_s=request_timeout_s)
            report.routes = [asdict(route) for route in table]
            if failures:
                report.failures += failures
                return report
        if not _list_models(session, report, model, headers, request_timeout_s):
            return report
        sampler = gpu_sampler or GpuMemorySampler()
        with sampler:
            _send_prompts(session, report, prompts, max_tokens, completions, headers,
                          request_timeout_s, dict(extra_body or {}))
        report.peak_gpu_memory_bytes = list(sampler.peaks)
        if sampler.error:
            report.notes.append(sampler.error)
    report.passed = not report.failures
    return report


def _list_models(session: requests.Session, report: SmokeReport, model: str | None,
                 headers: dict[str, str], timeout_s: float) -> bool:
    url = f"{report.base_url}/v1/models"
    try:
        response = session.get(url, timeout=timeout_s, headers=headers)
        response.raise_for_status()
        report.model_ids = [str(m["id"]) for m in response.json()["data"]]
    except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
        report.failures.append(f"models: GET {url} failed: {' '.join(str(exc).split())}")
        return False
    if not report.model_ids:
        report.failures.append(f"models: GET {url} lists no model")
        return False
    if model is not None and model not in report.model_ids:
        report.failures.append(f"models: {model} is not served (served: "
                               f"{', '.join(report.model_ids)})")
        return False
    report.model = model or report.model_ids[0]
    return True


def _send_prompts(session: requests.Session, report: SmokeReport, prompts: Any,
                  max_tokens: int, completions: bool, headers: dict[str, str],
                  timeout_s: float, extra_body: dict[str, Any]) -> None:
    chat_url = f"{report.base_url}/v1/chat/completions"
    requests_to_send: list[tuple[str, str, bool, dict[str, Any]]] = [
        (f"chat {i + 1}", chat_url, True,
         {"messages": [{"role": "user", "content": p}]}) for i, p in enumerate(prompts)]
    if completions:
        requests_to_send.append(("completion", f"{report.base_url}/v1/completions", False,
                                 {"prompt": prompts[0]}))
    streamed: list[StreamResult] = []
    for label, url, chat, body in requests_to_send:
        body = dict(body, model=report.model, max_tokens=max_tokens, temperature=0, **extra_body)
        try:
            result = stream_completion(session, url, body, chat=chat, timeout_s=timeout_s,
                                       headers=headers)
        except (requests.RequestException, ValueError) as exc:
            report.failures.append(f"{label}: POST {url} failed: {' '.join(str(exc).split())}")
            continue
        report.answers.append(result.text)
        if not result.text.strip():
            report.failures.append(f"{label}: the streamed answer is empty "
                                   f"({result.tokens} token(s) reported)")
            continue
        streamed.append(result)
    _plain_chat(session, report, chat_url, prompts[0], max_tokens, headers, timeout_s, extra_body)
    ttfts = [r.ttft_s for r in streamed if r.ttft_s is not None]
    if ttfts:
        report.ttft_ms = round(statistics.median(ttfts) * 1000, 2)
    decode_s = sum(r.decode_s for r in streamed if r.tokens > 1)
    decode_tokens = sum(r.tokens - 1 for r in streamed if r.tokens > 1)
    report.completion_tokens = sum(r.tokens for r in streamed)
    if decode_s > 0:
        report.tokens_per_s = round(decode_tokens / decode_s, 1)
    elif streamed:
        report.notes.append("tokens/s not measured: no answer had more than one token")


def _plain_chat(session: requests.Session, report: SmokeReport, url: str, prompt: str,
                max_tokens: int, headers: dict[str, str], timeout_s: float,
                extra_body: dict[str, Any]) -> None:
    body = {"model": report.model, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": prompt}], **extra_body}
    try:
        response = session.post(url, json=body, timeout=timeout_s, headers=headers)
        response.raise_for_status()
        text = response.json()["choices"][0]["message"]["content"]
    except (requests.RequestException, ValueError, KeyError, IndexError, TypeError) as exc:
        report.failures.append(f"chat (not streamed): POST {url} failed: "
                               f"{' '.join(str(exc).split())}")
        return
    report.answers.append(text if isinstance(text, str) else "")
    if not isinstance(text, str) or not text.strip():
        report.failures.append("chat (not streamed): the answer is empty")


@dataclass(frozen=True)
class RunSettings:
    """How :func:`smoke_image` starts the image (the engine's ``run_container`` arguments).

    ``mounts``: ``(host path, container path, read_only)``. ``host_port`` None picks a free
    port on this machine; ``host`` is where the published port is reached.
    """

    gpus: str | int | list[str] | None = "all"
    shm_size: str | int | None = "16g"
    ulimits: dict[str, int | tuple[int, int]] = field(
        default_factory=lambda: {"memlock": -1, "stack": 67108864})
    mounts: tuple[tuple[str, str, bool], ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    container_port: int = 8000
    host: str = "127.0.0.1"
    host_port: int | None = None
    name: str | None = None
    model: str | None = None
    health_timeout_s: float = 900.0
    poll_interval_s: float = 2.0
    completions: bool = False
    shape: Shape | None = None  # the run shape's container options (imgfab.render.shapes)
    devices: tuple[str, ...] = ()  # host devices passed through (GPUs without --gpus)
    network: str | None = None  # "host": no port publishing, the server is reached on its port
    extra_body: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None  # sent as Authorization: Bearer; its absence must be refused
    open_routes: frozenset[tuple[str, str]] = OPEN_ROUTES  # answer without the key (smoke_routes)
    log_dir: str | None = None  # where each shape's whole container log is written (<shape>.log)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def smoke_image(image: str, run_settings: RunSettings, engine: Any = None) -> SmokeReport:
    """Start ``image``, smoke-test it, collect evidence on failure, always remove it.

    ``engine`` defaults to :mod:`imgfab.docker.engine` (tests pass an object with the same
    functions). Raises :class:`EngineError` when the container cannot be started.
    """
    engine = engine or importlib.import_module("imgfab.docker.engine")
    settings = run_settings
    host_network = settings.network == "host"
    port = settings.container_port if host_network else settings.host_port or free_port(settings.host)
    name = settings.name or f"imgfab-smoke-{uuid.uuid4().hex[:8]}"
    shape = settings.shape
    options: dict[str, Any] = {}
    if shape is not None:
        options = {"read_only": shape.read_only, "tmpfs": shape.tmpfs,
                   "volumes": list(shape.volumes), "cap_drop": list(shape.cap_drop),
                   "security_opt": list(shape.security_opt), "user": shape.user,
                   "group_add": list(shape.group_add)}
    container = engine.run_container(
        image, gpus=settings.gpus, shm_size=settings.shm_size, ulimits=settings.ulimits,
        mounts=list(settings.mounts), ports={settings.container_port: (settings.host, port)},
        env=dict(settings.env), name=name, devices=list(settings.devices),
        network_mode=settings.network, **options)
    report = SmokeReport(base_url=f"http://{settings.host}:{port}")
    try:
        # Read the mounts at once: a shape that cannot run compiled code makes the server die
        # at start, and a dead container has no /proc/mounts to read.
        mounts = SmokeReport(base_url=report.base_url, shape=shape.name if shape else "")
        if shape is not None:
            _check_mounts(engine, container, mounts)
        report = run_smoke(report.base_url, model=settings.model,
                           health_timeout_s=settings.health_timeout_s,
                           poll_interval_s=settings.poll_interval_s,
                           completions=settings.completions, api_key=settings.api_key,
                           alive=lambda: engine.container_running(container),
                           extra_body=settings.extra_body, open_routes=settings.open_routes)
        report.shape, report.noexec = mounts.shape, mounts.noexec
        report.failures[:0] = mounts.failures
        report.notes += mounts.notes
        report.passed = report.passed and not mounts.failures
        if settings.log_dir:  # the whole log, for start-up spans (bench/startup.py)
            _write_log(engine, container, settings.log_dir, report)
        if report.passed:  # what serving printed (what it compiled, how long it took)
            try:
                report.log_tail = engine.container_logs(container, tail=LOG_TAIL_LINES)
            except EngineError as exc:
                report.notes.append(f"logs not collected: {exc.one_line()}")
        else:
            _collect_evidence(engine, container, report)
    finally:
        try:
            engine.remove_container(container)
        except EngineError as exc:
            report.failures.append(f"cleanup: container {name} was not removed: "
                                   f"{exc.one_line()}")
            report.passed = False
    return report


def _write_log(engine: Any, container: Any, directory: str, report: SmokeReport) -> None:
    """Write the container's whole log, each line with the engine's timestamp, to
    ``directory/<shape>.log`` (a note when it cannot). Its first line is the time the
    container's process started (``State.StartedAt``), so that spans measured from the log's
    first line count what runs before the entrypoint's first output (the probe)."""
    path = Path(directory) / f"{report.shape or 'smoke'}.log"
    try:
        text = engine.container_logs(container, tail=None, timestamps=True)
        started = engine.container_started_at(container)
        if started:
            text = f"{started} {STARTED_LINE}\n{text}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except (EngineError, OSError) as exc:
        report.notes.append(f"log not written to {path}: {' '.join(str(exc).split())}")


def _check_mounts(engine: Any, container: Any, report: SmokeReport) -> None:
    """Where serving writes code it then loads, the shape's mounts must allow exec: read
    ``/proc/mounts`` inside the running container (a failure when any such path is noexec)."""
    try:
        running = engine.container_running(container)
        code, mounts = engine.exec_in(container, ["cat", "/proc/mounts"]) if running else (1, "")
    except EngineError as exc:
        report.notes.append(f"mounts not read: {exc.one_line()}")
        return
    if code != 0:
        report.notes.append("mounts not read: the container is not running")
        return
    report.noexec = shapes.noexec_code_paths(mounts)
    if report.noexec:
        report.failures.append(f"mounts: {', '.join(report.noexec)} mounted noexec in the "
                               f"{report.shape} shape; serving loads the code it compiles there")


def _collect_evidence(engine: Any, container: Any, report: SmokeReport) -> None:
    try:
        report.log_tail = engine.container_logs(container, tail=LOG_TAIL_LINES)
    except EngineError as exc:
        report.notes.append(f"logs not collected: {exc.one_line()}")
    try:
        running = engine.container_running(container)
    except EngineError as exc:
        report.notes.append(f"probe not run: {exc.one_line()}")
        return
    if not running:
        report.notes.append("probe not run inside the container: it has exited (its start "
                            "runs the probe first, so its verdict is in the log tail)")
        return
    try:
        code, output = engine.exec_in(container, PROBE_COMMAND, env=PROBE_ENV)
    except EngineError as exc:
        report.notes.append(f"probe not run: {exc.one_line()}")
        return
    try:
        report.probe = json.loads(output)
    except ValueError:
        report.probe = {"exit_code": code, "output": output[-2000:]}
