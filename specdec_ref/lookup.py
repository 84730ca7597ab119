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

`PromptLookupDrafter` is a `drafting.Drafter`, so the decoder of chapter 5 runs it
unchanged: `speculative_generate(target_model, PromptLookupDrafter(), input_ids, ...)`.
Invariant: that call emits a sequence distributed exactly as
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

import torch

from .drafting import Draft
from .validation import as_integer


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
        """Where the proposal starts: the index right after the chosen
        earlier occurrence of the longest matching suffix n-gram; None when
        no suffix n-gram occurs earlier.

        Raises:
            ValueError: if `input_ids` is not a tensor of shape (1, n).
        """
        if (not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2
                or input_ids.size(0) != 1):
            shape = (tuple(input_ids.shape)
                     if isinstance(input_ids, torch.Tensor)
                     else type(input_ids).__name__)
            raise ValueError(
                f"input_ids must be a tensor of shape (1, n), got {shape}")
        ids = input_ids[0]  # (n,)
        # Longest suffix first; an n-gram as long as the sequence can only
        # match itself.
        for size in range(min(self.max_ngram_size, ids.numel() - 1), 0, -1):
            # (n - size + 1, size): window j is ids[j : j + size]
            windows = ids.unfold(0, size, 1)
            # Every window but the last (the suffix itself) is an earlier
            # occurrence.
            hits = (windows[:-1] == ids[-size:]).all(-1)  # (n - size,)
            hits = hits.nonzero().view(-1)  # (matches,)
            if hits.numel():
                chosen = hits[-1 if self.occurrence == "last" else 0]
                return int(chosen) + size
        return None

    def lookup(self, input_ids: torch.Tensor,
               num_draft_tokens: int) -> torch.Tensor:
        """The proposed continuation, shape (K',), 0 <= K' <= num_draft_tokens.

        Args:
            input_ids: the sequence so far, shape (1, n).
            num_draft_tokens: the most tokens to propose (K >= 0).

        Raises:
            ValueError: if `input_ids` is not (1, n) or `num_draft_tokens`
                is not an integer >= 0.
        """
        k = as_integer(num_draft_tokens)
        if k is None or k < 0:
            raise ValueError("num_draft_tokens must be an integer >= 0, "
                             f"got {num_draft_tokens!r}")
        start = self.match(input_ids)
        if k == 0 or start is None:
            return input_ids[0, :0]  # (0,): nothing to propose
        # The tokens that followed the match, clipped at the end of the
        # sequence (at least one: an earlier occurrence ends before the
        # last token).
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
        outside = tokens[(tokens < 0) | (tokens >= vocab_size)]  # one device sync
        if outside.numel():
            raise ValueError(f"input_ids holds token {int(outside[0])}, outside [0, {vocab_size}) "
                             "(the vocabulary): token ids must lie in it")
        return one_hot_draft(tokens.long(), vocab_size)  # (K',), (K', V)

    def rollback(self, length: int) -> None:
        """Nothing to undo: every lookup reads the whole sequence it is given."""
