"""Drafting: the small model guesses K tokens, one at a time (chapter 2).

The draft model runs autoregressively: it looks at the sequence so far, turns its
logits into the distribution it actually samples from (`logits_to_probs`), draws a
token, appends it, and repeats K times.

What it returns matters as much as the tokens: the *full* processed distribution
q_i(.) at every step, shape (K, V). The rejection step needs q_i(x) for the drafted
token x (to accept with probability min(1, p_i(x) / q_i(x))) *and* q_i(.) over the
whole vocabulary (to form the residual max(0, p_i - q_i) after a rejection). Keeping
only the scalar q_i(x), as the source article does, makes the residual impossible.

The decoder asks for drafts through one small protocol, `Drafter`: "given the
sequence so far, propose up to K tokens with their q rows", plus a `rollback` after
each iteration. `ModelDrafter` is a draft model behind it; chapter 7's
`lookup.PromptLookupDrafter` drafts by string matching, with one-hot q rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel

from .kv_cache import FullForward, LogitsSource, fresh_source, is_logits_source
from .sampling import SamplingConfig, logits_to_probs, sample
from .validation import check_drafter


@dataclass
class Draft:
    """K drafted tokens and the distributions they were drawn from."""

    # The drafted token ids, shape (K,).
    tokens: torch.Tensor
    # q: the processed draft distribution at each drafted position, shape (K, V).
    probs: torch.Tensor


def as_logits_source(model: PreTrainedModel | LogitsSource) -> LogitsSource:
    """Wrap a bare model in a cache-free `FullForward`; pass a source through."""
    return FullForward(model) if isinstance(model, PreTrainedModel) else model


@torch.no_grad()
def draft_tokens(
    draft_model: PreTrainedModel | LogitsSource,
    input_ids: torch.Tensor,
    num_draft_tokens: int,
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
) -> Draft:
    """Let the draft model propose `num_draft_tokens` tokens after `input_ids`.

    Args:
        draft_model: the small model, or a `LogitsSource` wrapping it (with a
            cache).
        input_ids: the sequence so far, shape (1, n).
        num_draft_tokens: K, how many tokens to propose (0 proposes nothing).
        sampling: temperature / top-k / top-p, the same as the target uses.
        generator: the only source of randomness.

    Returns:
        A `Draft` with tokens (K,) and their full distributions q (K, V).
    """
    source = as_logits_source(draft_model)
    sequence = input_ids
    tokens, probs = [], []
    for _ in range(num_draft_tokens):
        # One draft forward pass: logits at the last position only.
        logits = source.last_logits(sequence, 1)  # (1, V)
        q = logits_to_probs(logits, sampling)  # (1, V)
        if sampling.greedy:
            token = q.argmax(-1)  # (1,)
        else:
            token = sample(q, generator).to(q.device)  # (1,)
        tokens.append(token)
        probs.append(q)
        token = token[None].to(sequence.device)  # (1, 1)
        sequence = torch.cat([sequence, token], dim=1)  # (1, n + i + 1)
    if not tokens:
        vocab = source.model.get_output_embeddings().weight.size(0)
        return Draft(torch.empty(0, dtype=torch.long, device=input_ids.device),
                     torch.empty(0, vocab, device=input_ids.device))
    tokens = torch.cat(tokens).to(input_ids.device)  # (K,)
    return Draft(tokens, torch.cat(probs))  # (K,), (K, V)


class Drafter(Protocol):
    """Anything that drafts from the sequence alone: the decoder's view.

    `draft` may return fewer tokens than asked (none: that iteration is one
    plain target step). After each iteration the decoder calls
    `rollback(length)` with the number of tokens of the sequence that are
    final; `forward_calls` counts the drafter's model passes.
    """

    forward_calls: int

    def draft(self, input_ids: torch.Tensor, num_draft_tokens: int,
              vocab_size: int) -> Draft:
        """Up to `num_draft_tokens` tokens after `input_ids` (1, n), with q
        rows (K', V)."""
        ...

    def rollback(self, length: int) -> None:
        """Forget everything past the first `length` tokens of the sequence."""
        ...


@runtime_checkable
class SamplingDrafter(Protocol):
    """A drafter whose q depends on the sampling configuration: it takes the
    decoder's sampling (and generator, where it has none) before each
    generation, or refuses a mismatch, so that p and q are processed alike."""

    def bind(self, sampling: SamplingConfig,
             generator: torch.Generator | None) -> Drafter: ...


@runtime_checkable
class LengthCheckingDrafter(Protocol):
    """A drafter that reads the sequence in tokens of its own, so checks up
    front that a generation fits its draft model's context."""

    def check_length(self, input_ids: torch.Tensor,
                     max_new_tokens: int) -> None: ...


def is_drafter(obj: object) -> bool:
    """Whether `obj` drafts by itself (has a `draft` method), rather than being a model."""
    return callable(getattr(obj, "draft", None))


class ModelDrafter:
    """A draft model as a `Drafter`: `draft_tokens` over a logits source.

    Built without `sampling` (or `generator`), it takes the decoder's: the
    sampling configuration is given once, to `speculative_generate`. One
    built with a sampling configuration other than the decoder's is refused
    (`bind`), so that p and q are always processed alike.
    """

    def __init__(self, source: PreTrainedModel | LogitsSource,
                 sampling: SamplingConfig | None = None,
                 generator: torch.Generator | None = None) -> None:
        self.source = as_logits_source(source)
        self.sampling = sampling
        self.generator = generator

    @property
    def forward_calls(self) -> int:
        """The draft model's forward passes so far."""
        return self.source.forward_calls

    def bind(self, sampling: SamplingConfig,
             generator: torch.Generator | None) -> ModelDrafter:
        """This drafter with the decoder's sampling and generator where it
        has none of its own (the same cache: `source` is shared)."""
        if self.sampling is not None and self.sampling != sampling:
            raise ValueError(
                f"the drafter's sampling ({self.sampling}) differs from the "
                f"decoder's ({sampling}): build ModelDrafter without sampling, "
                "and it takes speculative_generate's")
        if self.sampling is not None and self.generator is not None:
            return self
        return ModelDrafter(self.source, sampling, self.generator or generator)

    def draft(self, input_ids: torch.Tensor, num_draft_tokens: int,
              vocab_size: int) -> Draft:
        """Exactly `num_draft_tokens` tokens from the draft model
        (`vocab_size` is its own)."""
        if self.sampling is None:
            raise ValueError(
                "this ModelDrafter has no sampling configuration: pass it to "
                "speculative_generate (which hands it its own) or build it "
                "with one")
        return draft_tokens(self.source, input_ids, num_draft_tokens,
                            self.sampling, self.generator)

    def rollback(self, length: int) -> None:
        """Crop the draft model's cache to the first `length` tokens."""
        self.source.rollback(length)


def as_drafter(draft_model: PreTrainedModel | LogitsSource | Drafter,
               sampling: SamplingConfig, generator: torch.Generator | None,
               use_cache: bool = True) -> Drafter:
    """What the decoder drafts through, given what the user passed.

    A model gets a cache of its own, a logits source is used with its cache
    emptied (`fresh_source`); either is wrapped in a `ModelDrafter` with the
    decoder's sampling and generator. A drafter with `bind` (a
    `SamplingDrafter`: `ModelDrafter`, `cross_drafting.SharedVocabDrafter`,
    a draft head's)
    takes them where it has none; any other drafter is checked
    (`check_drafter`) and used as it is, its cache emptied.

    Raises:
        TypeError: naming `draft_model`, for anything else.
    """
    if is_drafter(draft_model):
        check_drafter(draft_model)
        draft_model.rollback(0)  # it may hold an earlier call's cache
        if isinstance(draft_model, SamplingDrafter):
            return draft_model.bind(sampling, generator)
        return draft_model
    if isinstance(draft_model, PreTrainedModel) or is_logits_source(draft_model):
        source = fresh_source(draft_model, use_cache)
        return ModelDrafter(source, sampling, generator)
    raise TypeError(
        "draft_model must be a transformers PreTrainedModel, a logits source "
        "(e.g. fast.LeanForward) or a Drafter (with draft(input_ids, "
        "num_draft_tokens, vocab_size) and rollback(length)), got "
        f"{type(draft_model).__name__}")
