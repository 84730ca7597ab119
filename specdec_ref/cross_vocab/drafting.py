"""Drafting with another tokenizer: two drafters for the unchanged decoder (chapter 9).

Both are `drafting.Drafter`s, so `speculative_generate` verifies them with the rule
of chapter 4, over the target's vocabulary, untouched. Each round the draft reads
the target's sequence as text re-encoded in its own tokens (`vocab.TokenizerPair`),
with its KV cache kept up to the longest prefix that did not change.

* `TextDrafter` (Universal Assisted Generation, as in `transformers`): the draft
  writes greedily, its text is re-encoded by the target's tokenizer, and the target
  tokens are proposed with one-hot q rows. The proposal is a function of the
  sequence alone, and a function proposed with q = one-hot is exact under any
  sampling (chapter 7's argument for prompt lookup); its tokens may be split where
  the draft never split them, and these rarely survive verification.
* `SharedVocabDrafter` (token-level intersection, Timor et al., ICML 2025): the draft
  samples only from the tokens both vocabularies spell alike (`vocab.SharedVocabulary`),
  its distribution renormalised over them; q is that distribution written over the
  target's vocabulary, zero elsewhere. Any q is exact under the rule, so this is too.

Both read only as far as the draft can: a view the draft has no token for (a lone
special token it has no role for) proposes nothing, and the target steps alone; a
generation whose view could outgrow the draft's context is refused up front
(`check_length`), as a same-tokenizer draft's is.

Invariant: every proposed id is a target id, every q row sums to 1 over the target's
vocabulary and gives its drafted token mass > 0; nothing the draft writes is emitted
before the target has judged it.
"""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..drafting import Draft
from ..kv_cache import CachedForward, make_logits_source
from ..sampling import SamplingConfig, logits_to_probs, sample
from ..validation import context_length, model_device, vocab_size
from .tokenizers import TokenizerPair, id_count, shared_vocabulary


class DraftReader:
    """A draft model reading token lists, its cache cropped to what did not change."""

    def __init__(self, draft_model: PreTrainedModel, draft_tokenizer: PreTrainedTokenizerBase,
                 use_cache: bool = True) -> None:
        if not isinstance(draft_model, PreTrainedModel):
            raise TypeError(f"draft_model must be a transformers PreTrainedModel, got {type(draft_model).__name__}")
        largest = id_count(draft_tokenizer, "draft_tokenizer") - 1  # (computed once per tokenizer)
        if largest >= vocab_size(draft_model):
            raise ValueError(f"draft_tokenizer has ids up to {largest}, but draft_model has "
                             f"{vocab_size(draft_model)} rows: they do not belong together")
        self.source = make_logits_source(draft_model, use_cache)
        self.limit = context_length(draft_model)  # the most positions the draft reads (None: no limit)
        self.seen: list[int] = []  # the tokens the cache holds keys and values for

    def room(self, view: list[int]) -> int:
        """How many tokens the draft can still write after `view`.

        Raises:
            ValueError: when `view` alone fills the draft's context (the text took
                more of the draft's tokens than `check_length` allowed for).
        """
        if self.limit is None:
            return 1 << 30
        if len(view) >= self.limit:
            raise ValueError(f"the draft's view of the sequence has grown to {len(view)} tokens, past "
                             f"draft_model's context length of {self.limit} positions (the text takes more "
                             "of draft_tokenizer's tokens than of the target's): lower max_new_tokens")
        return self.limit - len(view)

    def check_length(self, view: list[int], max_new_tokens: int) -> None:
        """A generation's prompt (as the draft reads it) and new tokens must fit the
        draft's context, one position per new token, as for a same-tokenizer draft.

        Raises:
            ValueError: naming draft_model and its context length.
        """
        if self.limit is not None and len(view) + max_new_tokens > self.limit:
            raise ValueError(f"the prompt ({len(view)} tokens in draft_tokenizer's tokens) + max_new_tokens "
                             f"({max_new_tokens}) exceeds draft_model's context length of {self.limit} positions")

    def next_logits(self, ids: list[int]) -> torch.Tensor:
        """The draft's logits after `ids`, shape (V_draft,)."""
        common = 0
        for a, b in zip(self.seen, ids, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # the last token is always fed
        # Roll back only when something must be forgotten: a sliding-window
        # layer trims itself to its window at each rollback and cannot come
        # back past that point; where it could not, read everything again.
        if common < len(self.seen):
            cached = isinstance(self.source, CachedForward)
            self.source.rollback(common if not cached or self.source.can_roll_back(common) else 0)
        device = model_device(self.source.model)
        logits = self.source.last_logits(torch.tensor([ids], device=device), 1)[0]  # (V_draft,)
        self.seen = list(ids)
        return logits

    @property
    def forward_calls(self) -> int:
        return self.source.forward_calls


def _one_hot(tokens: list[int], vocab: int, device: torch.device) -> Draft:
    ids = torch.tensor(tokens, dtype=torch.long, device=device)  # (K',)
    probs = torch.zeros(len(tokens), vocab, device=device)  # (K', V)
    probs[torch.arange(len(tokens)), ids] = 1.0
    return Draft(ids, probs)


class TextDrafter:
    """The draft writes text greedily; the target's tokenizer re-encodes it."""

    def __init__(self, draft_model: PreTrainedModel, target_tokenizer: PreTrainedTokenizerBase,
                 draft_tokenizer: PreTrainedTokenizerBase, num_draft_tokens: int = 4,
                 use_cache: bool = True) -> None:
        self.bridge = TokenizerPair(target_tokenizer, draft_tokenizer)
        self.reader = DraftReader(draft_model, draft_tokenizer, use_cache)
        self.num_draft_tokens = num_draft_tokens
        self.retokenize_seconds = 0.0  # time spent decoding and re-encoding text

    @property
    def forward_calls(self) -> int:
        return self.reader.forward_calls

    def check_length(self, input_ids: torch.Tensor, max_new_tokens: int) -> None:
        """Refuse up front a generation the draft could not read to its end (`DraftReader.check_length`)."""
        self.reader.check_length(self.bridge.draft_view(input_ids[0].tolist()), max_new_tokens)

    def rollback(self, length: int) -> None:
        """Nothing to do: each round re-reads the sequence (the cache keeps its common prefix)."""

    def draft(self, input_ids: torch.Tensor, num_draft_tokens: int, vocab_size: int) -> Draft:
        """Up to `num_draft_tokens` target tokens of the draft's greedy text."""
        target_ids = input_ids[0].tolist()
        start = time.perf_counter()
        view = self.bridge.draft_view(target_ids)
        self.retokenize_seconds += time.perf_counter() - start
        if not view:  # nothing the draft can read yet: the target steps alone
            return _one_hot([], vocab_size, input_ids.device)
        written: list[int] = []
        proposal: list[int] = []
        # Write until the text holds one target token more than asked: the last
        # one may still grow (a word the next draft token continues).
        steps = min(2 * num_draft_tokens + 2 if num_draft_tokens else 0, self.reader.room(view))
        for _ in range(steps):
            written.append(int(self.reader.next_logits(view + written).argmax()))
            start = time.perf_counter()
            text, ended = self.bridge.draft_text(written, view)
            proposal = self.bridge.target_tokens(text, target_ids)
            self.retokenize_seconds += time.perf_counter() - start
            if ended:
                proposal.append(self.bridge.target_eos)
                break
            if len(proposal) > num_draft_tokens:
                break
        else:
            proposal = proposal[:-1] if len(proposal) > 1 else proposal
        proposal = proposal[:num_draft_tokens]
        if any(t >= vocab_size for t in proposal):
            raise ValueError(f"target_tokenizer wrote ids {proposal}, but the target model has {vocab_size} "
                             "output rows: they do not belong together")
        return _one_hot(proposal, vocab_size, input_ids.device)


class SharedProposal:
    """The sampled path's q: the draft's logits kept on the shared tokens only.

    The draft's EOS is shared by role (it proposes the target's EOS); every other
    pair of ids spells the same bytes (`vocab.shared_vocabulary`, one draft id
    per target token).
    """

    def __init__(self, bridge: TokenizerPair) -> None:
        shared = shared_vocabulary(bridge.target, bridge.draft)  # computed once per pair of tokenizers
        self.draft_ids = torch.cat([shared.draft_ids, torch.tensor([bridge.draft_eos])])  # (S + 1,)
        self.target_ids = torch.cat([shared.target_ids, torch.tensor([bridge.target_eos])])  # (S + 1,)
        self.to_draft = dict(zip(self.target_ids.tolist(), self.draft_ids.tolist(), strict=True))

    def row(self, draft_logits: torch.Tensor, target_vocab: int,
            sampling: SamplingConfig = SamplingConfig()) -> torch.Tensor:
        """q over the target's vocabulary, (V_draft,) -> (V_target,): the draft's
        logits on the shared tokens, processed as the target's are (temperature,
        top-k, top-p), so renormalised over them; zero outside them."""
        if self.draft_ids.device != draft_logits.device:
            self.draft_ids = self.draft_ids.to(draft_logits.device)
            self.target_ids = self.target_ids.to(draft_logits.device)
        logits = torch.full((target_vocab,), float("-inf"), dtype=draft_logits.dtype,
                            device=draft_logits.device)  # (V_target,)
        logits[self.target_ids] = draft_logits[self.draft_ids]  # one draft id per target id
        return logits_to_probs(logits[None], sampling)[0]


class SharedVocabDrafter:
    """The draft samples from the tokens both vocabularies share, renormalised.

    Built without `sampling` (or `generator`), it takes the decoder's, as
    `drafting.ModelDrafter` does; built with a sampling configuration other
    than the decoder's, it is refused (`bind`): q must be processed as p is.
    """

    def __init__(self, draft_model: PreTrainedModel, target_tokenizer: PreTrainedTokenizerBase,
                 draft_tokenizer: PreTrainedTokenizerBase, sampling: SamplingConfig | None = None,
                 generator: torch.Generator | None = None, num_draft_tokens: int = 4,
                 use_cache: bool = True) -> None:
        self.bridge = TokenizerPair(target_tokenizer, draft_tokenizer)
        self.reader = DraftReader(draft_model, draft_tokenizer, use_cache)
        self.proposal = SharedProposal(self.bridge)
        self.sampling, self.generator, self.num_draft_tokens = sampling, generator, num_draft_tokens
        # This generation's sampling and generator (`bind`).
        self.active: tuple[SamplingConfig | None, torch.Generator | None] = (sampling, generator)
        self.retokenize_seconds = 0.0  # time spent decoding and re-encoding text

    @property
    def forward_calls(self) -> int:
        return self.reader.forward_calls

    def bind(self, sampling: SamplingConfig, generator: torch.Generator | None) -> SharedVocabDrafter:
        """Take the decoder's sampling, and its generator where this drafter has none.

        Raises:
            ValueError: when this drafter was built with another sampling configuration.
        """
        if self.sampling is not None and self.sampling != sampling:
            raise ValueError(f"the drafter's sampling ({self.sampling}) differs from the decoder's ({sampling}): "
                             "build SharedVocabDrafter without sampling, and it takes speculative_generate's")
        self.active = (sampling, self.generator or generator)
        return self

    def check_length(self, input_ids: torch.Tensor, max_new_tokens: int) -> None:
        """Refuse up front a generation the draft could not read to its end (`DraftReader.check_length`)."""
        self.reader.check_length(self.bridge.draft_view(input_ids[0].tolist()), max_new_tokens)

    def rollback(self, length: int) -> None:
        """Nothing to do: each round re-reads the sequence (the cache keeps its common prefix)."""

    def draft(self, input_ids: torch.Tensor, num_draft_tokens: int, vocab_size: int) -> Draft:
        """`num_draft_tokens` tokens (fewer after an EOS), with their q rows (K', V_target)."""
        sampling, generator = self.active
        if sampling is None:
            raise ValueError("this SharedVocabDrafter has no sampling configuration: pass it to "
                             "speculative_generate (which hands it its own) or build it with one")
        largest = int(self.proposal.target_ids.max())
        if largest >= vocab_size:
            raise ValueError(f"target_tokenizer has ids up to {largest}, but the target model has "
                             f"{vocab_size} output rows: they do not belong together")
        start = time.perf_counter()
        view = self.bridge.draft_view(input_ids[0].tolist())
        self.retokenize_seconds += time.perf_counter() - start
        written, tokens, rows = [], [], []
        # Nothing to read (an empty view) proposes nothing: the target steps alone.
        for _ in range(min(num_draft_tokens, self.reader.room(view)) if view else 0):
            q = self.proposal.row(self.reader.next_logits(view + written), vocab_size, sampling)  # (V_target,)
            token = int(q.argmax()) if sampling.greedy else int(sample(q[None], generator))
            tokens.append(token)
            rows.append(q)
            if token == self.bridge.target_eos:
                break
            written.append(self.proposal.to_draft[token])  # the draft's own id for the same token
        if not tokens:
            return Draft(torch.empty(0, dtype=torch.long, device=input_ids.device),
                         torch.empty(0, vocab_size, device=input_ids.device))
        return Draft(torch.tensor(tokens, device=input_ids.device), torch.stack(rows).to(input_ids.device))
