"""A draft with another tokenizer (chapter 9): spellings, the shared vocabulary, the
text bridge, greedy equality on the embedded pair, and the sampled law by enumeration."""

from __future__ import annotations

import pytest
import torch

from specdec_ref.cross_vocab.drafting import SharedVocabDrafter, TextDrafter
from specdec_ref.cross_vocab.law import cross_vocab_law, law_distance, target_law, toy_model, toy_tokenizers
from specdec_ref.cross_vocab.tokenizers import (
    TokenizerPair,
    check_tokenizer,
    encode_text,
    shared_vocabulary,
    token_spellings,
)
from specdec_ref.decoder import autoregressive_generate, speculative_generate
from specdec_ref.models import CrossPair, load_pair
from specdec_ref.sampling import GREEDY, SamplingConfig


@pytest.fixture(scope="module")
def cross() -> CrossPair:
    return load_pair("tiny-cross", device="cpu")


@pytest.fixture(scope="module")
def toys():
    return toy_tokenizers()


def test_spellings_read_both_families_and_leave_special_tokens_out(toys):
    """Byte-level "Ġab" and SentencePiece "▁a" spell their bytes; EOS spells nothing."""
    target, draft = toys
    assert token_spellings(target) == [b"a", b"b", b" ", b"ab", b" a", b" ab", None]
    assert token_spellings(draft) == [None, None, None, b"a", b"b", b" ", b"ba", b" b", b" a"]


def test_byte_fallback_tokens_spell_one_byte_each(cross):
    """The shipped draft spells "é" with two byte tokens, and each spells its byte."""
    spellings = token_spellings(cross.draft_tokenizer)
    ids = cross.draft_tokenizer.encode("日", add_special_tokens=False)
    assert [spellings[i] for i in ids] == [bytes([b]) for b in "日".encode()]


def test_shared_vocabulary_pairs_tokens_that_spell_the_same_bytes(toys, cross):
    target, draft = toys
    shared = shared_vocabulary(target, draft)
    assert shared.draft_ids.tolist() == [3, 4, 5, 8] and shared.target_ids.tolist() == [0, 1, 2, 4]
    assert shared.share_of_target == pytest.approx(4 / 7)
    real = shared_vocabulary(cross.tokenizer, cross.draft_tokenizer)
    t_spell, d_spell = token_spellings(cross.tokenizer), token_spellings(cross.draft_tokenizer)
    pairs = zip(real.draft_ids.tolist(), real.target_ids.tolist(), strict=True)
    assert all(d_spell[d] == t_spell[t] is not None for d, t in pairs)
    assert 0.2 < real.share_of_target < 1


def test_bad_tokenizers_get_errors_that_name_the_argument(toys):
    target, draft = toys
    with pytest.raises(TypeError, match="draft_tokenizer must be a fast transformers tokenizer.*no convert_ids"):
        TokenizerPair(target, object())
    with pytest.raises(TypeError, match="target_tokenizer"):
        check_tokenizer("not a tokenizer", "target_tokenizer")
    no_eos = toy_tokenizers()[1]
    no_eos.eos_token = None
    with pytest.raises(ValueError, match="draft_tokenizer has no eos_token"):
        TokenizerPair(target, no_eos)
    disjoint = toy_tokenizers()[1]
    disjoint.backend_tokenizer.model = type(disjoint.backend_tokenizer.model)(
        {"<unk>": 0, "<s>": 1, "</s>": 2, "x": 3}, [], unk_token="<unk>")
    with pytest.raises(ValueError, match="draft_tokenizer shares no token with target_tokenizer"):
        shared_vocabulary(target, disjoint)


def test_special_tokens_cross_by_role_and_their_strings_stay_text(toys):
    """The target's EOS becomes the draft's; the characters "</s>" written as text do not."""
    target, draft = toys
    bridge = TokenizerPair(target, draft)
    ids = target.encode(" a", add_special_tokens=False) + [target.eos_token_id] + \
        target.encode(" ab", add_special_tokens=False)
    assert bridge.draft_view(ids) == draft.encode(" a", add_special_tokens=False) + [draft.eos_token_id] + \
        draft.encode(" ab", add_special_tokens=False)
    text, ended = bridge.draft_text([8, draft.eos_token_id, 4], [])
    assert (text, ended) == (" a", True)
    assert draft.eos_token_id not in encode_text(draft, "a</s>")


def test_target_tokens_merge_a_word_split_across_the_boundary(toys):
    """Text after "a" is re-encoded with it (" ab" joins into one token), but text that would
    rewrite an emitted token (" a" + "b" -> " ab") is encoded on its own instead."""
    target, draft = toys
    bridge = TokenizerPair(target, draft)
    emitted = target.encode(" a", add_special_tokens=False)  # [" a"]
    assert bridge.target_tokens("b a", emitted) == target.encode("b a", add_special_tokens=False)
    assert bridge.target_tokens(" ab", [0]) == [5]


PROMPTS = [
    'import os\n\n\ndef read_config(path):\n    """',  # code, indentation
    "The café’s naïve résumé — 日本語 ✓ 🙂\n",  # multi-byte characters, byte fallback in the draft
    "x = '</s>' + '<|endoftext|>'  # the special tokens' strings as text",
]


@pytest.mark.parametrize("drafter_class", [TextDrafter, SharedVocabDrafter])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_across_tokenizers_equals_the_targets_greedy_output(cross, drafter_class, prompt):
    """Token for token equal to the target's own greedy decoding (and to `generate`)."""
    tokenizer = cross.tokenizer
    # The special tokens' strings stay text (split_special_tokens): no EOS inside the prompt.
    ids = tokenizer(prompt, return_tensors="pt", split_special_tokens=True).input_ids
    assert tokenizer.eos_token_id not in ids[0].tolist()
    eos = tokenizer.eos_token_id
    reference = autoregressive_generate(cross.target_model, ids, max_new_tokens=40, sampling=GREEDY,
                                        eos_token_id=eos).sequences
    kwargs = {"sampling": GREEDY} if drafter_class is SharedVocabDrafter else {}
    for k in (1, 3, 5):
        drafter = drafter_class(cross.draft_model, tokenizer, cross.draft_tokenizer, **kwargs)
        out = speculative_generate(cross.target_model, drafter, ids, max_new_tokens=40, num_draft_tokens=k,
                                   sampling=GREEDY, eos_token_id=eos)
        assert torch.equal(out.sequences, reference), (k, tokenizer.decode(out.sequences[0, ids.size(1):]))
        assert out.stats.new_tokens <= 40
    generated = cross.target_model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=eos,
                                            pad_token_id=eos)
    assert torch.equal(reference, generated[:, : reference.size(1)])


def test_greedy_equality_holds_with_the_targets_eos_inside_the_prompt(cross):
    tokenizer = cross.tokenizer
    ids = torch.tensor([tokenizer.encode("def f():\n    return 1\n") + [tokenizer.eos_token_id]
                        + tokenizer.encode("class A:\n")])
    reference = autoregressive_generate(cross.target_model, ids, max_new_tokens=24, sampling=GREEDY).sequences
    drafter = TextDrafter(cross.draft_model, tokenizer, cross.draft_tokenizer)
    out = speculative_generate(cross.target_model, drafter, ids, max_new_tokens=24, sampling=GREEDY)
    assert torch.equal(out.sequences, reference)
    assert out.stats.accepted_tokens > 0  # the draft helped at all


def test_sampled_drafts_are_target_tokens_with_well_formed_q_rows(cross):
    """Each drafted id is the target's, q sums to 1 over the target's vocabulary, puts mass on
    the drafted token and none outside the shared tokens."""
    tokenizer = cross.tokenizer
    sampling = SamplingConfig(temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    drafter = SharedVocabDrafter(cross.draft_model, tokenizer, cross.draft_tokenizer, sampling=sampling,
                                 generator=generator)
    ids = tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    vocab = cross.target_model.get_output_embeddings().weight.size(0)
    proposal = drafter.draft(ids, 4, vocab)
    allowed = torch.zeros(vocab, dtype=torch.bool)
    allowed[drafter.proposal.target_ids] = True
    assert proposal.probs.shape == (proposal.tokens.numel(), vocab)
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(proposal.tokens.numel()))
    assert bool((proposal.probs[torch.arange(proposal.tokens.numel()), proposal.tokens] > 0).all())
    assert float(proposal.probs[:, ~allowed].sum()) == 0.0
    out = speculative_generate(cross.target_model, drafter, ids, max_new_tokens=32, sampling=sampling,
                               generator=generator)
    assert out.sequences.size(1) == ids.size(1) + 32


def test_the_sampled_law_is_the_targets_to_1e_12_and_the_biased_one_is_not(toys):
    """Every path of the decoder enumerated on the toy tokenizers (K = 2, 3 new tokens)."""
    target, draft = toys
    bridge = TokenizerPair(target, draft)
    target_logits = toy_model(len(target), salt=1)
    probs = lambda ids: target_logits(ids).softmax(-1)  # noqa: E731
    draft_logits = toy_model(len(draft), salt=2, masked=(0, 1))
    prompt = tuple(target.encode(" a", add_special_tokens=False))
    reference = target_law(probs, prompt, 3, bridge.target_eos)
    exact = cross_vocab_law(probs, draft_logits, bridge, prompt, num_draft_tokens=2, max_new_tokens=3)
    biased = cross_vocab_law(probs, draft_logits, bridge, prompt, num_draft_tokens=2, max_new_tokens=3,
                             biased=True)
    assert max(abs(exact.get(s, 0.0) - reference.get(s, 0.0)) for s in set(exact) | set(reference)) < 1e-12
    assert law_distance(biased, reference) > 0.05


def test_load_pair_gives_both_tokenizers_for_a_cross_pair(cross):
    draft_model, target_model, tokenizer, draft_tokenizer = cross
    assert len(draft_tokenizer) != len(tokenizer)
    assert draft_model.get_output_embeddings().weight.size(0) == len(draft_tokenizer)
    assert draft_tokenizer.eos_token != tokenizer.eos_token
