"""compat/payload.yaml constraints (issue 32): a family the backend's tree leaves open across CUDA
majors is bounded to the stack's, handed to uv as constraints, named in the lock header and
covered by its fingerprint; a payload conflict's refusal names the bound that answers it.

On the frozen compat fixture, with constraints rows written here by hand."""

from __future__ import annotations

import shutil

import pytest
import yaml

from imgfab.errors import CompatibilityError
from imgfab.matrix.compat import load_matrix
from imgfab.payload.lock import LockedPackage, check_packages, format_lock, payload_request
from imgfab.recipe import load_recipe
from imgfab.stack.resolve import resolve

from conftest import FROZEN_COMPAT, FROZEN_RECIPES

ROWS = [
    {"cuda_major": "12", "family": ["cuda-bindings", "cuda-python"],
     "requirements": ["cuda-python>=12.8.0,<13"], "source": "hand-written", "confirmed": True},
    {"cuda_major": "13", "family": ["cuda-bindings", "cuda-core", "cuda-python"],
     "requirements": ["cuda-python>=13.0.0,<14", "cuda-bindings>=13.0.0,<14"],
     "source": "hand-written", "confirmed": True},
]


@pytest.fixture
def compat(tmp_path):
    target = tmp_path / "compat"
    shutil.copytree(FROZEN_COMPAT, target)
    return target


def _with_rows(compat, rows):
    data = yaml.safe_load((compat / "payload.yaml").read_text())
    data["constraints"] = rows
    (compat / "payload.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def _request(compat, name="qwen2-7b-h200"):
    recipe = load_recipe(FROZEN_RECIPES / f"{name}.yaml")
    stack = resolve(recipe, load_matrix(compat)).stack
    return payload_request(recipe, stack, compat), stack


def test_the_rows_of_the_stacks_cuda_major_become_uv_constraints_sorted(compat):
    _with_rows(compat, ROWS)
    request, stack = _request(compat)  # vLLM 0.26.0 on CUDA 13.0.3
    assert stack.cuda == "13.0.3"
    assert request.constraints == ("cuda-bindings>=13.0.0,<14", "cuda-python>=13.0.0,<14")
    twelve, _ = _request(compat, "qwen2-7b-h100")  # vLLM 0.19.1 on CUDA 12.8.2
    assert twelve.constraints == ("cuda-python>=12.8.0,<13",)


def test_the_header_names_them_and_the_fingerprint_covers_them(compat):
    bare, _ = _request(compat)
    _with_rows(compat, ROWS)
    bounded, _ = _request(compat)
    text = format_lock(bounded, [], uv_version="0.13.9")
    assert ("# constraints: cuda-bindings>=13.0.0,<14 cuda-python>=13.0.0,<14 (compat/payload.yaml "
            "constraints for CUDA 13; uv -c: they bound a name, never add one)\n") in text
    assert "# constraints:" not in format_lock(bare, [], uv_version="0.13.9")
    assert bounded.fingerprint() != bare.fingerprint()


def _clash(*names_versions):
    return [LockedPackage(name=n, version=v, hashes=["sha256:0"], urls=[],
                          files={"cuda/bindings/__init__.py": f"sha256={n}"})
            for n, v in names_versions]


def test_a_family_conflict_names_the_bound_that_answers_it(compat):
    _with_rows(compat, ROWS)
    request, stack = _request(compat)
    packages = _clash(("cuda-bindings", "13.5.0"), ("cuda-python", "12.6.2.post1"))
    with pytest.raises(CompatibilityError) as caught:
        check_packages(packages, request, stack.cuda)
    assert caught.value.message == ("distributions install the same file with different bytes: "
                                    "cuda/bindings/__init__.py (cuda-bindings cuda-python)")
    assert caught.value.fix == ("cuda-bindings 13.5.0 and cuda-python 12.6.2.post1 are one family split across "
                                "releases: bound it to the CUDA 13 line with compat/payload.yaml constraints "
                                "(cuda-python>=13.0.0,<14, cuda-bindings>=13.0.0,<14)")


def test_a_family_without_a_row_for_the_stacks_major_asks_for_one(compat):
    _with_rows(compat, ROWS[:1])
    request, stack = _request(compat)
    with pytest.raises(CompatibilityError) as caught:
        check_packages(_clash(("cuda-bindings", "13.5.0"), ("cuda-python", "12.6.2.post1")), request, stack.cuda)
    assert caught.value.fix == ("cuda-bindings 13.5.0 and cuda-python 12.6.2.post1 are one family split across "
                                "releases: add a compat/payload.yaml constraints row for CUDA 13 (rows exist "
                                "for CUDA 12)")


def test_a_conflict_outside_every_family_names_the_release_to_pin_or_the_review(compat):
    _with_rows(compat, ROWS)
    request, stack = _request(compat)
    with pytest.raises(CompatibilityError) as caught:
        check_packages(_clash(("nvidia-cutlass-dsl-libs-base", "4.5.2"), ("nvidia-cutlass-dsl-libs-cu13", "4.5.2")),
                       request, stack.cuda)
    assert caught.value.fix == ("pin backend.version to an older release (compat/payloads.yaml records which "
                                "install cleanly), or, if nvidia-cutlass-dsl-libs-base 4.5.2 and "
                                "nvidia-cutlass-dsl-libs-cu13 4.5.2 may overwrite each other, review the paths "
                                "in compat/payload.yaml file_collisions_allowed")
    assert "indexes" not in caught.value.fix


RECORDING_UV = """#!/bin/sh
# records its argv and the constraints file it was handed, then resolves nothing
printf '%s\\n' "$@" > "{log}"
while [ $# -gt 0 ]; do
    if [ "$1" = "--constraints" ]; then cp "$2" "{log}.constraints"; fi
    shift
done
exit 0
"""


def test_uv_gets_the_constraints_as_a_constraints_file(tmp_path, compat):
    """A recording uv stands in for the real one: the request's constraints reach it as uv's
    --constraints file, one per line (the real uv honours them: tests/integration/test_lock_families.py)."""
    from dataclasses import replace

    from imgfab.payload.lock import resolve_packages

    _with_rows(compat, ROWS)
    request, _ = _request(compat)
    log = tmp_path / "argv"
    uv = tmp_path / "uv"
    uv.write_text(RECORDING_UV.format(log=log))
    uv.chmod(0o755)
    with pytest.raises(FileNotFoundError):  # it wrote no pylock.toml: argv is what we read
        resolve_packages(request, uv=str(uv))
    assert "--constraints" in log.read_text().splitlines()
    assert (tmp_path / "argv.constraints").read_text() == "cuda-bindings>=13.0.0,<14\ncuda-python>=13.0.0,<14\n"
    with pytest.raises(FileNotFoundError):
        resolve_packages(replace(request, constraints=()), uv=str(uv))
    assert "--constraints" not in log.read_text().splitlines()


def test_check_header_names_a_recorded_bound_the_compat_rows_no_longer_give(compat):
    """A lock written under other constraints than compat/payload.yaml gives now: its
    '# constraints:' line is compared, like the other recorded lines."""
    from imgfab.errors import RecipeError
    from imgfab.payload.lock import Lock, check_header

    _with_rows(compat, ROWS)
    written, _ = _request(compat)
    lock = Lock.parse(format_lock(written, [], uv_version="0.13.9", refused="-"))
    _with_rows(compat, [dict(ROWS[1], requirements=["cuda-python>=13.2.0,<14"])])
    now, _ = _request(compat)
    with pytest.raises(RecipeError) as caught:
        check_header(lock, now, "h200.lock", "recipes/h200.yaml")
    assert caught.value.message.startswith(
        "h200.lock:10: its '# constraints:' lines record cuda-bindings>=13.0.0,<14 cuda-python>=13.0.0,<14 "
        "(compat/payload.yaml constraints for CUDA 13; uv -c: they bound a name, never add one), "
        "compat/payload.yaml and the recipe give cuda-python>=13.2.0,<14 (")


def test_the_lock_refusal_carries_the_checks_own_fix(compat, tmp_path, monkeypatch):
    """`imgfab lock`'s refusal: the conflict's own fix (the family bound), then where the
    refusal is recorded; never the unrelated indexes."""
    from imgfab.payload import lock as lockmod

    _with_rows(compat, ROWS)
    recipe = tmp_path / "qwen2-7b-h200.yaml"
    recipe.write_text((FROZEN_RECIPES / "qwen2-7b-h200.yaml").read_text())
    monkeypatch.setattr(lockmod, "_unreachable_refusal", lambda *a: "")
    monkeypatch.setattr(lockmod, "uv_binary", lambda: "uv")
    monkeypatch.setattr(lockmod, "_uv_version", lambda uv: "0.13.9")
    monkeypatch.setattr(lockmod, "resolve_packages", lambda *a, **k: _clash(
        ("cuda-bindings", "13.5.0"), ("cuda-python", "12.6.2.post1")))
    monkeypatch.setattr(lockmod, "inspect_packages", lambda *a, **k: None)
    with pytest.raises(CompatibilityError) as caught:
        lockmod.lock_recipe(str(recipe), compat_dir=compat)
    assert caught.value.fix == ("cuda-bindings 13.5.0 and cuda-python 12.6.2.post1 are one family split across "
                                "releases: bound it to the CUDA 13 line with compat/payload.yaml constraints "
                                "(cuda-python>=13.0.0,<14, cuda-bindings>=13.0.0,<14); the refusal is "
                                "recorded in qwen2-7b-h200.lock")
    assert "# refused: distributions install the same file" in (tmp_path / "qwen2-7b-h200.lock").read_text()
