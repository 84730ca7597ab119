"""The cross-tokenizer decoder's output law, by enumeration (chapter 9's proof, checked).

Two toy tokenizers of a handful of tokens each (`toy_tokenizers`), of the two
families the chapter meets (a byte-level BPE target, a SentencePiece-style draft
with other merges and another end-of-text token), and two toy "models": any
functions from a token sequence to a distribution (`target_probs`) or to logits
(`draft_logits`). `cross_vocab_law` walks every way the sampled cross-tokenizer
decoder can run (every draft the draft could write, through the same re-encoding
and the same `SharedProposal` as `SharedVocabDrafter`; every accept, reject and
correction of chapter 4's rule; blocks until `max_new_tokens` or an EOS), and sums
the probability of each output, in float64. `target_law` is what the target alone
would write. Exact means the two agree to rounding (1e-12).

`biased=True` is the mistake the chapter warns of: the draft samples from its whole
vocabulary (a token the target lacks is sent as the target's first token of its
text), while q still claims the shared tokens' renormalised distribution.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import torch

from ..decoder import close_block
from ..rejection import residual_distribution
from .drafting import SharedProposal
from .tokenizers import PIECES, TokenizerPair

Law = dict[tuple[int, ...], float]


def toy_tokenizers():
    """(target, draft): two fast tokenizers over the text " ab", of 7 and 9 ids.

    target (byte-level): a b Ġ ab Ġa Ġab <|endoftext|>
    draft (SentencePiece-style): <unk> <s> </s> a b ▁ ba ▁b ▁a
    They share a, b, " " and " a"; "ab", " ab" are the target's only, "ba", " b"
    the draft's only; "ab" is one target token, "a" + "b" two draft tokens.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    target = Tokenizer(models.BPE({"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġa": 4, "Ġab": 5},
                                  [("Ġ", "a"), ("Ġa", "b"), ("a", "b")]))
    target.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    target.decoder = decoders.ByteLevel()
    target.add_special_tokens(["<|endoftext|>"])
    draft = Tokenizer(models.BPE({"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4, "▁": 5, "ba": 6, "▁b": 7,
                                  "▁a": 8}, [("b", "a"), ("▁", "b"), ("▁", "a")], unk_token="<unk>"))
    draft.normalizer = normalizers.Replace(" ", "▁")
    draft.pre_tokenizer = pre_tokenizers.Split(Regex(PIECES), behavior="isolated")
    draft.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    draft.add_special_tokens(["<unk>", "<s>", "</s>"])
    eos = "<|endoftext|>"
    return (PreTrainedTokenizerFast(tokenizer_object=target, eos_token=eos, bos_token=eos, pad_token=eos),
            PreTrainedTokenizerFast(tokenizer_object=draft, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                    pad_token="</s>"))


def toy_model(size: int, salt: int, *, masked: tuple[int, ...] = ()) -> Callable[[tuple[int, ...]], torch.Tensor]:
    """A fixed random function: sequence -> float64 logits (size,), a few set to -inf."""
    def logits(ids: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(zlib.crc32(repr((salt, ids)).encode()))
        out = 2 * torch.randn(size, generator=g, dtype=torch.float64)  # (size,)
        out[torch.rand(size, generator=g, dtype=torch.float64) < 0.2] = float("-inf")  # some zeros
        out[list(masked)] = float("-inf")
        if torch.isinf(out).all():
            out[0 if 0 not in masked else size - 1] = 0.0
        return out
    return logits


def target_law(target_probs: Callable, prompt: tuple[int, ...], max_new_tokens: int, eos: int) -> Law:
    """P(output) when the target writes alone, token by token."""
    law: Law = {}

    def walk(seq: tuple[int, ...], mass: float) -> None:
        if len(seq) - len(prompt) == max_new_tokens or (len(seq) > len(prompt) and seq[-1] == eos):
            law[seq[len(prompt):]] = law.get(seq[len(prompt):], 0.0) + mass
            return
        p = target_probs(seq)
        for y in torch.nonzero(p).flatten().tolist():
            walk(seq + (y,), mass * float(p[y]))

    walk(prompt, 1.0)
    return law


def cross_vocab_law(target_probs: Callable, draft_logits: Callable, bridge: TokenizerPair,
                    prompt: tuple[int, ...], *, num_draft_tokens: int, max_new_tokens: int,
                    biased: bool = False) -> Law:
    """P(output) of the sampled cross-tokenizer decoder (T = 1), every path summed."""
    proposal = SharedProposal(bridge)
    eos = bridge.target_eos
    vocab = target_probs(prompt).numel()
    shared = {int(d): int(t) for d, t in zip(proposal.draft_ids, proposal.target_ids, strict=True)}
    law: Law = {}

    def draws(ids: list[int]) -> tuple[list[tuple[int, int, float]], torch.Tensor]:
        """[(draft id, target id, probability)] of one draft step, and the q row it reports."""
        logits = draft_logits(tuple(ids))
        q = proposal.row(logits, vocab).double()
        q = q / q.sum()  # (V_target,) the row SharedVocabDrafter reports, in float64
        if not biased:
            return [(proposal.to_draft[t], t, float(q[t])) for t in torch.nonzero(q).flatten().tolist()], q
        special = set(bridge.draft_special) - {bridge.draft_eos}
        whole = logits.clone()
        whole[list(special)] = float("-inf")
        full = whole.softmax(-1)  # (V_draft,) the draft's own distribution, unrestricted
        out = []
        for d in torch.nonzero(full).flatten().tolist():
            t = shared.get(d)
            if t is None:  # spelled by the target's first token of its text
                t = bridge.target_tokens(bridge.draft.decode([d]), [])[0]
            out.append((d, t, float(full[d])))
        return out, q

    def paths(view: list[int], written: list[int], k: int):
        """Every draft of up to k tokens: (target ids, q rows, probability)."""
        if k == 0:
            yield (), (), 1.0
            return
        steps, q = draws(view + written)
        for d, t, w in steps:
            if t == eos:
                yield (t,), (q,), w
                continue
            for tokens, rows, rest in paths(view, written + [d], k - 1):
                yield (t, *tokens), (q, *rows), w * rest

    def verify(seq: tuple[int, ...], tokens: tuple[int, ...], rows: tuple[torch.Tensor, ...]):
        """Chapter 4's rule: every (emitted, probability) for one fixed draft."""
        reach = 1.0
        for i, (x, q) in enumerate(zip(tokens, rows, strict=True)):
            p = target_probs(seq + tokens[:i])
            accept = 1.0 if q[x] == 0 else min(1.0, float(p[x] / q[x]))
            residual = residual_distribution(p, q)
            for y in torch.nonzero(residual).flatten().tolist():
                yield tokens[:i] + (y,), i, reach * (1 - accept) * float(residual[y])
            reach *= accept
        bonus = target_probs(seq + tokens)
        for y in torch.nonzero(bonus).flatten().tolist():
            yield tokens + (y,), len(tokens), reach * float(bonus[y])

    def run(seq: tuple[int, ...], mass: float) -> None:
        budget = max_new_tokens - (len(seq) - len(prompt))
        if budget == 0:
            law[seq[len(prompt):]] = law.get(seq[len(prompt):], 0.0) + mass
            return
        k = min(num_draft_tokens, budget - 1)  # as the decoder: never past the budget
        view = bridge.draft_view(list(seq))
        for tokens, rows, w in paths(view, [], k):
            for emitted, accepted, m in verify(seq, tokens, rows):
                if m == 0:
                    continue
                block = close_block(list(emitted), accepted, len(seq), {eos})
                new = seq + tuple(block.emitted)
                if block.hit_eos:
                    law[new[len(prompt):]] = law.get(new[len(prompt):], 0.0) + mass * w * m
                else:
                    run(new, mass * w * m)

    run(prompt, 1.0)
    return law


def law_distance(a: Law, b: Law) -> float:
    """Total variation between two laws over output sequences."""
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))
