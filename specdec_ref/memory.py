"""Why decoding is memory-bound: bytes moved, FLOPs done, and the roofline (chapter 1).

A decoding step at batch size 1 multiplies one token's activations by every weight
matrix of the model, so it reads every weight once from memory and does about two
floating-point operations per weight. A GPU (or CPU) can do hundreds of operations in
the time it loads one byte, so the step waits on memory, not on arithmetic:

    time per token >= bytes read per step / memory bandwidth

(the article's example: 70B parameters in bf16 are 140 GB; at 2 TB/s that is at least
70 ms per token, however fast the arithmetic units are). A verification pass over m
tokens reads the same bytes and does m times the arithmetic, so until its arithmetic
intensity (FLOPs per byte) reaches the device's ridge point it costs about as much as
one decoding step. That is the whole economic argument of speculative decoding.

Invariant: every quantity here is computed from a model's configuration alone,
without allocating its weights; `count_parameters` agrees exactly with a model
instantiated on the meta device (`meta_parameter_count`), for GPT-2 and for the
Llama-like architectures whose layout is listed in `_LAYOUTS` (Llama, Mistral,
Qwen2, Qwen3, Gemma, ...). Measurements on the current device live in `measure`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, PretrainedConfig

from .validation import check_integer

# Bytes per stored number, by the names readers meet in papers and model cards.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2,
    "fp8": 1, "int8": 1, "int4": 0.5,
}

# The four released GPT-2 sizes: (layers, width, heads); vocabulary 50257, 1024 positions.
GPT2_SIZES: dict[str, tuple[int, int, int]] = {
    "gpt2": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt2-large": (36, 1280, 20),
    "gpt2-xl": (48, 1600, 25),
}



def bytes_per_element(dtype: torch.dtype | str) -> float:
    """Bytes one number takes: a `torch.dtype` or a name such as "bf16" or "int4"."""
    if isinstance(dtype, torch.dtype):
        return float(dtype.itemsize)
    if isinstance(dtype, str) and dtype.lower() in DTYPE_BYTES:
        return float(DTYPE_BYTES[dtype.lower()])
    raise ValueError(f"dtype must be a torch.dtype or one of {sorted(DTYPE_BYTES)}, got {dtype!r}")


def gpt2_config(name: str = "gpt2") -> GPT2Config:
    """The configuration of a released GPT-2 model, built offline (no download)."""
    if name not in GPT2_SIZES:
        raise ValueError(f"name must be one of {sorted(GPT2_SIZES)}, got {name!r}")
    layers, width, heads = GPT2_SIZES[name]
    return GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=50257, n_positions=1024)


def llama2_70b_config() -> LlamaConfig:
    """The shape of Llama-2-70B (80 layers, width 8192, 8 key/value heads): a real "70B model"."""
    return LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096,
                       tie_word_embeddings=False)


@dataclass(frozen=True)
class _Layout:
    """Where one architecture keeps parameters beyond its weight matrices.

    A bias flag is either fixed by the architecture (True/False) or the name of the
    configuration attribute that switches it (Llama's `attention_bias`, for example).
    """

    norm_weights: int  # parameters per channel of one norm: 2 for LayerNorm (scale, shift), 1 for RMSNorm
    norms_per_block: int  # 2 (before attention and before the MLP); Gemma 2 adds one after each
    gated_mlp: bool  # gate, up and down projections (SwiGLU, GeGLU) instead of two matrices
    qkv_bias: bool | str  # biases on the query, key and value projections
    o_bias: bool | str  # a bias on the attention output projection
    mlp_bias: bool | str  # biases on the MLP projections
    qk_norm: bool = False  # an RMSNorm over each head's queries and over its keys (Qwen3)
    learned_positions: bool = False  # a position table (GPT-2); rotary embeddings have no parameters


# The decoder-only architectures whose parameter layout is known here, by `config.model_type`.
# Each one is checked against the model `transformers` builds (tests/test_memory.py).
_LAYOUTS: dict[str, _Layout] = {
    "gpt2": _Layout(2, 2, False, True, True, True, learned_positions=True),
    "llama": _Layout(1, 2, True, "attention_bias", "attention_bias", "mlp_bias"),
    "granite": _Layout(1, 2, True, "attention_bias", "attention_bias", "mlp_bias"),
    "mistral": _Layout(1, 2, True, False, False, False),
    "phi3": _Layout(1, 2, True, False, False, False),  # fused qkv and gate_up: the same counts
    "qwen2": _Layout(1, 2, True, True, False, False),  # biases on q, k and v only
    "qwen3": _Layout(1, 2, True, "attention_bias", "attention_bias", False, qk_norm=True),
    "gemma": _Layout(1, 2, True, "attention_bias", "attention_bias", False),
    "gemma2": _Layout(1, 4, True, "attention_bias", "attention_bias", False),
    "starcoder2": _Layout(2, 2, False, "use_bias", "use_bias", "use_bias"),
}


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that decide its memory traffic."""

    family: str  # config.model_type: "gpt2", "llama", "qwen2", ... (a key of the known layouts)
    num_layers: int  # transformer blocks
    hidden_size: int  # model width d
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (fewer than num_heads with grouped-query attention)
    head_dim: int  # width of one head
    intermediate_size: int  # MLP hidden width
    vocab_size: int  # rows of the embedding table and of the output head
    num_positions: int  # rows of a learned position table (0 for rotary embeddings)
    tied_embeddings: bool  # the output head reuses the input embedding matrix
    norm_weights: int = 1  # parameters per channel of one norm (2: LayerNorm, 1: RMSNorm)
    norms_per_block: int = 2  # norms in one transformer block
    gated_mlp: bool = True  # three MLP matrices (gate, up, down) rather than two
    qkv_bias: bool = False  # biases on the query, key and value projections
    o_bias: bool = False  # a bias on the attention output projection
    mlp_bias: bool = False  # biases on the MLP projections
    qk_norm: bool = False  # per-head norms on queries and keys


def model_shape(config: PretrainedConfig) -> ModelShape:
    """Read a `ModelShape` from a decoder-only `transformers` configuration.

    Known model types: gpt2, and the Llama-like family (llama, mistral, qwen2, qwen3,
    gemma, gemma2, phi3, granite, starcoder2), tied or untied, with their biases.

    Raises:
        ValueError: for a model type whose parameter layout is not known here (a
            mixture of experts, an encoder, a multimodal model), naming the type.
    """
    family = getattr(config, "model_type", None)
    if family not in _LAYOUTS:
        raise ValueError(f"config.model_type {family!r} has no known parameter layout; "
                         f"supported model types: {', '.join(sorted(_LAYOUTS))}")
    layout = _LAYOUTS[family]

    def flag(value: bool | str) -> bool:
        return bool(getattr(config, value, False)) if isinstance(value, str) else value

    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if family == "gpt2":
        intermediate = config.n_inner or 4 * config.hidden_size
    else:
        intermediate = config.intermediate_size
    positions = config.n_positions if layout.learned_positions else 0
    return ModelShape(family, config.num_hidden_layers, config.hidden_size, heads, kv_heads, head_dim,
                      intermediate, config.vocab_size, positions, bool(config.tie_word_embeddings),
                      norm_weights=layout.norm_weights, norms_per_block=layout.norms_per_block,
                      gated_mlp=layout.gated_mlp, qkv_bias=flag(layout.qkv_bias), o_bias=flag(layout.o_bias),
                      mlp_bias=flag(layout.mlp_bias), qk_norm=layout.qk_norm)


def count_parameters(config: PretrainedConfig) -> int:
    """Parameters of the model `config` describes, counted from the formula (tied weights once).

    Raises:
        ValueError: for a model type `model_shape` does not know.
    """
    s = model_shape(config)
    d, attn = s.hidden_size, s.num_heads * s.head_dim
    kv = s.num_kv_heads * s.head_dim
    # Attention: Q, K, V and output projections, their optional biases, optional per-head norms.
    attention = d * attn + 2 * d * kv + attn * d
    attention += s.qkv_bias * (attn + 2 * kv) + s.o_bias * d + s.qk_norm * 2 * s.head_dim
    # MLP: up (and gate) from d to the intermediate width, down back to d, optional biases.
    ups = 2 if s.gated_mlp else 1
    mlp = (ups + 1) * d * s.intermediate_size + s.mlp_bias * (ups * s.intermediate_size + d)
    block = s.norms_per_block * s.norm_weights * d + attention + mlp
    embeddings = s.vocab_size * d + s.num_positions * d
    final_norm = s.norm_weights * d
    head = 0 if s.tied_embeddings else s.vocab_size * d
    return embeddings + s.num_layers * block + final_norm + head


def meta_parameter_count(config: PretrainedConfig) -> int:
    """Parameters of the model built on the meta device: real module code, no memory used."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors are yielded once


def streamed_parameters(config: PretrainedConfig) -> int:
    """Parameters read in full by every decoding step.

    Lookup tables are the exception: a step reads one row of the input embedding and
    of a learned position table, not the whole table. When the output head is tied to
    the input embedding, the head reads the full matrix anyway.
    """
    s = model_shape(config)
    lookups = s.num_positions * s.hidden_size
    if not s.tied_embeddings:
        lookups += s.vocab_size * s.hidden_size
    return count_parameters(config) - lookups


def weight_bytes(model: PretrainedConfig | int, dtype: torch.dtype | str) -> float:
    """Memory footprint of the weights: a configuration's (or a plain parameter count's) bytes."""
    params = model if isinstance(model, int) else count_parameters(model)
    return params * bytes_per_element(dtype)


def kv_cache_bytes(config: PretrainedConfig, context: int, dtype: torch.dtype | str) -> float:
    """Bytes of the keys and values cached for `context` tokens (batch size 1)."""
    check_integer("context", context, minimum=0)
    s = model_shape(config)
    # Every layer stores one key and one value vector per key/value head per token.
    return 2 * s.num_layers * s.num_kv_heads * s.head_dim * context * bytes_per_element(dtype)


@dataclass(frozen=True)
class StepTraffic:
    """Bytes one forward pass moves between memory and the arithmetic units."""

    weights: float  # streamed weights, read once per pass
    kv_read: float  # the context's cached keys and values, read by attention
    kv_write: float  # the new tokens' keys and values, appended to the cache

    @property
    def total(self) -> float:
        """All bytes the pass moves."""
        return self.weights + self.kv_read + self.kv_write


def step_bytes(config: PretrainedConfig, *, context: int,
               dtype: torch.dtype | str, num_tokens: int = 1) -> StepTraffic:
    """Memory traffic of one cached pass over `num_tokens` new tokens.

    Activations and logits are left out: at batch size 1 they are thousands
    of times smaller than the weights. A decoding step is `num_tokens=1`;
    verifying K drafts feeds K + 1 tokens (the last emitted token and the K
    drafts).

    Args:
        config: the model's `transformers` configuration.
        context: tokens already in the KV cache.
        dtype: the number format of weights and cache, e.g. "bf16".
        num_tokens: m, the new tokens in the pass.

    Returns:
        A `StepTraffic`: weights, cache read, cache written (bytes).
    """
    check_integer("num_tokens", num_tokens, minimum=1)
    # Every weight matrix is read once, however many tokens the pass holds.
    weights = streamed_parameters(config) * bytes_per_element(dtype)
    # Attention reads the keys and values of the whole context ...
    kv_read = kv_cache_bytes(config, context, dtype)
    # ... and the pass appends those of its own new tokens.
    kv_write = kv_cache_bytes(config, num_tokens, dtype)
    return StepTraffic(weights, kv_read, kv_write)


def step_flops(config: PretrainedConfig, *, context: int,
               num_tokens: int = 1) -> float:
    """Floating-point operations of one cached pass over `num_tokens` tokens.

    Args:
        config: the model's `transformers` configuration.
        context: tokens already in the KV cache.
        num_tokens: m, the new tokens in the pass.

    Returns:
        FLOPs of the matrix products with the weights plus attention.
    """
    check_integer("context", context, minimum=0)
    check_integer("num_tokens", num_tokens, minimum=1)
    s = model_shape(config)
    # A multiply and an add per streamed weight, for each of the m tokens.
    matmuls = 2 * streamed_parameters(config) * num_tokens
    # Token i of the pass attends to context + i positions (i = 1 .. m).
    attended = num_tokens * context + num_tokens * (num_tokens + 1) // 2
    # Scores (q.k) and mixing (weights @ v): 2 FLOPs each per head channel.
    attention = 4 * s.num_layers * s.num_heads * s.head_dim * attended
    return float(matmuls + attention)


def arithmetic_intensity(config: PretrainedConfig, *, context: int, dtype: torch.dtype | str,
                         num_tokens: int = 1) -> float:
    """FLOPs per byte moved of a cached pass: about 1 for a bf16 decoding step, about m for m tokens."""
    return step_flops(config, context=context, num_tokens=num_tokens) / step_bytes(
        config, context=context, dtype=dtype, num_tokens=num_tokens).total


def bandwidth_floor(num_bytes: float, bandwidth: float) -> float:
    """Least seconds to read `num_bytes` at `bandwidth` bytes/s: the floor on time per token."""
    _check_positive("bandwidth", bandwidth)
    return num_bytes / bandwidth


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The arithmetic intensity (FLOPs/byte) above which a device is compute-bound."""
    _check_positive("peak_flops", peak_flops)
    _check_positive("bandwidth", bandwidth)
    return peak_flops / bandwidth


def roofline_time(flops: float, num_bytes: float, *, peak_flops: float, bandwidth: float) -> float:
    """Roofline estimate of a kernel's time: the slower of doing its FLOPs and moving its bytes."""
    _check_positive("peak_flops", peak_flops)
    _check_positive("bandwidth", bandwidth)
    return max(flops / peak_flops, num_bytes / bandwidth)



def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")
