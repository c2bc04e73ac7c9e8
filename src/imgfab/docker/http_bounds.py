"""Bounded HTTP I/O for the registry client: every body has a size cap and every request an
overall deadline.

``requests`` bounds each socket read, not a request: a server that trickles one byte every
few seconds never trips its read timeout, and ``.content`` reads a body whole, whatever its
size. Here:

- :func:`deadline` opens a wall-clock window (redirects, the 401 round and the token request
  included). Every socket a request uses inside it is watched; when the window closes, the
  watched sockets are shut down, so a blocked read returns at once and the request fails.
- :func:`read_capped` is a ``requests`` response hook: it reads the body in chunks, up to a
  cap, before anyone calls ``.content`` (redirect bodies included), and refuses a larger one.

Contract: a body over its cap raises :class:`~imgfab.errors.RegistryError`; an expired
deadline surfaces as a ``requests`` exception, and :func:`expired` then says so.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from imgfab.errors import RegistryError

_local = threading.local()


class Deadline:
    """One wall-clock window; the sockets used inside it are shut down when it closes."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.started = time.monotonic()
        self.expired = False
        self._closed = False
        self._sockets: list[Any] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def remaining(self) -> float:
        """Seconds left (at least a sliver, so a timeout argument is never zero)."""
        return max(0.01, self.seconds - (time.monotonic() - self.started))

    def watch(self, sock: Any) -> None:
        with self._lock:
            if not self.expired:
                self._sockets.append(sock)
                return
        _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.expired = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._closed = True
            self._sockets = []


def _shut(sock: Any) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except (OSError, ValueError):
        pass


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[Deadline]:
    """A window of ``seconds`` for everything this thread sends inside it. Nested calls share
    the outermost window: a token request made while answering a 401 counts against it."""
    current = getattr(_local, "deadline", None)
    if current is not None:
        yield current
        return
    window = Deadline(seconds)
    _local.deadline = window
    window._timer.start()
    try:
        yield window
    finally:
        _local.deadline = None
        window.close()


def expired() -> bool:
    """True inside a window that has run out."""
    current = getattr(_local, "deadline", None)
    return bool(current is not None and current.expired)


def _watch(sock: Any) -> None:
    current = getattr(_local, "deadline", None)
    if current is not None and sock is not None:
        current.watch(sock)


def read_capped(response: Any, limit: int, what: str) -> None:
    """Read ``response``'s body into it (``.content`` then returns it), at most ``limit`` bytes.

    A 2xx body over ``limit`` (announced by Content-Length or seen while reading) raises
    :class:`RegistryError` naming ``what``; any other body (error text, a redirect) is cut at
    ``limit``, since only its first line is ever shown."""
    strict = 200 <= response.status_code < 300
    if response.request is not None and response.request.method == "HEAD":
        response._content, response._content_consumed = b"", True
        return
    announced = response.headers.get("Content-Length", "")
    if strict and announced.isdigit() and int(announced) > limit:
        response.close()
        raise too_large(what, limit, f"{int(announced)} bytes announced")
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_content(64 * 1024):
        size += len(chunk)
        if size > limit:
            response.close()
            if strict:
                raise too_large(what, limit, "more")
            chunks.append(chunk[: len(chunk) - (size - limit)])
            break
        chunks.append(chunk)
    response._content, response._content_consumed = b"".join(chunks), True


def too_large(what: str, limit: int, seen: str) -> RegistryError:
    return RegistryError(f"{what} is larger than imgfab accepts ({seen}; the cap is "
                         f"{limit} bytes)", field="registry",
                         fix="check the registry: a body this size is not a registry answer")


def mount(session: Any) -> None:
    """Route ``session``'s http and https traffic through connections the deadline watches."""
    from requests.adapters import HTTPAdapter  # noqa: PLC0415 - lazy, like requests itself
    from urllib3.connection import HTTPConnection, HTTPSConnection  # noqa: PLC0415
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool  # noqa: PLC0415

    class Watched:
        def _new_conn(self) -> Any:  # the TCP socket, before any TLS handshake on it
            sock = super()._new_conn()  # type: ignore[misc]
            _watch(sock)
            return sock

        def getresponse(self, *args: Any, **kwargs: Any) -> Any:
            _watch(self.sock)  # type: ignore[attr-defined]
            return super().getresponse(*args, **kwargs)  # type: ignore[misc]

    class WatchedHTTP(Watched, HTTPConnection):
        pass

    class WatchedHTTPS(Watched, HTTPSConnection):
        pass

    class Pool(HTTPConnectionPool):
        ConnectionCls = WatchedHTTP

    class TLSPool(HTTPSConnectionPool):
        ConnectionCls = WatchedHTTPS

    classes = {"http": Pool, "https": TLSPool}

    class Adapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = classes

        def proxy_manager_for(self, *args: Any, **kwargs: Any) -> Any:
            manager = super().proxy_manager_for(*args, **kwargs)
            if hasattr(manager, "pool_classes_by_scheme"):
                manager.pool_classes_by_scheme = classes
            return manager

    adapter = Adapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
