"""``imgfab smoke --weights DIR``: does the model in DIR fit the GPUs its image was built for?
Checked on this host before any container starts, by the resolver's rule.

The facts are read from DIR (``config.json`` and the ``*.safetensors`` headers,
:func:`imgfab.in_image.fit.read_model_dir`) and completed with those the image's recipe
declared (label ``fit.facts``); how the image serves is its label ``fit.serving`` (precision,
KV cache dtype, max length, utilization, tp × pp); each GPU's memory is compat/gpus.yaml's for
the image's label ``gpu``, as the resolver counts it (:mod:`imgfab.stack.fit`). The arithmetic
is :mod:`imgfab.in_image.fit`, the resolver's and the probe's own.

- a max length above the model's positions, heads tp does not split, or weights + KV cache
  above ``utilization`` × memory × tp × pp: :class:`CompatibilityError` (exit 2) with the numbers;
- weights whose facts disagree with the recipe's: :class:`RecipeError` (they are another model's);
- facts missing, an image built before the fit labels, a GPU the matrix does not know: the line
  says plainly that fit was not checked, and smoke goes on.

>>> weights_fit(labels, Path("/srv/llama-405b"))  # doctest: +SKIP
CompatibilityError: meta-llama/Llama-3.1-405B-Instruct does not fit: needs 811.7 GB of weights ...
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from imgfab.errors import CompatibilityError, RecipeError
from imgfab.in_image.fit import (FactsError, ModelFacts, Serving, fit_line, heads_problem,
                                 memory_problem, need_of, positions_problem, read_model_dir)
from imgfab.stack.fit import describe_gpus, gpu_memory_bytes

P = "org.imgfab."
FIX = ("smoke it with the weights it was built for, or rebuild from a recipe that fits them "
       "(`imgfab resolve RECIPE --weights DIR` names the smallest change)")


def weights_fit(labels: Mapping[str, str], weights: Path, matrix: Any = None) -> str:
    """The fit line for the smoke report: ``fits: …`` or ``fit not checked: …``. Raises
    CompatibilityError when the model in ``weights`` cannot be served as the image
    (``labels``) serves it, RecipeError when ``weights`` holds no readable model or another
    model than the image's recipe declares. ``matrix`` defaults to the installed compat data."""
    model = labels.get(f"{P}model.id", "the model")
    if not labels.get(f"{P}fit.serving"):
        return "fit not checked: the image declares no serving shape (built before the fit check)"
    try:
        serving = Serving.from_label(labels[f"{P}fit.serving"])
        declared = ModelFacts.from_label(labels.get(f"{P}fit.facts", ""))
    except FactsError as exc:
        raise RecipeError(f"the image's label fit.*: {exc}", field="IMAGE",
                          fix="rebuild the image with this imgfab") from None
    try:
        read = read_model_dir(str(weights))
    except FactsError as exc:
        raise RecipeError(f"--weights {weights}: {exc}", field="--weights",
                          fix="point --weights at the model's own files "
                              "(config.json, *.safetensors)") from None
    merged = read.as_dict()
    for name, value in declared.as_dict().items():
        if name in merged and merged[name] != value:
            raise RecipeError(f"{weights} says {name} {merged[name]}, but the image was built "
                              f"for {model} with {name} {value}", field="--weights",
                              fix=f"smoke it with {model}'s weights")
        merged[name] = value
    facts = ModelFacts(**merged)
    problem = positions_problem(facts, serving.max_len) or heads_problem(facts, serving.tp)
    if problem:
        raise CompatibilityError(f"{model}: {problem}", field="--weights", fix=FIX)
    need = need_of(facts, serving)
    if need is None:
        missing = facts.missing(("parameters", "layers", "kv_heads", "head_size"))
        return (f"fit not checked: {weights} and the recipe's model.facts lack "
                f"{', '.join(missing)}")
    if matrix is None:
        from imgfab.matrix.compat import load_matrix  # noqa: PLC0415 - only with facts to check

        matrix = load_matrix()
    gpu = matrix.gpu(labels.get(f"{P}gpu", ""))
    if gpu is None:
        return f"fit not checked: compat/gpus.yaml has no GPU {labels.get(f'{P}gpu', '')!r}"
    text = describe_gpus(gpu, serving.gpus)
    memory = gpu_memory_bytes(gpu)
    problem = memory_problem(need, memory_bytes=memory, serving=serving, gpus_text=text)
    if problem:
        raise CompatibilityError(f"{model} does not fit: {problem}", field="--weights", fix=FIX)
    return f"fits: {fit_line(need, memory_bytes=memory, serving=serving, gpus_text=text)}"


__all__ = ["weights_fit"]
