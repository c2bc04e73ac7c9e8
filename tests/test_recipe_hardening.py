"""Recipe input hardening (issue 12): the weights mount is normalised and never collides with a
path the image owns; validators match whole values with ASCII digits; sizes are bounded; YAML
aliases and nesting are limited and errors quote a short excerpt; calibration files stay in
the recipe's directory; only regular files of bounded size are read."""

from __future__ import annotations

import copy
import os
import time

import pytest
import yaml

from imgfab.errors import RecipeError
from imgfab.recipe import load_recipe, parse_recipe

from conftest import RECIPES


@pytest.fixture(scope="module")
def base() -> dict:
    return yaml.safe_load((RECIPES[0].parent / "qwen2-7b-h100.yaml").read_text())


def _with(base: dict, section: str, key: str, value) -> dict:
    data = copy.deepcopy(base)
    data.setdefault(section, {})[key] = value
    return data


@pytest.mark.parametrize("mount", ["/opt/imgfab", "/opt/venv", "/opt/venv/lib", "/etc", "/etc/x",
                                   "/dev/shm", "/run/secrets", "/run/secrets/ca-cert", "/usr",
                                   "/usr/local/cuda", "/home/imgfab", "/home", "/opt", "/",
                                   "//", "/var/cache/imgfab/engines", "/tmp", "/proc/1",
                                   "/models/../etc", "/opt/imgfab/."])
def test_mount_path_colliding_with_the_image_is_refused(base, mount):
    with pytest.raises(RecipeError) as caught:
        parse_recipe(_with(base, "model", "mount_path", mount))
    assert caught.value.field == "model.mount_path"


@pytest.mark.parametrize("mount, normal", [("/models//x", "/models/x"), ("/models/x/.", "/models/x"),
                                           ("/models/./x/", "/models/x"), ("//models/x", "/models/x"),
                                           ("/opt/models", "/opt/models"), ("/srv/llm", "/srv/llm")])
def test_mount_path_is_normalised(base, mount, normal):
    assert parse_recipe(_with(base, "model", "mount_path", mount)).model.mount_path == normal


@pytest.mark.parametrize("section, key, value", [
    ("model", "id", "Qwen/Qwen2-7B\n"),
    ("model", "mount_path", "/models/x\n"),
    ("model", "revision", "a" * 40 + "\n"),
    ("target", "driver", ">=535.104.05\n"),
    ("target", "driver", ">=５３５.104.05"),  # fullwidth digits
    ("target", "driver", ">=\u0665\u0663\u0665"),  # Arabic-Indic digits
    ("serve", "served_model_name", "qwen\n"),
    ("image", "repository", "llm/qwen\n"),
    ("image", "registry", "r.example:5000\n"),
    ("image", "shm_size", "16g\n"),
    ("image", "shm_size", "１６g"),
])
def test_trailing_newlines_and_non_ascii_digits_are_refused(base, section, key, value):
    with pytest.raises(RecipeError) as caught:
        parse_recipe(_with(base, section, key, value))
    assert caught.value.field == f"{section}.{key}"


@pytest.mark.parametrize("size", ["0", "1k", "63m", "1", "65536", "99999999g", "5000g"])
def test_nonsense_shm_sizes_are_refused(base, size):
    with pytest.raises(RecipeError, match="between 64m|a size like"):
        parse_recipe(_with(base, "image", "shm_size", size))


@pytest.mark.parametrize("size", ["64m", "1g", "16G", "4096g", "67108864"])
def test_sane_shm_sizes_pass(base, size):
    assert parse_recipe(_with(base, "image", "shm_size", size)).image.shm_size == size.lower()


@pytest.mark.parametrize("section, key, value", [
    ("image", "repository", "a/" * 200 + "b"),
    ("target", "gpu", "H" * 10000),
    ("backend", "version", "==" + "1." * 5000 + "0"),
    ("image", "registry", "a" * 300),
])
def test_lengths_are_bounded(base, section, key, value):
    with pytest.raises(RecipeError) as caught:
        parse_recipe(_with(base, section, key, value))
    assert len(caught.value.one_line()) < 400


def test_an_error_quotes_a_short_excerpt_only(base):
    data = _with(base, "engine", "quantization", "x" * 100000)
    with pytest.raises(RecipeError) as caught:
        parse_recipe(data)
    assert len(caught.value.one_line()) < 400


def _recipe_file(tmp_path, base, text_extra=""):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(base) + text_extra)
    return path


def test_yaml_alias_bomb_is_refused_quickly_with_a_short_line(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for n in range(1, 9):
        prev, cur = chr(ord("a") + n - 1), chr(ord("a") + n)
        lines.append(f"{cur}: &{cur} [" + ",".join(f"*{prev}" for _ in range(9)) + "]")
    lines.append("name: *i")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size < 1000
    started = time.monotonic()
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    # Only catches a hang: expanding the 9**9 aliases takes minutes and gigabytes; a refusal
    # takes milliseconds, even on a busy CI machine.
    assert time.monotonic() - started < 60
    assert "aliases" in caught.value.one_line()
    assert len(caught.value.one_line()) < 300


def test_a_few_aliases_still_load(tmp_path, base):
    text = yaml.safe_dump(base).replace("shm_size: 16g", "shm_size: &s 16g")
    path = tmp_path / "r.yaml"
    path.write_text(text + "x-extra: *s\n")
    with pytest.raises(RecipeError, match="unknown key"):  # the alias loaded; the key is unknown
        load_recipe(path)


@pytest.mark.parametrize("text, word", [
    ("name: " + "9" * 5000 + "\n", "cannot load"),
    ("name: " + "[" * 5000 + "]" * 5000 + "\n", "deeper"),
])
def test_huge_integers_and_deep_yaml_are_recipe_errors(tmp_path, text, word):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=word):
        load_recipe(path)


def test_only_regular_files_of_bounded_size_are_read(tmp_path):
    with pytest.raises(RecipeError, match="not a regular file"):
        load_recipe("/dev/zero")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(RecipeError, match="not a regular file"):
        load_recipe(fifo)
    assert time.monotonic() - started < 60  # only catches a hang: opening a FIFO blocks forever
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (1024 * 1024) + "\n")
    with pytest.raises(RecipeError, match="larger than"):
        load_recipe(big)
    with pytest.raises(RecipeError, match="not a regular file"):
        load_recipe(tmp_path)


@pytest.mark.parametrize("prompts", ["/etc/passwd", "--privileged", "../x.txt", "a/../../x",
                                     ".hidden", "a/-x", "x.txt\n", "a//b"])
def test_calibration_paths_are_relative_and_plain(base, prompts):
    data = copy.deepcopy(base)
    data["engine"].update(quantization="fp8", calibration={"prompts": prompts})
    with pytest.raises(RecipeError) as caught:
        parse_recipe(data)
    assert caught.value.field.startswith("engine.calibration")


def test_calibration_file_stays_inside_the_recipe_directory(tmp_path, base):
    from imgfab.recipe import calibration_file
    data = copy.deepcopy(base)
    data["engine"].update(quantization="fp8", calibration={"prompts": "calib/prompts.txt"})
    recipe = parse_recipe(data)
    (tmp_path / "calib").mkdir()
    recipe_path = tmp_path / "r.yaml"
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("secret\n")
    (tmp_path / "calib" / "prompts.txt").symlink_to(outside)
    with pytest.raises(RecipeError, match="leaves the recipe's directory"):
        calibration_file(recipe, recipe_path)
    (tmp_path / "calib" / "prompts.txt").unlink()
    os.mkfifo(tmp_path / "calib" / "prompts.txt")
    with pytest.raises(RecipeError, match="not a regular file"):
        calibration_file(recipe, recipe_path)
    (tmp_path / "calib" / "prompts.txt").unlink()
    (tmp_path / "calib" / "prompts.txt").write_text("hello\n")
    assert calibration_file(recipe, recipe_path) == (tmp_path / "calib" / "prompts.txt").resolve()


def test_numeric_recipe_name_is_refused(tmp_path, base):
    path = _recipe_file(tmp_path, {**base, "name": 12345})
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    assert caught.value.field == "name"
