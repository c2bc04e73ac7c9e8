"""Progress of a long step (issue 23): a rich status line on a terminal, plain lines otherwise,
nothing when quiet. Everything goes to stderr: stdout keeps the command's result (and its one
``--json`` object).

The stations call three methods on whatever :class:`Progress` they are given (``None`` means
:data:`QUIET`): :meth:`Progress.step` when a phase starts (``resolving the payload with uv``),
:meth:`Progress.item` as each of a known number of items is done (a RECORD read, a release) and
:meth:`Progress.bytes` as a download grows. Plain lines are throttled to one every
``interval_s`` per kind of item, but a phase's first and last item are always printed, so a
log shows where a slow command was without hundreds of lines. ``rich`` is imported only when a
terminal is there to show it.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, TextIO

from imgfab.errors import printable

MODES = ("rich", "plain", "quiet")


class Progress:
    """Reports the steps of one command. ``mode`` is one of :data:`MODES`."""

    def __init__(self, mode: str = "plain", *, stream: TextIO | None = None,
                 interval_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        if mode not in MODES:
            raise ValueError(f"progress mode {mode!r} is not one of {MODES}")
        self.mode = mode
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._status: Any = None
        self._started = clock()

    # -- what the stations call ---------------------------------------------------------------

    def step(self, text: str) -> None:
        """A phase starts."""
        self._show(text, always=True, kind="step")

    def item(self, label: str, done: int, total: int, detail: str = "") -> None:
        """``done`` of ``total`` items of ``label`` are finished (``detail``: the last one)."""
        edge = done <= 1 or done >= total
        text = f"{label}: {done}/{total}" + (f" {detail}" if detail else "")
        self._show(text, always=edge, kind=label)

    def bytes(self, label: str, read: int, total: int | None = None, verb: str = "read") -> None:
        """``read`` bytes of ``label`` (of ``total``, when known) have arrived, or have gone
        (``verb``: ``read``, ``sent``)."""
        whole = f" of {_size(total)}" if total else ""
        self._show(f"{label}: {_size(read)}{whole} {verb}", always=bool(total and read >= total),
                   kind=f"bytes {label}")

    # -- the display ---------------------------------------------------------------------------

    def _show(self, text: str, *, always: bool, kind: str) -> None:
        if self.mode == "quiet":
            return
        text = " ".join(printable(text).split())  # a recipe's file name, a registry's text
        if self.mode == "rich":
            from rich.markup import escape  # noqa: PLC0415

            self._rich_status().update(f"[bold]{escape(text)}[/]")
            return
        now = self.clock()
        if not always and now - self._last.get(kind, float("-inf")) < self.interval_s:
            return
        self._last[kind] = now
        self.stream.write(f"[{now - self._started:6.1f}s] {text}\n")
        self.stream.flush()

    def _rich_status(self) -> Any:
        if self._status is None:
            from rich.console import Console  # noqa: PLC0415

            self._status = Console(file=self.stream).status("starting")
            self._status.start()
        return self._status

    def close(self) -> None:
        """Stop the status line (rich); plain and quiet have nothing to stop."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


QUIET = Progress("quiet")


def for_command(*, quiet: bool, stream: TextIO | None = None) -> Progress:
    """The progress a command shows: quiet with ``-q``; rich when stdout and stderr are both a
    terminal (someone is watching); plain lines on stderr otherwise (a log, CI, a pipe)."""
    stream = stream if stream is not None else sys.stderr
    if quiet:
        return Progress("quiet", stream=stream)
    watched = sys.stdout.isatty() and getattr(stream, "isatty", lambda: False)()
    return Progress("rich" if watched else "plain", stream=stream)


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


__all__ = ["Progress", "QUIET", "MODES", "for_command"]
