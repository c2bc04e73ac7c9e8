"""A TCP proxy on 127.0.0.1 that resets the first K matching connections, then forwards.

Used to stand in for a flaky network between the daemon (or imgfab) and the registry::

    with FlakyProxy(("127.0.0.1", 5000), drop=2) as proxy:
        push(..., f"127.0.0.1:{proxy.port}/repo:tag", ...)
    assert proxy.dropped == 2

``match(first_bytes)`` picks which connections count (default: all); the first chunk the
client sends (an HTTP request head, or a TLS hello) is what it sees. A dropped connection is
closed with SO_LINGER 0, so the peer reads ``connection reset by peer``.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Callable


class FlakyProxy:
    def __init__(self, upstream: tuple[str, int], *, drop: int,
                 match: Callable[[bytes], bool] | None = None):
        self.upstream = upstream
        self.drop = drop
        self.match = match or (lambda _first: True)
        self.dropped = 0
        self.forwarded = 0
        self.seen: list[bytes] = []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = self._server.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> "FlakyProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closed.set()
        self._server.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        client.settimeout(30)
        try:
            first = client.recv(65536)
        except OSError:
            client.close()
            return
        with self._lock:
            self.seen.append(first[:200])
            reset = bool(first) and self.dropped < self.drop and self.match(first)
            if reset:
                self.dropped += 1
            else:
                self.forwarded += 1
        if reset:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            return
        try:
            upstream = socket.create_connection(self.upstream, timeout=30)
        except OSError:
            client.close()
            return
        upstream.sendall(first)
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
        _pump(client, upstream)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
