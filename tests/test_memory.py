"""Chapter 1: bytes, FLOPs and the roofline from configs; measurements on the current device."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_model
from transformers import CONFIG_MAPPING, AutoModelForCausalLM, BertConfig, MixtralConfig, Qwen2Config

from specdec_ref.measure import (
    decode_bandwidth,
    latency_curves,
    measure_bandwidth,
    measure_matmul,
    measure_pass_latency,
    streamed_weight_bytes,
)
from specdec_ref.memory import (
    arithmetic_intensity,
    bandwidth_floor,
    bytes_per_element,
    count_parameters,
    gpt2_config,
    kv_cache_bytes,
    llama2_70b_config,
    meta_parameter_count,
    model_shape,
    ridge_point,
    roofline_time,
    step_bytes,
    step_flops,
    streamed_parameters,
    weight_bytes,
)


def test_gpt2_small_has_124m_parameters():
    """GPT-2 (124M) from its real config: 124,439,808 parameters, by formula and on the meta device."""
    config = gpt2_config("gpt2")
    assert count_parameters(config) == 124_439_808
    assert meta_parameter_count(config) == 124_439_808


def test_gpt2_xl_has_1_56b_parameters():
    """GPT-2-XL from its real config: 1,557,611,200 parameters, by formula and on the meta device."""
    config = gpt2_config("gpt2-xl")
    assert count_parameters(config) == 1_557_611_200
    assert meta_parameter_count(config) == 1_557_611_200


@pytest.mark.parametrize("name", ["gpt2-medium", "gpt2-large", "llama2-70b", "tiny-llama", "tiny-gpt2-untied"])
def test_formula_count_matches_meta_instantiation(name):
    """The analytic parameter count equals the real module code's, for both families, tied or not."""
    if name == "llama2-70b":
        config = llama2_70b_config()
    elif name == "tiny-llama":
        config = make_model("llama").config
    elif name == "tiny-gpt2-untied":
        config = make_model("gpt2").config
        config.tie_word_embeddings, config.n_inner = False, 100
    else:
        config = gpt2_config(name)
    assert count_parameters(config) == meta_parameter_count(config)


# Llama-like architectures beyond Llama itself: biases, per-head norms, extra norms, fused projections.
LLAMA_LIKE = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "granite", "starcoder2"]


def small_config(model_type: str, *, tied: bool, biases: bool):
    """A small configuration of `model_type`; `biases` switches every bias flag the type has."""
    flags = {"attention_bias": True, "mlp_bias": True, "use_bias": True} if biases else {"use_bias": False}
    return CONFIG_MAPPING[model_type](hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                      bos_token_id=0, eos_token_id=1, pad_token_id=None,
                                      tie_word_embeddings=tied, **flags)


@pytest.mark.parametrize("biases", [False, True], ids=["no-bias-flags", "bias-flags"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("model_type", LLAMA_LIKE)
def test_llama_like_counts_match_meta_instantiation(model_type, tied, biases):
    """Formula = the model transformers builds, for each known type, tied or not, with or without biases."""
    config = small_config(model_type, tied=tied, biases=biases)
    assert count_parameters(config) == meta_parameter_count(config)


def test_qwen2_counts_its_qkv_biases():
    """Qwen2 has biases on q, k and v (none on o or the MLP): d_q + 2 d_kv per layer more than Mistral."""
    qwen2 = small_config("qwen2", tied=True, biases=False)
    mistral = small_config("mistral", tied=True, biases=False)
    shape = model_shape(qwen2)
    assert shape.qkv_bias and not shape.o_bias and not shape.mlp_bias
    per_layer = shape.num_heads * shape.head_dim + 2 * shape.num_kv_heads * shape.head_dim
    assert count_parameters(qwen2) - count_parameters(mistral) == 2 * per_layer


@pytest.mark.parametrize("shape, expected", [
    ((896, 4864, 24, 14, 2, 151936, True), 494_032_768),  # Qwen2.5-0.5B
    ((1536, 8960, 28, 12, 2, 151936, True), 1_543_714_304),  # Qwen2.5-1.5B
    ((3584, 18944, 28, 28, 4, 152064, False), 7_615_616_512),  # Qwen2.5-7B
], ids=["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"])
def test_qwen2_5_shapes_have_their_published_counts(shape, expected):
    """The Qwen2.5 pairs' shapes (tied 0.5B and 1.5B, untied 7B): published counts, formula and meta."""
    hidden, intermediate, layers, heads, kv_heads, vocab, tied = shape
    config = Qwen2Config(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                         tie_word_embeddings=tied)
    assert count_parameters(config) == expected
    assert meta_parameter_count(config) == expected


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "gemma2", "starcoder2"])
def test_streamed_weight_bytes_of_llama_like_models_match_the_formula(model_type):
    """Bytes counted from a (meta-device) model's tensors equal the configuration formula, biases included."""
    for tied in (True, False):
        config = small_config(model_type, tied=tied, biases=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        assert streamed_weight_bytes(model) == streamed_parameters(config) * 4


def test_unknown_model_types_are_refused_by_name():
    """A mixture of experts or an encoder has no known layout: a ValueError names its model_type."""
    with pytest.raises(ValueError, match="'mixtral'"):
        model_shape(MixtralConfig())
    with pytest.raises(ValueError, match="'bert'.*supported model types: gemma"):
        step_bytes(BertConfig(), context=1, dtype="bf16")


def test_llama2_70b_shape_is_a_70b_model():
    """The Llama-2-70B shape counts 68,976,648,192 parameters, the article's "70B"."""
    assert count_parameters(llama2_70b_config()) == 68_976_648_192


def test_gpt2_footprints_match_article():
    """fp32 footprints: GPT-2 about 500 MB, GPT-2-XL about 6 GB (the article's memory table)."""
    small = weight_bytes(gpt2_config("gpt2"), torch.float32)
    xl = weight_bytes(gpt2_config("gpt2-xl"), "fp32")
    assert small == 124_439_808 * 4
    assert xl == 1_557_611_200 * 4
    assert small == pytest.approx(500e6, rel=0.01)
    assert xl == pytest.approx(6.2e9, rel=0.01)
    assert weight_bytes(gpt2_config("gpt2-xl"), "bf16") == xl / 2


def test_article_70b_bf16_at_2tbps_takes_at_least_70ms():
    """70B parameters in bf16 are 140 GB; at 2 TB/s a token takes at least 70 ms."""
    assert weight_bytes(70_000_000_000, "bf16") == 140e9
    assert bandwidth_floor(weight_bytes(70_000_000_000, "bf16"), 2e12) == pytest.approx(0.070)
    real = step_bytes(llama2_70b_config(), context=1, dtype=torch.bfloat16).total
    assert 0.068 < bandwidth_floor(real, 2e12) < 0.070


def test_kv_cache_bytes_hand_computed():
    """KV cache = 2 (K and V) x layers x kv heads x head width x tokens x bytes."""
    assert kv_cache_bytes(gpt2_config("gpt2"), 1024, "fp32") == 2 * 12 * 12 * 64 * 1024 * 4
    # Grouped-query attention: 8 key/value heads instead of 64 shrink the cache eightfold.
    assert kv_cache_bytes(llama2_70b_config(), 4096, "bf16") == 2 * 80 * 8 * 128 * 4096 * 2


def test_streamed_parameters_skip_lookup_tables():
    """A step reads one row of a lookup table: GPT-2 skips wpe; untied Llama skips its input embedding."""
    assert streamed_parameters(gpt2_config("gpt2")) == 124_439_808 - 1024 * 768
    llama = llama2_70b_config()
    assert streamed_parameters(llama) == count_parameters(llama) - 32000 * 8192


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_streamed_weight_bytes_of_a_model_match_the_formula(family):
    """Bytes counted from a model's tensors equal the configuration formula."""
    model = make_model(family)
    assert streamed_weight_bytes(model) == streamed_parameters(model.config) * 4


def test_verification_flops_equal_the_decoding_steps_they_replace():
    """One pass over m tokens does the FLOPs of m decoding steps at contexts C .. C + m - 1."""
    config = gpt2_config("gpt2")
    steps = sum(step_flops(config, context=100 + i) for i in range(8))
    assert step_flops(config, context=100, num_tokens=8) == steps


def test_decode_step_is_about_one_flop_per_byte_and_verification_scales():
    """A bf16 decoding step does about 1 FLOP per byte; an m-token pass about m (same bytes)."""
    config = gpt2_config("gpt2-xl")
    one = arithmetic_intensity(config, context=512, dtype="bf16")
    assert 0.9 < one < 1.1
    assert arithmetic_intensity(config, context=512, dtype="fp32") == pytest.approx(one / 2, rel=0.01)
    for m in (2, 5, 16):
        assert arithmetic_intensity(config, context=512, dtype="bf16", num_tokens=m) == pytest.approx(m * one, rel=0.05)
    assert step_bytes(config, context=512, dtype="bf16", num_tokens=5).weights == step_bytes(
        config, context=512, dtype="bf16").weights


def test_roofline_ridge_point_separates_memory_and_compute_bound():
    """Below the ridge point time is bytes / bandwidth; above it, FLOPs / peak."""
    ridge = ridge_point(989e12, 3.35e12)
    assert ridge == pytest.approx(295.2, rel=1e-3)
    assert roofline_time(1e9, 1e9, peak_flops=989e12, bandwidth=3.35e12) == pytest.approx(1e9 / 3.35e12)
    assert roofline_time(1e12, 1e9, peak_flops=989e12, bandwidth=3.35e12) == pytest.approx(1e12 / 989e12)


def test_bad_arguments_raise_value_errors_naming_them():
    """Unknown dtypes, model types, negative sizes and zero bandwidths are refused by name."""
    with pytest.raises(ValueError, match="dtype"):
        bytes_per_element("fp13")
    with pytest.raises(ValueError, match="model_type"):
        count_parameters(BertConfig())
    with pytest.raises(ValueError, match="context"):
        kv_cache_bytes(gpt2_config(), -1, "fp32")
    with pytest.raises(ValueError, match="bandwidth"):
        bandwidth_floor(1.0, 0)
    with pytest.raises(ValueError, match="name"):
        gpt2_config("gpt3")


def test_bandwidth_and_matmul_measurements_are_positive():
    """A small copy and a small matmul give finite, positive bytes/s and FLOP/s."""
    bandwidth = measure_bandwidth(num_bytes=2**22, repeats=3, warmup=1)
    assert bandwidth.num_bytes == 2**22 and len(bandwidth.timing.samples) == 3
    assert 0 < bandwidth.bytes_per_s < math.inf
    matmul = measure_matmul(size=64, repeats=3, warmup=1)
    assert 0 < matmul.flops_per_s < math.inf


def test_pass_latency_curves_cover_each_dtype_and_leave_the_model_alone():
    """One positive median per pass size, for fp32 and bf16; the caller's model stays fp32."""
    model = make_model("gpt2", layers=2, width=64)
    curves = latency_curves(model, context=16, num_tokens=(1, 4, 8), repeats=2, warmup=1)
    assert set(curves) == {"torch.float32", "torch.bfloat16"}
    for name, curve in curves.items():
        assert curve.dtype == name and curve.num_tokens == (1, 4, 8)
        assert all(0 < m < 1 for m in curve.median_s)
        assert curve.relative[0] == 1.0
        assert len(curve.as_dict()["q3_s"]) == 3
    assert next(model.parameters()).dtype == torch.float32


def test_pass_latency_refuses_passes_beyond_the_context_length():
    """context + the largest pass must fit the model's position table."""
    model = make_model("gpt2", positions=32)
    with pytest.raises(ValueError, match="context length"):
        measure_pass_latency(model, context=30, num_tokens=(1, 4))


def test_decode_bandwidth_is_a_positive_fraction_of_a_given_peak():
    """The achieved bandwidth is the step's bytes over its time, compared with the peak given."""
    model = make_model("llama")
    result = decode_bandwidth(model, context=32, peak_bytes_per_s=1e12, repeats=3, warmup=1)
    assert result.step_bytes == streamed_weight_bytes(model) + kv_cache_bytes(model.config, 32, torch.float32)
    assert result.achieved_bytes_per_s == pytest.approx(result.step_bytes / result.latency_s)
    assert 0 < result.fraction_of_peak < 1
