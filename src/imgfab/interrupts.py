"""SIGTERM and SIGHUP stop imgfab the way SIGINT does (issue 21).

Python turns SIGINT into :class:`KeyboardInterrupt`, so every ``with``, ``finally`` and
``except BaseException`` on the way out runs: the ``imgfab-secrets-*`` directory holding
pip.conf (password included) is removed, a render's staging directory is removed, the
``docker build`` child's process group is stopped and a tag it may have moved is taken back.
By default SIGTERM (``docker stop``, a CI runner cancelling a job, ``timeout``) and SIGHUP (a
closed terminal) kill the process outright and skip all of that. :func:`install` makes them
raise :class:`Interrupted`, a ``KeyboardInterrupt``, so they take the same path.

The exit code is the shell's ``128 + signal number``: 130 for SIGINT, 143 for SIGTERM, 129
for SIGHUP (:func:`exit_code`).
"""

from __future__ import annotations

import signal
from types import FrameType

# The signals that get SIGINT's clean-up; SIGINT itself is Python's own KeyboardInterrupt.
HANDLED = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread when a :data:`HANDLED` signal arrives."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise(signum: int, frame: FrameType | None) -> None:
    # One signal starts the clean-up; another one (a supervisor repeating SIGTERM) must not cut
    # it short, so later ones are swallowed. A Python handler, not SIG_IGN: a disposition of
    # SIG_IGN would be inherited by any child started from here on.
    for handled in HANDLED:
        signal.signal(handled, _swallow)
    raise Interrupted(signum)


def _swallow(signum: int, frame: FrameType | None) -> None:
    return None


def install() -> None:
    """Make each :data:`HANDLED` signal raise :class:`Interrupted` in the main thread.

    A signal this process was started ignoring (``nohup`` ignores SIGHUP) stays ignored."""
    for handled in HANDLED:
        if signal.getsignal(handled) is not signal.SIG_IGN:
            signal.signal(handled, _raise)


def exit_code(interrupt: BaseException) -> int:
    """``128 + signum`` of the signal behind ``interrupt`` (SIGINT for a plain
    ``KeyboardInterrupt``)."""
    return 128 + int(getattr(interrupt, "signum", signal.SIGINT))


def signal_name(interrupt: BaseException) -> str:
    """``SIGTERM``, ``SIGHUP`` or ``SIGINT``: the signal behind ``interrupt``."""
    return signal.Signals(int(getattr(interrupt, "signum", signal.SIGINT))).name
