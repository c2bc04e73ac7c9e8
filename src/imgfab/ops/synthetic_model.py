"""Write a small random-weight model of a given architecture, with a generated tokenizer.

This file is a script, run *inside the image being tested* by ``imgfab smoke
--synthetic-model`` (``python - OUT ARCH`` on stdin, no network): it uses only the image's own
``numpy``, ``safetensors`` and ``tokenizers``, so the model is one that image's transformers
and backend load, and no weights are downloaded. It imports nothing from imgfab.

The model: 2 layers, hidden size 256, 2 attention heads of 128 (1 KV head), a word-level
vocabulary of about 250 English words, numbers and punctuation, 131072 positions, float16
weights from a seeded normal distribution. Its answers are word salad: it proves that the image
starts, loads a checkpoint of the recipe's architecture and serves it, nothing about a model's
quality.

    python - /out Qwen2ForCausalLM < synthetic_model.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HIDDEN = 256
INTERMEDIATE = 512
LAYERS = 2
HEADS = 2
KV_HEADS = 1
HEAD_DIM = HIDDEN // HEADS
POSITIONS = 131072
SEED = 0
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# architecture → (model_type, q/k/v projections carry a bias, extra config keys)
ARCHITECTURES: dict[str, tuple[str, bool, dict]] = {
    "LlamaForCausalLM": ("llama", False, {"attention_bias": False, "mlp_bias": False}),
    "MistralForCausalLM": ("mistral", False, {"sliding_window": None}),
    "Qwen2ForCausalLM": ("qwen2", True, {"use_sliding_window": False, "sliding_window": None,
                                          "max_window_layers": LAYERS}),
}
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = (
    "the a an and or of to in on at for with by from as is are was were be been it this that "
    "what which who how when where why one two three four five six seven eight nine ten "
    "hello world answer question short sentence number name colour color red green blue "
    "yellow primary model server image test token fast small tiny ready good fine yes no "
    "say tell give me you we they user assistant system please thanks sure okay here there"
).split()


def write_tokenizer(out: Path) -> int:
    """A word-level tokenizer (every token a whole word, so any token sequence decodes to text;
    a byte-level BPE's random byte tokens decode to nothing) with a ChatML template; returns
    its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = sorted(set(_WORDS) | {str(n) for n in range(100)} | set(".,!?:;+-=()'\""))
    vocab = {token: i for i, token in enumerate(SPECIALS + ["<unk>"] + words)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins whole words with spaces
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": POSITIONS,
              "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE,
              "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": "<unk>"},
        indent=2) + "\n")
    return tokenizer.get_vocab_size()


def model_config(architecture: str, vocab: int, eos: int, pad: int) -> dict:
    model_type, _, extra = ARCHITECTURES[architecture]
    return {"architectures": [architecture], "model_type": model_type, "vocab_size": vocab,
            "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "hidden_act": "silu",
            "max_position_embeddings": POSITIONS, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "initializer_range": 0.02, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": pad,
            "use_cache": True} | extra


def tensor_shapes(architecture: str, vocab: int) -> dict[str, tuple[int, ...]]:
    """Every weight of the checkpoint, by its Hugging Face name."""
    _, qkv_bias, _ = ARCHITECTURES[architecture]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, HIDDEN),
                                          "model.norm.weight": (HIDDEN,),
                                          "lm_head.weight": (vocab, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        shapes |= {f"{p}.input_layernorm.weight": (HIDDEN,),
                   f"{p}.post_attention_layernorm.weight": (HIDDEN,),
                   f"{p}.self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
                   f"{p}.self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                   f"{p}.self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
                   f"{p}.self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
                   f"{p}.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
                   f"{p}.mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
                   f"{p}.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE)}
        if qkv_bias:
            shapes |= {f"{p}.self_attn.q_proj.bias": (HEADS * HEAD_DIM,),
                       f"{p}.self_attn.k_proj.bias": (KV_HEADS * HEAD_DIM,),
                       f"{p}.self_attn.v_proj.bias": (KV_HEADS * HEAD_DIM,)}
    return shapes


def write_weights(out: Path, architecture: str, vocab: int) -> int:
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(SEED)
    tensors = {}
    for name, shape in sorted(tensor_shapes(architecture, vocab).items()):
        if name.endswith("norm.weight"):
            tensors[name] = np.ones(shape, dtype=np.float16)
        else:
            tensors[name] = (rng.standard_normal(shape) * 0.02).astype(np.float16)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return sum(int(t.size) for t in tensors.values())


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ARCHITECTURES:
        print(f"usage: synthetic_model.py OUT ARCHITECTURE ({', '.join(ARCHITECTURES)})",
              file=sys.stderr)
        return 2
    out, architecture = Path(argv[0]), argv[1]
    out.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(out)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    eos, pad = tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")
    config = model_config(architecture, vocab, eos, pad)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": pad}, indent=2) + "\n")
    parameters = write_weights(out, architecture, vocab)
    print(json.dumps({"architecture": architecture, "vocab_size": vocab,
                      "parameters": parameters, "files": sorted(p.name for p in out.iterdir())}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
