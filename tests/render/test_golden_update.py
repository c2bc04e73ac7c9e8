"""Golden update mode cannot bless itself: ``IMGFAB_UPDATE_GOLDEN=1`` writes the render over a
golden that differs and then fails (pytest exit 1), naming each file it added, removed or
changed, so that a person reads the diff; with nothing to change it passes.

test_golden runs for one recipe in a pytest subprocess, on a copy of that recipe's golden
directory (IMGFAB_GOLDEN_DIR points test_render.py at the copy); the committed golden is the
reference the rewritten files are compared with.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import REPO

RECIPE = "qwen2-7b-h100"
COMMITTED = REPO / "tests" / "golden" / RECIPE


def _golden_test(root, *, update: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "IMGFAB_UPDATE_GOLDEN"}
    env["IMGFAB_GOLDEN_DIR"] = str(root)
    if update:
        env["IMGFAB_UPDATE_GOLDEN"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"tests/render/test_render.py::test_golden[{RECIPE}]"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _tree(directory) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != ".imgfab-render"}


def test_update_mode_writes_the_render_then_fails_naming_each_file(tmp_path):
    golden = tmp_path / RECIPE
    shutil.copytree(COMMITTED, golden)
    dockerfile = golden / "Dockerfile"
    edited = dockerfile.read_text().replace("USER 10001:10001", "USER 10001:10002", 1)
    dockerfile.write_text(edited)
    (golden / "run.sh").unlink()
    (golden / "stale.txt").write_text("a file the render no longer writes\n")

    compared = _golden_test(tmp_path, update=False)
    assert compared.returncode == 1, compared.stdout[-3000:]
    assert "changed: qwen2-7b-h100/Dockerfile" in compared.stdout
    assert dockerfile.read_text() == edited, "without update mode nothing is written"

    updated = _golden_test(tmp_path, update=True)
    assert updated.returncode == 1, updated.stdout[-3000:]
    assert "IMGFAB_UPDATE_GOLDEN=1 wrote 3 golden file(s)" in updated.stdout
    for line in ("changed: qwen2-7b-h100/Dockerfile", "added: qwen2-7b-h100/run.sh",
                 "removed: qwen2-7b-h100/stale.txt"):
        assert line in updated.stdout, updated.stdout[-3000:]
    assert "compose.yaml" not in updated.stdout, "only the files that differed are named"
    assert _tree(golden) == _tree(COMMITTED), "update mode writes the render, nothing else"

    again = _golden_test(tmp_path, update=True)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "1 passed" in again.stdout
