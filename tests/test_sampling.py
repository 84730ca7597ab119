"""The processed distribution is the one transformers' generate samples from."""

import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specdec_ref.sampling import SamplingConfig, logits_to_probs, sample


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(1.0),
        SamplingConfig(0.7),
        SamplingConfig(0.7, top_k=5),
        SamplingConfig(1.3, top_p=0.8),
        SamplingConfig(0.5, top_k=10, top_p=0.9),
        SamplingConfig(1.0, top_k=1),
    ],
)
def test_processing_matches_transformers_warpers(config):
    """Temperature, then top-k, then top-p, exactly as generate's warpers."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0)) * 3
    scores = TemperatureLogitsWarper(config.temperature)(None, logits.clone())
    if config.top_k is not None:
        scores = TopKLogitsWarper(config.top_k)(None, scores)
    if config.top_p is not None:
        scores = TopPLogitsWarper(config.top_p)(None, scores)
    expected = scores.softmax(-1)
    assert torch.allclose(logits_to_probs(logits, config), expected, atol=1e-6)


def test_greedy_is_one_hot_on_first_argmax():
    """Temperature 0 puts all mass on the first maximal logit."""
    logits = torch.tensor([[0.0, 2.0, 2.0, -1.0]])
    probs = logits_to_probs(logits, SamplingConfig(0.0))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]


@pytest.mark.parametrize("temperature", [1e-45, 1e-320, 5e-324])
def test_tiny_temperature_tends_to_greedy(temperature):
    """T -> 0 without overflow: one-hot on the argmax, uniform over tied maxima, never NaN."""
    logits = torch.tensor([[1.0, 3.0, -2.0, 0.5], [2.0, -1.0, 2.0, 0.0]])
    for config in (SamplingConfig(temperature), SamplingConfig(temperature, top_k=2, top_p=0.9)):
        probs = logits_to_probs(logits, config)
        assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.5, 0.0, 0.5, 0.0]]
    # Far from the limit, a small temperature is still the ordinary softmax of logits / T.
    assert torch.allclose(logits_to_probs(logits, SamplingConfig(0.5)), (logits / 0.5).softmax(-1))


def test_top_k_keeps_ties_and_top_p_keeps_the_top_token():
    """Ties with the k-th score survive; a tiny top_p still keeps one token."""
    logits = torch.tensor([[3.0, 1.0, 1.0, 0.0]])
    assert (logits_to_probs(logits, SamplingConfig(1.0, top_k=2)) > 0).sum() == 3
    assert (logits_to_probs(logits, SamplingConfig(1.0, top_p=1e-6)) > 0).sum() == 1


def test_bfloat16_logits_give_float32_probabilities():
    """Probabilities are float32 and normalized whatever the model dtype."""
    probs = logits_to_probs(torch.randn(2, 50).bfloat16(), SamplingConfig(0.8, top_p=0.9))
    assert probs.dtype == torch.float32
    assert torch.allclose(probs.sum(-1), torch.ones(2))


def test_sample_is_reproducible_with_a_generator():
    """The same seed gives the same draws."""
    probs = torch.full((4, 10), 0.1)
    a = sample(probs, torch.Generator().manual_seed(5))
    b = sample(probs, torch.Generator().manual_seed(5))
    assert a.shape == (4,) and torch.equal(a, b)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_bad_sampling_config_names_the_argument(kwargs, name):
    """Each invalid setting raises a ValueError that names it."""
    with pytest.raises(ValueError, match=name):
        SamplingConfig(**kwargs)


def test_generate_kwargs_set_every_parameter_explicitly():
    """transformers' default top_k=50 is switched off explicitly."""
    assert SamplingConfig(1.0).generate_kwargs() == {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    assert SamplingConfig(0.0).generate_kwargs()["do_sample"] is False
