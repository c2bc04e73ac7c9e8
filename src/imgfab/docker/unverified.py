"""No tag is left on an image that verify has not passed (issue 21).

``docker build --tag`` names the image as soon as the daemon has exported it, before imgfab
has verified it. If the build is then stopped (SIGTERM, SIGHUP, SIGINT: :mod:`imgfab.interrupts`)
or fails between the build and the end of verify, the tag would keep naming an unverified image
that a later ``docker push`` or ``docker run`` would take for a checked one.

:class:`UnverifiedTags` records which image each tag names before the build and, when its block
ends without :meth:`UnverifiedTags.verified`, removes every tag that now names a different
image. A tag that still names what it named before (a failed build tags nothing) is kept, so an
interrupted rebuild never takes the name of the image an earlier build verified.
"""

from __future__ import annotations

from types import TracebackType

from imgfab.docker import engine
from imgfab.errors import EngineError


def tag_target(ref: str) -> str | None:
    """The image id ``ref`` names now; None when it names none or the engine cannot say."""
    try:
        return str(engine.inspect_image(ref).get("Id") or "") or None
    except (EngineError, OSError):  # OSError: requests' errors when the engine goes away
        return None


class UnverifiedTags:
    """``with UnverifiedTags(tags) as hold: build; verify; hold.verified()``."""

    def __init__(self, tags: list[str] | tuple[str, ...]):
        self.tags = list(tags)
        self.before: dict[str, str | None] = {}
        self.passed = False

    def __enter__(self) -> UnverifiedTags:
        self.before = {ref: tag_target(ref) for ref in self.tags}
        return self

    def verified(self) -> None:
        """The image the tags name has passed: they stay when the block ends."""
        self.passed = True

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.passed:
            return
        for ref in self.tags:
            now = tag_target(ref)
            if now is not None and now != self.before.get(ref):
                try:
                    engine.remove_image(ref)
                except EngineError:  # best effort: the error that ended the block is the one to show
                    continue
