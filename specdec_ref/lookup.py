"""Prompt lookup: speculation without a draft model (chapter 7).

Much of what a model writes is already in its context: code it is asked to edit,
a document it summarises, names it repeats. Prompt lookup decoding (Saxena, 2023;
the "copy" drafter of Yang et al., 2023, LLMA) drafts by string matching instead of
by a second model: take the last n tokens of the sequence, find an earlier place
where those n tokens occur, and propose the K tokens that followed them there.
`PromptLookupDrafter` tries n = max_ngram_size first, then shorter suffixes down to
n = 1, and takes the *last* earlier occurrence (the most recent copy, usually the
one being edited); no match for any n proposes nothing, and that iteration is one
plain target step (K = 0). Drafts never run past the end of the sequence, so a
match near the end proposes fewer than K tokens.

The drafter has no distribution, so q is a point mass. Write e_x for the one-hot
row on the drafted token x. The general rule of `rejection` with q = e_x:

* accept x with probability min(1, p(x) / q(x)) = min(1, p(x) / 1) = p(x);
* after a rejection, draw from the residual
  r = max(0, p - e_x) / sum(max(0, p - e_x)). For y != x, max(0, p(y) - 0) = p(y);
  for y = x, max(0, p(x) - 1) = 0; the mass is 1 - p(x). So
  r(y) = p(y) / (1 - p(x)) for y != x and r(x) = 0: p without x, renormalised;
* beta = sum_y min(p(y), q(y)) = p(x), and the emitted token follows
  P(y) = min(p(y), e_x(y)) + (1 - beta) r(y)
       = p(x) [y = x] + (1 - p(x)) p(y) / (1 - p(x)) [y != x] = p(y).

So `draft` returns one-hot rows as its q (K, V) and `rejection.accept_reject` runs
unchanged; `rejection.emission_distribution` checks the claim by enumeration. The
proof needs only that each draft is a function of the tokens before it, which a
lookup is. (`transformers` samples y ~ p_i and keeps the draft while y == x_i: the
same law, drawn with different random numbers.) With temperature 0 the rule keeps
drafts while they equal the target's argmax: the target's greedy output, exactly.

Invariant: `lookup_generate` emits a sequence distributed exactly as
`decoder.autoregressive_generate` with the target model and the same
`SamplingConfig`, token for token under greedy decoding.

Where `transformers`' `PromptLookupCandidateGenerator` (`generate(
prompt_lookup_num_tokens=K, max_matching_ngram_size=n)`) differs: it takes the
*first* occurrence (`occurrence="first"` here reproduces its candidates), its n
defaults to 2, and it drops drafts from an EOS on (here an accepted EOS ends the
block instead, as in `decoder`). Which occurrence is copied changes the speed,
never the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

from .decoder import GenerationOutput, GenerationStats, IterationRecord, _cut_after_eos
from .drafting import Draft
from .kv_cache import LogitsSource, make_logits_source
from .rejection import accept_reject
from .sampling import SamplingConfig
from .schedules import DraftLengthSchedule, as_schedule, next_draft_length
from .validation import as_integer, check_generation_args, eos_set
from .validation import vocab_size as model_vocab_size
from .verification import target_distributions


class Drafter(Protocol):
    """Proposes drafts from the sequence alone; the decoder's view of a draft source.

    `draft` may return fewer tokens than asked (0: a plain target step). After each
    iteration the decoder calls `rollback(length)` with the number of tokens of the
    sequence that are final; `forward_calls` counts the drafter's model passes.
    """

    forward_calls: int

    def draft(self, input_ids: torch.Tensor, num_draft_tokens: int, vocab_size: int) -> Draft: ...

    def rollback(self, length: int) -> None: ...


def one_hot_draft(tokens: torch.Tensor, vocab_size: int) -> Draft:
    """A `Draft` whose q rows are point masses on `tokens` (K,): probs (K, V)."""
    probs = torch.zeros(tokens.numel(), vocab_size, device=tokens.device)  # (K, V)
    probs.scatter_(1, tokens.view(-1, 1), 1.0)  # q_i = e_{x_i}
    return Draft(tokens, probs)


@dataclass
class PromptLookupDrafter:
    """Drafts the tokens that followed the last earlier occurrence of the sequence's suffix."""

    max_ngram_size: int = 3  # longest suffix n-gram matched; n then shrinks to 1
    num_draft_tokens: int = 10  # K when the caller gives none (transformers' prompt_lookup_num_tokens)
    occurrence: str = "last"  # "last": most recent earlier match; "first": transformers' choice
    forward_calls: int = 0  # model passes made while drafting: none, ever

    def __post_init__(self) -> None:
        for name in ("max_ngram_size", "num_draft_tokens"):
            value = as_integer(getattr(self, name))
            if value is None or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.occurrence not in ("last", "first"):
            raise ValueError(f"occurrence must be 'last' or 'first', got {self.occurrence!r}")

    def match(self, input_ids: torch.Tensor) -> int | None:
        """Where the proposal starts: the index right after the chosen earlier occurrence of
        the longest matching suffix n-gram; None when no suffix n-gram occurs earlier.

        Raises:
            ValueError: if `input_ids` is not a tensor of shape (1, n).
        """
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.size(0) != 1:
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be a tensor of shape (1, n), got {shape}")
        ids = input_ids[0]  # (n,)
        # Longest suffix first; an n-gram as long as the sequence can only match itself.
        for size in range(min(self.max_ngram_size, ids.numel() - 1), 0, -1):
            windows = ids.unfold(0, size, 1)  # (n - size + 1, size): window j is ids[j : j + size]
            # Every window but the last (the suffix itself) is an earlier occurrence.
            hits = (windows[:-1] == ids[-size:]).all(-1).nonzero().view(-1)  # (matches,)
            if hits.numel():
                return int(hits[-1 if self.occurrence == "last" else 0]) + size
        return None

    def lookup(self, input_ids: torch.Tensor, num_draft_tokens: int) -> torch.Tensor:
        """The proposed continuation, shape (K',) with 0 <= K' <= num_draft_tokens.

        Args:
            input_ids: the sequence so far, shape (1, n).
            num_draft_tokens: the most tokens to propose (K >= 0).

        Raises:
            ValueError: if `input_ids` is not (1, n) or `num_draft_tokens` is not an integer >= 0.
        """
        k = as_integer(num_draft_tokens)
        if k is None or k < 0:
            raise ValueError(f"num_draft_tokens must be an integer >= 0, got {num_draft_tokens!r}")
        start = self.match(input_ids)
        if k == 0 or start is None:
            return input_ids[0, :0]  # (0,): nothing to propose
        # The tokens that followed the match, clipped at the end of the sequence (at least
        # one: an earlier occurrence ends before the last token).
        return input_ids[0, start:start + k]  # (K',)

    def draft(self, input_ids: torch.Tensor, num_draft_tokens: int, vocab_size: int) -> Draft:
        """Propose up to `num_draft_tokens` tokens with one-hot distributions.

        Args:
            input_ids: the sequence so far, shape (1, n).
            num_draft_tokens: the most tokens to propose (K >= 0).
            vocab_size: V, the width of the q rows (the target's vocabulary).

        Returns:
            A `Draft` with tokens (K',) and q = one-hot rows (K', V), on `input_ids`'
            device; K' = 0 when no suffix n-gram occurs earlier.

        Raises:
            ValueError: for a malformed argument or a token id outside [0, vocab_size).
        """
        if as_integer(vocab_size) is None or vocab_size < 1:
            raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
        tokens = self.lookup(input_ids, num_draft_tokens)  # (K',)
        if tokens.numel() and int(tokens.max()) >= vocab_size:
            raise ValueError(f"input_ids holds token {int(tokens.max())}, outside the vocabulary of {vocab_size}")
        return one_hot_draft(tokens.long(), vocab_size)  # (K',), (K', V)

    def rollback(self, length: int) -> None:
        """Nothing to undo: every lookup reads the whole sequence it is given."""


@torch.no_grad()
def drafter_step(
    target: LogitsSource,
    drafter: Drafter,
    sequence: torch.Tensor,
    num_draft_tokens: int,
    vocab: int,
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
    eos: set[int] = frozenset(),
) -> tuple[torch.Tensor, IterationRecord, bool]:
    """One draft-verify-accept iteration with a `Drafter`; the target's cache left ready.

    `decoder.speculative_step` with `drafter.draft` in place of the draft model's
    passes. Arguments and result as there; `vocab` is the target's V.
    """
    n = sequence.size(1)
    # 1. Draft: up to K tokens and their q (one-hot rows for a lookup).
    proposal = drafter.draft(sequence, num_draft_tokens, vocab)  # (K',), (K', V)
    # 2. Verify: one target pass over the K' drafts gives K' + 1 distributions.
    p = target_distributions(target, sequence, proposal.tokens, sampling)  # (K' + 1, V)
    # 3. Accept a prefix of the drafts, then one correction or bonus token.
    emitted = accept_reject(proposal.tokens, proposal.probs, p, generator, greedy=sampling.greedy)
    num_accepted = len(emitted) - 1
    emitted, hit_eos = _cut_after_eos(emitted, eos)
    num_accepted = min(num_accepted, len(emitted))  # no accepted draft after an EOS counts
    new = torch.tensor([emitted], dtype=sequence.dtype, device=sequence.device)  # (1, emitted)
    sequence = torch.cat([sequence, new], dim=1)  # (1, n + emitted)
    # 4. Roll back to the prefix and the accepted drafts; the last token stays unseen.
    keep = min(n + num_accepted, sequence.size(1) - 1)
    target.rollback(keep)
    drafter.rollback(keep)
    return sequence, IterationRecord(proposal.tokens.tolist(), emitted, num_accepted), hit_eos


@torch.no_grad()
def lookup_generate(
    target_model: PreTrainedModel,
    drafter: Drafter,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    num_draft_tokens: int | DraftLengthSchedule | None = None,
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
    eos_token_id: int | list[int] | torch.Tensor | None = None,
    use_cache: bool = True,
) -> GenerationOutput:
    """Generate with a `Drafter` (e.g. `PromptLookupDrafter`) proposing and the target verifying.

    Args:
        target_model: the model whose distribution the output follows.
        drafter: proposes drafts from the sequence (`Drafter`).
        input_ids: the prompt, shape (1, n) with n >= 1.
        max_new_tokens: the most tokens to add (exactly this many unless EOS comes first).
        num_draft_tokens: K asked per iteration, an integer >= 1 or a schedule
            (`schedules`); None: the drafter's own `num_draft_tokens`.
        sampling: temperature / top-k / top-p of the target; temperature 0 is greedy.
        generator: the only source of randomness.
        eos_token_id: stop right after any of these tokens (None: never stop early).
        use_cache: keep a KV cache in the target (False: recompute every pass).

    Returns:
        A `GenerationOutput`; `stats.drafted_tokens` counts the drafts actually
        proposed (fewer than K when a lookup finds no or a short match).

    Raises:
        ValueError / TypeError: for any malformed argument (see `validation`).
    """
    if not callable(getattr(drafter, "draft", None)):
        raise TypeError(f"drafter must have a draft(input_ids, num_draft_tokens, vocab_size) method, "
                        f"got {type(drafter).__name__}")
    if num_draft_tokens is None:
        num_draft_tokens = drafter.num_draft_tokens
    check_generation_args({"target_model": target_model}, input_ids, max_new_tokens, sampling, generator,
                          num_draft_tokens)
    schedule = as_schedule(num_draft_tokens)
    eos, vocab = eos_set(eos_token_id), model_vocab_size(target_model)
    target = make_logits_source(target_model, use_cache)
    sequence, stats, trace = input_ids, GenerationStats(), []
    calls_before = getattr(drafter, "forward_calls", 0)
    while stats.new_tokens < max_new_tokens:
        # K drafts can emit K + 1 tokens: never ask for more than the budget allows.
        k = min(next_draft_length(schedule), max_new_tokens - stats.new_tokens - 1)
        sequence, record, hit_eos = drafter_step(target, drafter, sequence, k, vocab, sampling, generator, eos)
        # The schedule and the counters see the drafts actually proposed (K' <= K),
        # cut at an accepted EOS.
        drafted = len(record.drafted)
        cut = len(record.emitted) == record.num_accepted
        schedule.update(record.num_accepted if cut else drafted, record.num_accepted)
        stats.iterations += 1
        stats.drafted_tokens += drafted
        stats.accepted_tokens += record.num_accepted
        stats.judged_tokens += record.num_judged
        stats.new_tokens += len(record.emitted)
        trace.append(record)
        if hit_eos:
            break
    stats.target_calls = target.forward_calls
    stats.draft_calls = getattr(drafter, "forward_calls", 0) - calls_before
    return GenerationOutput(sequence, stats, trace)
