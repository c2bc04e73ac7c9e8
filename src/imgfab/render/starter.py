"""A starter recipe for ``imgfab init``: answers → commented YAML that validates and resolves.

:func:`starter_recipe` renders ``templates/recipe.yaml.j2`` from :class:`StarterAnswers`, parses
the text it wrote (the file a newcomer gets is the file that was checked) and resolves it against
the matrix, so the first recipe already has a stack. Errors: :class:`~imgfab.errors.RecipeError`
for an answer the schema refuses (the field is the init flag), CompatibilityError when no stack
fits (with the resolver's fix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import yaml

from imgfab.errors import CompatibilityError, RecipeError
from imgfab.matrix.compat import Matrix
from imgfab.recipe import Recipe, parse_recipe
from imgfab.stack.resolve import Resolution, resolve

# Which init flag answers which recipe field (a refusal names the flag the user typed).
FLAGS = {"name": "--name", "model.id": "--model", "model.revision": "--revision",
         "model.mount_path": "--model", "target.gpu": "--gpu", "target.driver": "--driver",
         "target.driver_policy": "--policy", "backend.name": "--backend",
         "backend.trtllm_path": "--backend", "engine.quantization": "--precision",
         "engine.dtype": "--precision", "image.repository": "--name"}


@dataclass(frozen=True)
class StarterAnswers:
    """What ``imgfab init`` asks: the model and its pinned revision, the GPU, the fleet's
    oldest driver (a version, e.g. 535.104.05), the backend and the precision."""

    model: str
    revision: str | None
    gpu: str
    driver: str
    backend: str = "vllm"
    precision: str = "none"
    policy: str | None = None  # None: strict, else minor-compat when only that fits
    name: str | None = None


def starter_name(model: str, gpu: str) -> str:
    """A DNS-1123 recipe name from the model's last path part and the GPU:
    ``Qwen/Qwen2-7B-Instruct`` on ``H100-SXM`` → ``qwen2-7b-instruct-h100-sxm``."""
    stem = model.rstrip("/").rsplit("/", 1)[-1]
    text = re.sub(r"[^a-z0-9]+", "-", f"{stem}-{gpu}".lower()).strip("-")
    text = re.sub(r"^[^a-z]+", "", text)[:63].rstrip("-")
    return text or "recipe"


# Why a starter recipe that the user gave no --policy says minor-compat: no stack fits under
# strict, or (issue 34) only stacks inside a critical advisory do.
MINOR_COMPAT_NOTE = ("no stack fits this driver under strict; minor-compat runs a newer CUDA "
                     "minor on it, with its limits (imgfab explain target.driver_policy)")
ADVISORY_NOTE = ("under strict this driver fits only stacks inside a critical advisory; "
                 "minor-compat runs a newer CUDA minor on it, with its limits (imgfab explain "
                 "target.driver_policy)")


def starter_text(answers: StarterAnswers, matrix: Matrix, recipe_path: str, *,
                 policy_note: str = "") -> str:
    """The commented YAML of the starter recipe (not yet checked)."""
    from imgfab import __version__  # noqa: PLC0415
    from imgfab.render.context import _environment  # noqa: PLC0415

    gpu = matrix.gpu(answers.gpu)
    gpu_name = gpu.name if gpu is not None else answers.gpu
    name = answers.name or starter_name(answers.model, gpu_name)
    quantization = answers.precision if answers.precision not in ("bfloat16", "float16") else "none"
    dtype = answers.precision if answers.precision in ("bfloat16", "float16") else "bfloat16"
    return _environment().get_template("recipe.yaml.j2").render(
        name=name, model_id=answers.model, revision=answers.revision,
        mount_path=f"/models/{name}", gpu=gpu_name, driver=f">={answers.driver}",
        policy=answers.policy or "strict", policy_note=policy_note, backend=answers.backend,
        trtllm_path="pytorch" if answers.backend == "tensorrt-llm" else None,
        dtype=dtype, quantization=quantization, max_seq_len=8192,
        repository=f"llm/{name}", recipe_path=recipe_path, imgfab_version=__version__)


def starter_recipe(answers: StarterAnswers, matrix: Matrix, recipe_path: str
                   ) -> tuple[str, Recipe, Resolution]:
    """The starter recipe's text, as parsed and as resolved. A refused answer is RecipeError
    naming its init flag (and the recipe field); no fitting stack is CompatibilityError (with
    the resolver's fix). Without ``answers.policy`` the policy is strict, or minor-compat when
    only minor-compat fits the driver (the recipe's comment says so); where minor-compat fits
    only inside a critical advisory, that refusal is the one raised."""
    if answers.policy:
        return _checked(answers, matrix, recipe_path, "")
    try:
        return _checked(replace(answers, policy="strict"), matrix, recipe_path, "")
    except CompatibilityError as strict:
        try:
            return _checked(replace(answers, policy="minor-compat"), matrix, recipe_path,
                            ADVISORY_NOTE if strict.field == "backend.accept_advisories"
                            else MINOR_COMPAT_NOTE)
        except CompatibilityError as minor:
            # A stack fits under minor-compat but only inside a critical advisory: that refusal
            # names the advisory and the way out (forward-compat, where that is it).
            raise (minor if minor.field == "backend.accept_advisories" else strict) from None


def _checked(answers: StarterAnswers, matrix: Matrix, recipe_path: str, note: str
             ) -> tuple[str, Recipe, Resolution]:
    text = starter_text(answers, matrix, recipe_path, policy_note=note)
    try:
        recipe = parse_recipe(yaml.safe_load(text), source=recipe_path)
    except RecipeError as error:
        field = error.field or "recipe"
        flag = FLAGS.get(field)
        error.field = f"{flag} ({field})" if flag else field
        if not error.fix:
            error.fix = f"change {flag or field} (imgfab explain {field})"
        raise
    return text, recipe, resolve(recipe, matrix)
