"""`imgfab smoke --synthetic-model` writes the model it serves into a directory only the image's
user can use (issue 34, class 8): mode 0700 and owned by the image's uid when imgfab runs as root
or as that uid; otherwise mode 0777 but reachable only through a 0700 parent of imgfab's own
(the engine resolves a bind mount's source itself). Never a 0777 directory anyone can reach.

The engine is a stand-in that records what the generator's container would be given, then
stops the smoke; who imgfab runs as is patched, so each case runs as any user.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from imgfab.errors import EngineError
from imgfab.ops import smoke_shapes

LABELS = {"org.imgfab.model.mount": "/models/qwen2-7b", "org.imgfab.model.id": "Qwen/Qwen2-7B-Instruct",
          "org.imgfab.serve.port": "8000", "org.imgfab.shm.min_bytes": "1048576",
          "org.imgfab.backend": "vllm"}


class GeneratorEngine:
    """Holds the image; records the synthetic directory the generator would write, then fails."""

    def __init__(self):
        self.seen: dict[str, object] = {}

    def has_image(self, ref):
        return True

    def inspect_image(self, ref):
        return {"Config": {"User": "10001:10001", "Labels": LABELS}}

    def run_python(self, image, script, args, *, mounts):
        ((source, target, read_only),) = [m for m in mounts if m[1] == "/synthetic"]
        directory = Path(source)
        self.seen = {"directory": directory, "read_only": read_only,
                     "mode": stat.S_IMODE(directory.stat().st_mode),
                     "parent": directory.parent, "parent_mode": stat.S_IMODE(directory.parent.stat().st_mode),
                     "parent_owner": directory.parent.stat().st_uid}
        raise EngineError("stop here", field="engine")


@pytest.fixture
def run_as(monkeypatch):
    """Run imgfab as ``euid``; chown is recorded, never done (so any user can run the test)."""
    chowned: list[tuple[str, int, int]] = []

    def patch(euid: int) -> list[tuple[str, int, int]]:
        monkeypatch.setattr(os, "geteuid", lambda: euid)
        monkeypatch.setattr(os, "chown", lambda path, uid, gid: chowned.append((str(path), uid, gid)))
        return chowned
    return patch


def _smoke_synthetic() -> dict[str, object]:
    engine = GeneratorEngine()
    with pytest.raises(EngineError, match="stop here"):
        smoke_shapes.smoke_command("img:1", weights=None, architecture="Qwen2ForCausalLM", engine=engine)
    return engine.seen


def test_as_root_the_model_directory_is_0700_and_given_to_the_image_s_user(run_as):
    chowned = run_as(0)
    seen = _smoke_synthetic()
    assert seen["mode"] == 0o700 and seen["read_only"] is False
    assert chowned == [(str(seen["directory"]), 10001, -1)]
    assert seen["parent_mode"] == 0o700 and seen["parent_owner"] == os.getuid()
    assert not Path(seen["parent"]).exists(), "removed afterwards, parent and all"


def test_as_the_image_s_own_user_the_model_directory_is_0700_without_a_chown(run_as):
    chowned = run_as(10001)
    seen = _smoke_synthetic()
    assert (seen["mode"], seen["parent_mode"], chowned) == (0o700, 0o700, [])


def test_as_another_user_the_open_directory_sits_behind_a_private_parent(run_as):
    chowned = run_as(1000)
    seen = _smoke_synthetic()
    assert (seen["mode"], seen["parent_mode"], chowned) == (0o777, 0o700, [])
    assert not Path(seen["parent"]).exists()
