"""Does a model fit the GPUs it is served on? Model facts, what they need, and the verdicts.

Standard library only: the resolver (:mod:`imgfab.stack.fit`, before anything is built) and the
in-image probe (at start, on the GPUs it sees) use the same arithmetic.

Model facts are the recipe's ``model.facts`` or read from a weights directory
(:func:`read_model_dir`): ``config.json`` (``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads``, ``head_dim`` else ``hidden_size / num_attention_heads``,
``max_position_embeddings``; a multimodal config's ``text_config`` when the top level has none)
and the parameter count summed over the tensor shapes of the ``*.safetensors`` headers.

What serving needs, at least (:func:`need_of`):

- weights: parameters × bytes per parameter of the precision (bf16/fp16 2, fp8 and int8 1,
  int4 AWQ and NVFP4 ½; scales, and layers a quantization leaves in 16 bits, come on top);
- KV cache: 2 (K and V) × layers × KV heads × head size × the KV cache dtype's bytes per token,
  for one sequence of ``max_len`` tokens: vLLM refuses to start when one sequence of
  ``max_model_len`` does not fit its KV cache (vllm/v1/core/kv_cache_utils.py,
  check_enough_kv_cache_memory). ``max_num_seqs`` is a scheduler cap, not a promise that that
  many sequences are resident at full length (vLLM preempts), so it is reported
  (:func:`resident`), never refused.

Activations and CUDA graphs also take memory, so a pass is necessary, not sufficient; a
refusal is certain. What the GPUs offer: ``gpu_memory_utilization`` × each GPU's memory × tp × pp.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass, fields

# The facts, in the recipe's spelling (model.facts.<name>).
FACT_NAMES = ("parameters", "layers", "attention_heads", "kv_heads", "head_size", "max_positions")
# Bytes per parameter of each precision the resolver names (stack.precision).
# gptq: the checkpoint's own bits (4 or 8) are not in the recipe; the smaller one is counted, so
# a refusal stays certain.
WEIGHT_BYTES = {"bf16": 2.0, "fp16": 2.0, "auto": 2.0, "fp8": 1.0, "int8_sq": 1.0,
                "int4_awq": 0.5, "nvfp4": 0.5, "gptq": 0.5}
# A safetensors header is a JSON object of at most this size (the format's own limit is 100 MB).
MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# What a weights directory may make the readers do; beyond each bound is FactsError, not a crash.
# Nesting: Python's JSON decoder recurses (RecursionError near 1,000 levels); a real config.json
# nests 4 levels (text_config.rope_scaling), a safetensors header 3.
MAX_JSON_DEPTH = 64
# Digits of one number: Python refuses int() of more than 4,300, and a long one overflows the
# float arithmetic of the fit check; a tensor dimension or a config value fits in 20 (2**64).
MAX_NUMBER_DIGITS = 40
# Parameters of one tensor, and of the model: a thousand times the largest published model (about
# 2 × 10**12), far below where weights × bytes per parameter leaves a float (10**308).
MAX_PARAMETERS = 10**15
_GB = 1e9


class FactsError(ValueError):
    """A weights directory's config.json or safetensors header cannot be read as model facts."""


@dataclass(frozen=True)
class ModelFacts:
    """What the fit check needs of a model; None where unknown."""

    parameters: int | None = None
    layers: int | None = None
    attention_heads: int | None = None
    kv_heads: int | None = None
    head_size: int | None = None
    max_positions: int | None = None

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def missing(self, names: tuple[str, ...] = FACT_NAMES) -> list[str]:
        return [n for n in names if getattr(self, n) is None]

    def label(self) -> str:
        """``layers=32,parameters=8030261248``: the image label the probe reads back."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.as_dict().items()))

    @classmethod
    def from_label(cls, text: str) -> "ModelFacts":
        values = {}
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            name, _, value = part.partition("=")
            if name not in FACT_NAMES or not value.isdigit():
                raise FactsError(f"bad model fact {part!r}")
            values[name] = int(value)
        return cls(**values)


def _positive(config: dict, key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise FactsError(f"config.json {key} is {value!r}, not a positive whole number")
    return value


def facts_from_config(config: dict) -> ModelFacts:
    """The facts ``config.json`` states (a multimodal model's ``text_config`` when its top level
    has no ``num_hidden_layers``); the parameter count is not among them."""
    if not isinstance(config, dict):
        raise FactsError("config.json is not a JSON object")
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    heads = _positive(config, "num_attention_heads")
    kv = _positive(config, "num_key_value_heads")
    if kv is None and heads is not None:
        kv = heads  # transformers' default: multi-head attention
    head = _positive(config, "head_dim")
    hidden = _positive(config, "hidden_size")
    if head is None and hidden is not None and heads:
        head = hidden // heads
        if not head:  # a head of no width holds no KV cache: no fit could be judged
            raise FactsError(f"config.json hidden_size {hidden} is smaller than its "
                             f"{heads} attention heads, so a head has no size")
    return ModelFacts(layers=_positive(config, "num_hidden_layers"), attention_heads=heads,
                      kv_heads=kv, head_size=head,
                      max_positions=_positive(config, "max_position_embeddings"))


def _number(convert):
    """A ``parse_int``/``parse_float`` hook for :func:`json.loads` that refuses a number of more
    than :data:`MAX_NUMBER_DIGITS` digits before converting it."""
    def parse(text: str):
        if len(text) > MAX_NUMBER_DIGITS:
            digits = sum(c.isdigit() for c in text)
            if digits > MAX_NUMBER_DIGITS:
                raise FactsError(f"a number of {digits} digits, above the bound of {MAX_NUMBER_DIGITS}")
        return convert(text)
    return parse


def _depth(value: object) -> int:
    """How deep ``value`` nests (a scalar 0, ``[]`` 1), counted without recursion and only as
    far as one level past :data:`MAX_JSON_DEPTH`."""
    deepest, pending = 0, [(value, 1)]
    while pending and deepest <= MAX_JSON_DEPTH:
        item, level = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            pending.extend((child, level + 1) for child in children)
    return deepest


def load_json(raw: bytes, where: str) -> object:
    """``raw`` (UTF-8 JSON read from ``where``) parsed within the bounds: nesting
    (:data:`MAX_JSON_DEPTH`) and the digits of a number (:data:`MAX_NUMBER_DIGITS`). Raises
    :class:`FactsError` naming ``where`` and the bound a file exceeds, or that it is not JSON."""
    try:
        value = json.loads(raw.decode("utf-8"), parse_int=_number(int), parse_float=_number(float))
    except RecursionError:
        raise FactsError(f"{where} nests deeper than {MAX_JSON_DEPTH} levels") from None
    except FactsError as exc:
        raise FactsError(f"{where} has {exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FactsError(f"{where} is not valid JSON ({type(exc).__name__})") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise FactsError(f"{where} nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def _open_regular(path: str):
    """``path`` opened for reading when it is a regular file (after symbolic links: a Hugging
    Face cache links each file to its blob); opened without blocking, so a FIFO never hangs
    the reader. Raises FactsError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise FactsError(f"{path} cannot be read: {exc.strerror or type(exc).__name__}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FactsError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def safetensors_parameters(path: str) -> int:
    """The number of parameters in one ``.safetensors`` file: the product of each tensor's
    shape in its header (8 bytes little-endian length, then that much JSON). FactsError for a
    header over :data:`MAX_HEADER_BYTES`, beyond :func:`load_json`'s bounds, or a tensor of
    more than :data:`MAX_PARAMETERS`."""
    handle = _open_regular(path)
    try:
        with handle:
            head = handle.read(8)
            if len(head) != 8:
                raise FactsError(f"{path} is too short for a safetensors header")
            (size,) = struct.unpack("<Q", head)
            if size > MAX_HEADER_BYTES:
                raise FactsError(f"{path} claims a {size}-byte header, above the bound of "
                                 f"{MAX_HEADER_BYTES} bytes")
            raw = handle.read(size)
    except OSError as exc:
        raise FactsError(f"{path}: header unreadable ({type(exc).__name__})") from None
    header = load_json(raw, f"{path}'s header")
    if not isinstance(header, dict):
        raise FactsError(f"{path}: header is not a JSON object")
    total = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        shape = tensor.get("shape") if isinstance(tensor, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                  and d >= 0 for d in shape):
            raise FactsError(f"{path}: tensor {name[:80]!r} has no shape")
        count = 1
        for dim in shape:
            count *= dim
            if count > MAX_PARAMETERS:
                raise FactsError(f"{path}: tensor {name[:80]!r} claims more than {MAX_PARAMETERS} "
                                 f"parameters, the bound")
        total += count
    return total


def read_model_dir(path: str) -> ModelFacts:
    """The facts of the model in directory ``path``: ``config.json`` and the parameters of its
    ``*.safetensors`` files (None without any, or when their headers hold no tensor: such
    headers say nothing of the model's size). Raises :class:`FactsError` without a readable
    config.json, and for a file beyond a bound (:func:`load_json`'s nesting and digits, a
    header's size, :data:`MAX_PARAMETERS` for a tensor and for the whole model)."""
    config_path = os.path.join(path, "config.json")
    try:
        with _open_regular(config_path) as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise FactsError(f"{config_path} cannot be read: {exc.strerror or type(exc).__name__}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise FactsError(f"{config_path} is larger than {MAX_CONFIG_BYTES} bytes, the bound")
    facts = facts_from_config(load_json(raw, config_path))
    names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not names:
        return facts
    parameters = sum(safetensors_parameters(os.path.join(path, n)) for n in names)
    if parameters > MAX_PARAMETERS:
        raise FactsError(f"the *.safetensors files of {path} claim more than {MAX_PARAMETERS} "
                         f"parameters, the bound")
    if not parameters:
        return facts
    return ModelFacts(**(facts.as_dict() | {"parameters": parameters}))


@dataclass(frozen=True)
class Serving:
    """How the model is served: what the fit depends on besides the model."""

    precision: str  # stack.precision: bf16, fp16, fp8, int8_sq, int4_awq, nvfp4
    kv_cache_dtype: str  # auto | fp8
    max_len: int  # serve.max_model_len, else engine.max_seq_len
    utilization: float  # serve.gpu_memory_utilization
    tp: int
    pp: int
    nodes: int = 1  # target.nodes: the replica's GPUs are split evenly over them

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    def label(self) -> str:
        return (f"precision={self.precision},kv={self.kv_cache_dtype},max_len={self.max_len},"
                f"utilization={self.utilization},tp={self.tp},pp={self.pp},nodes={self.nodes}")

    @classmethod
    def from_label(cls, text: str) -> "Serving":
        values = dict(part.partition("=")[::2] for part in text.split(",") if part)
        try:
            return cls(precision=values["precision"], kv_cache_dtype=values["kv"],
                       max_len=int(values["max_len"]),
                       utilization=float(values["utilization"]), tp=int(values["tp"]),
                       pp=int(values["pp"]), nodes=int(values.get("nodes", "1")))
        except (KeyError, ValueError):
            raise FactsError(f"bad serving description {text!r}") from None


@dataclass(frozen=True)
class Need:
    weights: float  # bytes
    kv: float  # bytes
    kv_per_token: float
    tokens: int

    @property
    def total(self) -> float:
        return self.weights + self.kv


def kv_bytes_per_token(facts: ModelFacts, kv_cache_dtype: str) -> float:
    """2 (K and V) × layers × KV heads × head size × the cache dtype's bytes (16-bit unless the
    KV cache dtype is fp8, whatever the weights' precision)."""
    assert facts.layers and facts.kv_heads and facts.head_size
    width = 1.0 if kv_cache_dtype == "fp8" else 2.0
    return 2.0 * facts.layers * facts.kv_heads * facts.head_size * width


def need_of(facts: ModelFacts, serving: Serving) -> Need | None:
    """What the weights and the KV cache take, or None when a fact it needs is unknown."""
    if facts.missing(("parameters", "layers", "kv_heads", "head_size")):
        return None
    assert facts.parameters is not None
    per_token = kv_bytes_per_token(facts, serving.kv_cache_dtype)
    tokens = serving.max_len
    return Need(weights=facts.parameters * WEIGHT_BYTES.get(serving.precision, 2.0),
                kv=per_token * tokens, kv_per_token=per_token, tokens=tokens)


def capacity(memory_bytes: float, utilization: float, gpus: int) -> float:
    """What ``gpus`` GPUs of ``memory_bytes`` each offer serving at ``utilization``."""
    return memory_bytes * utilization * gpus


def gb(n: float) -> str:
    return f"{n / _GB:.1f} GB"


def heads_problem(facts: ModelFacts, tp: int) -> str:
    """Why tensor parallel size ``tp`` cannot split the attention heads, or "" when it can.

    vLLM: the attention heads must divide by tp; KV heads either divide by tp or (fewer KV heads
    than tp) tp divides by them, each replicated (vllm/model_executor/layers/linear.py,
    QKVParallelLinear; vllm/config: "Total number of attention heads must be divisible by tensor
    parallel size")."""
    heads, kv = facts.attention_heads, facts.kv_heads
    if heads is not None and heads % tp:
        return f"{heads} attention heads are not divisible by tensor parallel size {tp}"
    if kv is not None and (kv % tp if kv >= tp else tp % kv):
        return f"{kv} KV heads cannot be split across tensor parallel size {tp}"
    return ""


def tensor_parallel_sizes(facts: ModelFacts, limit: int = 64) -> list[int]:
    """Every tp from 1 to ``limit`` that splits the heads (all of them without head facts)."""
    return [t for t in range(1, limit + 1) if not heads_problem(facts, t)]


def positions_problem(facts: ModelFacts, max_len: int) -> str:
    if facts.max_positions is not None and max_len > facts.max_positions:
        return (f"max length {max_len} is above the model's {facts.max_positions} positions "
                f"(max_position_embeddings)")
    return ""


def memory_problem(need: Need, *, memory_bytes: float, serving: Serving, gpus_text: str) -> str:
    """The numbers of a model that does not fit, or "" when it does."""
    have = capacity(memory_bytes, serving.utilization, serving.gpus)
    if need.total <= have:
        return ""
    if need.weights > have:
        return (f"needs {gb(need.weights)} of weights ({need_text(need, serving)}), "
                f"{gpus_text} hold {gb(have)} at {serving.utilization}")
    return (f"needs {gb(need.weights)} of weights + {gb(need.kv)} of KV cache "
            f"({need.tokens} tokens), {gb(need.total)} in all; {gpus_text} hold {gb(have)} "
            f"at {serving.utilization}")


def need_text(need: Need, serving: Serving) -> str:
    params = need.weights / WEIGHT_BYTES.get(serving.precision, 2.0)
    return f"{params / 1e9:.1f}B parameters in {serving.precision}"


def resident(need: Need, *, memory_bytes: float, serving: Serving) -> int:
    """How many tokens the KV cache holds once the weights are loaded (at least ``need.tokens``
    when the model fits)."""
    have = capacity(memory_bytes, serving.utilization, serving.gpus)
    return max(0, int((have - need.weights) // need.kv_per_token))


def fit_line(need: Need, *, memory_bytes: float, serving: Serving, gpus_text: str) -> str:
    have = capacity(memory_bytes, serving.utilization, serving.gpus)
    return (f"{gb(need.weights)} of weights + {gb(need.kv)} of KV cache ({need.tokens} tokens) "
            f"= {gb(need.total)} ≤ {gb(have)} ({gpus_text} at {serving.utilization})")
