"""The fit check before anything is built: the recipe's model on its GPUs × tp × pp.

:func:`check_fit` takes the model facts the recipe declares (``model.facts``) and, where the
weights are at hand (``imgfab resolve --weights DIR``), those read from them, and raises
:class:`~imgfab.errors.CompatibilityError` with the numbers and the smallest recipe change that
fits when the max length is above the model's positions, tp does not split the heads, or the
weights plus the KV cache do not fit ``gpu_memory_utilization`` × GPU memory × tp × pp. GPU
memory is what the driver reports (compat/gpus.yaml ``reported_mib``,
:func:`imgfab.matrix.gpus.budget_mib`), as vLLM budgets it, not the marketed ``memory_gib``. The
arithmetic is :mod:`imgfab.in_image.fit`, the probe's own. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import replace

from imgfab.errors import CompatibilityError, RecipeError
from imgfab.in_image.fit import (FACT_NAMES, ModelFacts, Need, Serving, capacity, fit_line, gb,
                                 heads_problem, memory_problem, need_of, positions_problem, resident,
                                 tensor_parallel_sizes)
from imgfab.matrix.compat import Gpu, Matrix
from imgfab.matrix.gpus import budget_mib, reported_text
from imgfab.recipe import Recipe

# GPUs one node holds (HGX/DGX boards and the clouds' largest GPU instances: 8): tensor
# parallelism stays inside a node, so a fix never asks for more than this many per stage.
GPUS_PER_NODE = 8
# A shorter max_model_len is offered in steps of this many tokens.
LENGTH_STEP = 256


def serving_of(recipe: Recipe, precision: str) -> Serving:
    """How ``recipe`` serves, for the fit: max length, utilization, tp × pp."""
    return Serving(precision=precision, kv_cache_dtype=recipe.engine.kv_cache_dtype,
                   max_len=max_len_of(recipe),
                   utilization=recipe.serve.gpu_memory_utilization,
                   tp=recipe.target.count, pp=recipe.target.pipeline_parallel,
                   nodes=recipe.target.nodes)


def max_len_of(recipe: Recipe) -> int:
    """The max length the server is started with (the render's rule)."""
    return recipe.serve.max_model_len or recipe.engine.max_seq_len


def _max_len_field(recipe: Recipe) -> str:
    return "serve.max_model_len" if recipe.serve.max_model_len else "engine.max_seq_len"


def declared_facts(recipe: Recipe) -> ModelFacts:
    spec = recipe.model.facts
    return ModelFacts(**spec.model_dump(exclude_none=True)) if spec is not None else ModelFacts()


def merge_facts(recipe: Recipe, read: ModelFacts | None, where: str) -> ModelFacts:
    """The recipe's facts completed with those read from the weights at ``where``; a fact both
    state differently is a RecipeError (one of them describes another model)."""
    declared = declared_facts(recipe)
    if read is None:
        return declared
    merged = read.as_dict()
    for name, value in declared.as_dict().items():
        if name in merged and merged[name] != value:
            raise RecipeError(f"{value} in the recipe, but {where} says {merged[name]}",
                              field=f"model.facts.{name}",
                              fix=f"set model.facts.{name}: {merged[name]}, or point --weights "
                                  "at this recipe's model")
        merged[name] = value
    return ModelFacts(**merged)


def describe_gpus(gpu: Gpu, count: int) -> str:
    """How a fit line names the GPUs: ``8× H100-SXM (80 GiB, 81559 MiB reported)``."""
    return f"{count}× {gpu.name} ({reported_text(gpu)})"


def gpu_memory_bytes(gpu: Gpu) -> float:
    """One GPU's memory as the fit counts it: the total the driver reports
    (:func:`imgfab.matrix.gpus.budget_mib`), in bytes."""
    return budget_mib(gpu) * 2**20


def _fits(facts: ModelFacts, serving: Serving, gpu: Gpu) -> bool:
    need = need_of(facts, serving)
    return need is None or need.total <= capacity(gpu_memory_bytes(gpu), serving.utilization,
                                                  serving.gpus)


def _with(serving: Serving, **changes: int) -> Serving:
    return replace(serving, **changes)


def _more_gpus(facts: ModelFacts, serving: Serving, gpu: Gpu) -> str:
    """target.count (within a node), else target.pipeline_parallel too, that fits on ``gpu``."""
    sizes = [t for t in tensor_parallel_sizes(facts, GPUS_PER_NODE) if t > serving.tp]
    for tp in sizes:
        if _fits(facts, _with(serving, tp=tp), gpu):
            return f"target.count: {tp} ({describe_gpus(gpu, tp * serving.pp)})"
    widest = max(tensor_parallel_sizes(facts, GPUS_PER_NODE) + [serving.tp])
    for pp in range(serving.pp + 1, 65):
        if _fits(facts, _with(serving, tp=widest, pp=pp), gpu):
            count = f"target.count: {widest} and " if widest != serving.tp else ""
            return f"{count}target.pipeline_parallel: {pp} ({describe_gpus(gpu, widest * pp)})"
    return ""


def _bigger_gpu(facts: ModelFacts, serving: Serving, gpu: Gpu, matrix: Matrix) -> str:
    """The matrix GPU with the least memory above ``gpu``'s on which the recipe fits as it is."""
    for other in sorted(matrix.gpus, key=lambda g: (budget_mib(g), g.name)):
        if budget_mib(other) > budget_mib(gpu) and other.cpu_arch == "x86_64" \
                and _fits(facts, serving, other):
            return f"target.gpu: {other.name} ({reported_text(other)})"
    return ""


def _shorter(serving: Serving, gpu: Gpu, recipe: Recipe, need: Need) -> str:
    """A shorter max length that fits (the weights already do)."""
    tokens = resident(need, memory_bytes=gpu_memory_bytes(gpu), serving=serving)
    length = tokens // LENGTH_STEP * LENGTH_STEP
    if length >= 16:
        return f"{_max_len_field(recipe)}: {length} (the KV cache holds {tokens} tokens)"
    return ""


def _fix(facts: ModelFacts, serving: Serving, gpu: Gpu, matrix: Matrix, recipe: Recipe,
         need: Need) -> tuple[str, str]:
    """(field, fix): the smallest change first (serving limits, then GPUs, then a bigger GPU)."""
    have = capacity(gpu_memory_bytes(gpu), serving.utilization, serving.gpus)
    options: list[str] = []
    if need.weights < have:
        options.append(_shorter(serving, gpu, recipe, need))
    options += [_more_gpus(facts, serving, gpu), _bigger_gpu(facts, serving, gpu, matrix)]
    options = [o for o in options if o]
    if not options:
        return "target.gpu", (f"no GPU in compat/gpus.yaml holds it at tp ≤ {GPUS_PER_NODE}: "
                              "quantize it (engine.quantization) or split it across more stages")
    return options[0].split(":", 1)[0], " or ".join(options[:2])


def _nearest_tp(facts: ModelFacts, serving: Serving, gpu: Gpu) -> int:
    sizes = tensor_parallel_sizes(facts, 64)
    return min(sizes, key=lambda t: (not _fits(facts, _with(serving, tp=t), gpu),
                                     abs(t - serving.tp), -t))


def check_fit(recipe: Recipe, matrix: Matrix, gpu: Gpu, precision: str,
              read: ModelFacts | None = None, where: str = "") -> str:
    """The fit line the stack records ("fits: …" or "not checked: …"); raises
    CompatibilityError with the numbers and the smallest fix when the recipe cannot fit."""
    facts = merge_facts(recipe, read, where)
    serving = serving_of(recipe, precision)
    problem = positions_problem(facts, serving.max_len)
    if problem:
        field = _max_len_field(recipe)
        raise CompatibilityError(f"{recipe.model.id}: {problem}", field=field,
                                 fix=f"{field}: {facts.max_positions}")
    problem = heads_problem(facts, serving.tp)
    if problem:
        tp = _nearest_tp(facts, serving, gpu)
        raise CompatibilityError(f"{recipe.model.id}: {problem} (vLLM and TensorRT-LLM split heads "
                                 "evenly across tensor-parallel ranks)", field="target.count",
                                 fix=f"target.count: {tp}")
    need = need_of(facts, serving)
    gpus_text = describe_gpus(gpu, serving.gpus)
    if need is None:
        missing = facts.missing(("parameters", "layers", "kv_heads", "head_size"))
        done = [c for c, names in (("max positions", ("max_positions",)),
                                   ("heads", ("attention_heads",))) if not facts.missing(names)]
        also = f" ({', '.join(done)} checked)" if done else ""
        return (f"not checked: memory fit unknown, model.facts lacks {', '.join(missing)}{also}; "
                "declare them in the recipe or run `imgfab resolve --weights DIR`")
    memory = gpu_memory_bytes(gpu)
    problem = memory_problem(need, memory_bytes=memory, serving=serving, gpus_text=gpus_text)
    if problem:
        field, fix = _fix(facts, serving, gpu, matrix, recipe, need)
        raise CompatibilityError(f"{recipe.model.id} does not fit: {problem}", field=field, fix=fix)
    left = [n for n in FACT_NAMES if n in facts.missing()]
    unchecked = f"; not checked: {', '.join(left)} unknown" if left else ""
    tokens = resident(need, memory_bytes=memory, serving=serving)
    seqs = recipe.limits()[recipe.serve.preset]["max_num_seqs"]
    return (f"fits: {fit_line(need, memory_bytes=memory, serving=serving, gpus_text=gpus_text)}; "
            f"the KV cache holds about {tokens} tokens, {tokens // serving.max_len} sequences at "
            f"full length (max_num_seqs {seqs}){unchecked}")


def per_gpu_need_mib(recipe: Recipe, precision: str) -> int | None:
    """The GPU memory one GPU must have (MiB) for the recipe's share of weights and KV cache at
    its utilization; None when the facts do not say."""
    facts = declared_facts(recipe)
    serving = serving_of(recipe, precision)
    need = need_of(facts, serving)
    if need is None:
        return None
    return -(-int(need.total / serving.gpus / serving.utilization) // 2**20)


__all__ = ["GPUS_PER_NODE", "check_fit", "declared_facts", "describe_gpus", "gb",
           "gpu_memory_bytes", "max_len_of", "merge_facts", "per_gpu_need_mib", "serving_of"]
