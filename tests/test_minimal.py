"""The 30-line `minimal.speculative_sample` emits the package's tokens for the same random numbers."""

import ast
import inspect

import pytest
import torch

import specdec_ref.minimal as minimal_module
import specdec_ref.rejection as rejection
from specdec_ref.decoder import speculative_generate
from specdec_ref.laws import small_random_pair
from specdec_ref.minimal import speculative_sample
from specdec_ref.sampling import GREEDY, SamplingConfig

PROMPT = torch.tensor([[1, 2, 3]])


@pytest.fixture(scope="module")
def small_pair():
    """A random target / draft pair on 16 tokens whose p and q disagree (many rejections)."""
    return small_random_pair(16, seed=4)


def as_callable(model):
    """A model as the minimal version wants it: ids (L,) -> logits (L, V)."""
    return lambda ids: model(ids[None], use_cache=False).logits[0]


def both(pair, sampling, seed, k, new):
    """(the package's new tokens, the minimal version's), each from its own generator seeded alike."""
    target, draft = pair
    ours = speculative_generate(target, draft, PROMPT, max_new_tokens=new, num_draft_tokens=k,
                                sampling=sampling, generator=torch.Generator().manual_seed(seed),
                                use_cache=False)
    minimal = speculative_sample(as_callable(target), as_callable(draft), PROMPT[0], new, k,
                                 sampling.temperature, torch.Generator().manual_seed(seed))
    return ours.sequences[0].tolist(), minimal.tolist()


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0), GREEDY, SamplingConfig(temperature=0.7)],
                         ids=["T=1", "greedy", "T=0.7"])
@pytest.mark.parametrize("k", [1, 3])
def test_minimal_version_emits_the_package_tokens(small_pair, sampling, k):
    """Same seed, same tokens, token for token, over several seeds and budgets (K shrinks at the end)."""
    for seed in range(4):
        ours, minimal = both(small_pair, sampling, seed, k, new=13)
        assert minimal == ours, f"seed {seed}"
        assert len(minimal) == PROMPT.size(1) + 13


def test_the_comparison_sees_a_changed_residual(small_pair, monkeypatch):
    """The test can fail: give the package the article's rule (resample from p after a
    rejection) and, for the same random numbers, the two part."""
    monkeypatch.setattr(rejection, "residual_distribution", lambda p, q: p)
    parted = [seed for seed in range(4)
              if (lambda pair: pair[0] != pair[1])(both(small_pair, SamplingConfig(), seed, 3, new=13))]
    assert parted, "a wrong residual went unseen"


def test_the_minimal_version_stands_alone():
    """It imports torch and the standard library only: it can be copied out of the package."""
    tree = ast.parse(inspect.getsource(minimal_module))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] if node.module else "." for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.level == 0}
    relative = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    assert not relative, f"imports from the package: {relative}"
    assert imported <= {"torch", "__future__", "collections"}, imported
