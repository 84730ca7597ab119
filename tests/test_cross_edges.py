"""Edges of drafting with another tokenizer (chapter 9): a sliding-window draft, a
prompt the draft cannot read, SentencePiece's stripped first space, the decoder's
sampling and generator, the draft's context and rows, one draft id per shared token,
and the per-tokenizer-pair cache."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from tokenizers import Tokenizer
from transformers import GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast

from specdec_ref.cross_vocab import tokenizers as vocab
from specdec_ref.cross_vocab.drafting import SharedVocabDrafter, TextDrafter
from specdec_ref.cross_vocab.tokenizers import TokenizerPair, shared_vocabulary, token_spellings
from specdec_ref.decoder import autoregressive_generate, speculative_generate
from specdec_ref.kv_cache import CachedForward, sliding_rollback_supported
from specdec_ref.models import CrossPair, load_pair
from specdec_ref.sampling import GREEDY, SamplingConfig

SAMPLED = SamplingConfig(temperature=1.0)
DRAFTERS = {"text": lambda m, t, d: TextDrafter(m, t, d),
            "shared": lambda m, t, d: SharedVocabDrafter(m, t, d)}
PROMPT = 'import os\n\n\ndef read_config(path):\n    """Read the file'


@pytest.fixture(scope="module")
def cross() -> CrossPair:
    return load_pair("tiny-cross", device="cpu")


def greedy_pair(target, drafter, ids, n=40, eos=None):
    """The target's own greedy tokens, and the speculative decoder's with `drafter`."""
    reference = autoregressive_generate(target, ids, max_new_tokens=n, sampling=GREEDY, eos_token_id=eos)
    out = speculative_generate(target, drafter, ids, max_new_tokens=n, num_draft_tokens=4, sampling=GREEDY,
                               eos_token_id=eos)
    return reference.sequences, out


def sliding_draft(vocab: int, window: int = 4) -> MistralForCausalLM:
    """A tiny random Mistral whose every layer attends to its last `window` tokens."""
    torch.manual_seed(0)
    config = MistralConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           sliding_window=window, initializer_range=0.2, bos_token_id=1, eos_token_id=2)
    return MistralForCausalLM(config).eval()


@pytest.mark.skipif(not sliding_rollback_supported(),
                    reason="this transformers release cannot roll back a sliding-window cache")
@pytest.mark.parametrize("kind", sorted(DRAFTERS))
def test_a_sliding_window_draft_gives_the_targets_greedy_output(cross, kind):
    """Window 4, 40 tokens, a random draft: rejections far past the window roll back."""
    draft = sliding_draft(len(cross.draft_tokenizer))
    ids = cross.tokenizer(PROMPT, return_tensors="pt").input_ids
    expected, out = greedy_pair(cross.target_model, DRAFTERS[kind](draft, cross.tokenizer, cross.draft_tokenizer),
                                ids)
    assert torch.equal(out.sequences, expected)
    assert out.stats.judged_tokens > out.stats.accepted_tokens  # rejections happened


@pytest.mark.skipif(not sliding_rollback_supported(),
                    reason="this transformers release cannot roll back a sliding-window cache")
def test_a_fresh_sliding_window_source_can_be_emptied_and_reused(cross):
    """A `CachedForward` over a sliding model, passed as a target or inside a drafter, is
    rolled back to 0 before its first pass and after a whole generation."""
    model = sliding_draft(64)
    ids = torch.tensor([[3, 4, 5]])
    source = CachedForward(model)
    source.rollback(0)  # fresh: nothing to forget
    first = speculative_generate(source, model, ids, max_new_tokens=20, num_draft_tokens=3, sampling=GREEDY)
    again = speculative_generate(source, model, ids, max_new_tokens=20, num_draft_tokens=3, sampling=GREEDY)
    assert torch.equal(first.sequences, again.sequences)


def swapped(cross: CrossPair, draft_has_bos: bool) -> tuple:
    """The roles swapped: the SentencePiece-style model (with a BOS) as the target, the
    byte-level model as the draft, its tokenizer without a BOS of its own if asked."""
    draft_tokenizer = copy.deepcopy(cross.tokenizer)
    if not draft_has_bos:
        draft_tokenizer.bos_token = None
    return cross.draft_model, cross.draft_tokenizer, cross.target_model, draft_tokenizer


@pytest.mark.parametrize("kind", sorted(DRAFTERS))
def test_a_prompt_the_draft_cannot_read_makes_the_target_step_alone(cross, kind):
    """A lone BOS the draft has no role for: the draft's view is empty, it proposes
    nothing, and the output is still the target's greedy output."""
    target, target_tokenizer, draft, draft_tokenizer = swapped(cross, draft_has_bos=False)
    ids = torch.tensor([[target_tokenizer.bos_token_id]])
    assert TokenizerPair(target_tokenizer, draft_tokenizer).draft_view(ids[0].tolist()) == []
    expected, out = greedy_pair(target, DRAFTERS[kind](draft, target_tokenizer, draft_tokenizer), ids, n=20)
    assert torch.equal(out.sequences, expected)
    assert out.stats.drafted_tokens > 0  # once there is text, the draft drafts


def with_stripped_first_space(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """`tokenizer` (SentencePiece-style) in Llama 2 / Mistral's convention: a "▁" is
    prepended to the text, and the first space is stripped when decoding."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, spec["normalizer"]]}
    spec["decoder"]["decoders"].append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    converted = copy.deepcopy(tokenizer)
    converted._tokenizer = Tokenizer.from_str(json.dumps(spec))
    return converted


def test_the_text_of_new_tokens_keeps_its_leading_space_when_decode_strips_it(cross):
    """"▁the" after "hello" is " the": the difference of two decodes, not the
    token decoded alone (which a Llama 2-style decoder strips to "the")."""
    llama = with_stripped_first_space(cross.draft_tokenizer)
    written = llama.encode("the", add_special_tokens=False)  # "▁the": the prepended "▁"
    assert llama.convert_ids_to_tokens(written) == ["▁the"]
    assert llama.decode(written) == "the"  # the convention: the first space stripped
    bridge = TokenizerPair(cross.tokenizer, llama)
    view = bridge.draft_view(cross.tokenizer.encode("hello", add_special_tokens=False))
    assert bridge.draft_text(written, view) == (" the", False)


@pytest.mark.parametrize("before, after", [("x = 1\nprint(x)", "\ny = 2"),  # the context starts mid-line
                                           ("the reading config", " file now"),
                                           ("for line in lines:\n", "    print(line)")])
def test_new_text_becomes_the_target_tokens_the_whole_text_would_give(cross, before, after):
    """A target in Llama 2's convention: the tokens proposed for new text are those the
    target's tokenizer gives the whole text after what is already there."""
    llama = with_stripped_first_space(cross.draft_tokenizer)
    bridge = TokenizerPair(llama, cross.tokenizer)
    ids = llama.encode(before, add_special_tokens=False)
    whole = llama.encode(before + after, add_special_tokens=False)
    assert whole[:len(ids)] == ids
    assert bridge.target_tokens(after, ids) == whole[len(ids):]


def test_the_text_path_keeps_its_acceptance_under_a_stripped_first_space(cross):
    """The same draft model, its tokenizer in either convention, proposes the same
    target tokens on a prompt (so acceptance cannot collapse), and greedy stays exact."""
    llama = with_stripped_first_space(cross.draft_tokenizer)
    ids = cross.tokenizer(PROMPT + " and", return_tensors="pt").input_ids
    plain = TextDrafter(cross.draft_model, cross.tokenizer, cross.draft_tokenizer).draft(ids, 4, 4096)
    converted = TextDrafter(cross.draft_model, cross.tokenizer, llama)
    assert converted.draft(ids, 4, 4096).tokens.tolist() == plain.tokens.tolist()
    expected, out = greedy_pair(cross.target_model, converted, ids)
    assert torch.equal(out.sequences, expected)
    # The roles swapped: the target decodes and encodes in Llama 2's convention.
    target, target_tokenizer, draft, draft_tokenizer = swapped(cross, draft_has_bos=True)
    target_tokenizer = with_stripped_first_space(target_tokenizer)
    ids = target_tokenizer(PROMPT, return_tensors="pt").input_ids
    expected, out = greedy_pair(target, TextDrafter(draft, target_tokenizer, draft_tokenizer), ids)
    assert torch.equal(out.sequences, expected)
    assert out.stats.accepted_tokens > 0


def test_the_shared_path_takes_the_decoders_sampling_and_generator(cross):
    """Built without them, it draws from the decoder's generator (same seed, same output)
    and drafts greedily under greedy decoding; a mismatch is refused by name."""
    ids = cross.tokenizer(PROMPT, return_tensors="pt").input_ids
    drafter = SharedVocabDrafter(cross.draft_model, cross.tokenizer, cross.draft_tokenizer)
    runs = [speculative_generate(cross.target_model, drafter, ids, max_new_tokens=24, num_draft_tokens=4,
                                 sampling=SAMPLED, generator=torch.Generator().manual_seed(7)).sequences
            for _ in range(3)]
    assert all(torch.equal(run, runs[0]) for run in runs)
    # Under greedy decoding every q row is one-hot: the draft drafts its argmax.
    seen = []
    original = drafter.proposal.row

    def spy(*args, **kwargs):
        seen.append(original(*args, **kwargs))
        return seen[-1]

    drafter.proposal.row = spy
    expected, out = greedy_pair(cross.target_model, drafter, ids, n=16)
    assert torch.equal(out.sequences, expected)
    assert seen and all(float(row.max()) == 1.0 for row in seen)
    at_t1 = SharedVocabDrafter(cross.draft_model, cross.tokenizer, cross.draft_tokenizer, sampling=SAMPLED)
    with pytest.raises(ValueError, match="the drafter's sampling .* differs from the decoder's"):
        speculative_generate(cross.target_model, at_t1, ids, max_new_tokens=8, sampling=GREEDY)


def test_a_draft_whose_context_is_too_short_is_refused_up_front(cross):
    """A GPT-2-family draft with 32 learned positions: a clear error before any pass,
    naming draft_model and its context, not an IndexError mid-generation."""
    torch.manual_seed(0)
    draft = GPT2LMHeadModel(GPT2Config(vocab_size=len(cross.draft_tokenizer), n_positions=32, n_embd=32,
                                       n_layer=1, n_head=2)).eval()
    ids = cross.tokenizer(PROMPT, return_tensors="pt").input_ids
    for kind, make in DRAFTERS.items():
        drafter = make(draft, cross.tokenizer, cross.draft_tokenizer)
        with pytest.raises(ValueError, match="draft_model's context length of 32 positions"):
            speculative_generate(cross.target_model, drafter, ids, max_new_tokens=40, sampling=GREEDY)
        assert drafter.forward_calls == 0, kind
        # Within its context it drafts, and the output is the target's.
        expected, out = greedy_pair(cross.target_model, make(draft, cross.tokenizer, cross.draft_tokenizer),
                                    ids[:, :8], n=8)
        assert torch.equal(out.sequences, expected)


def test_a_draft_tokenizer_with_more_ids_than_the_draft_model_has_rows_is_refused(cross):
    torch.manual_seed(0)
    small = GPT2LMHeadModel(GPT2Config(vocab_size=len(cross.draft_tokenizer) - 8, n_positions=64, n_embd=32,
                                       n_layer=1, n_head=2)).eval()
    for make in DRAFTERS.values():
        with pytest.raises(ValueError, match="draft_tokenizer has ids up to 3071, but draft_model has 3064"):
            make(small, cross.tokenizer, cross.draft_tokenizer)


def test_each_shared_target_token_has_one_draft_id_the_draft_would_write(cross):
    """Byte-fallback "<0x21>" and "!" spell the same byte: the target's "!" gets one draft
    id, the one the draft's tokenizer writes for "!"."""
    shared = shared_vocabulary(cross.tokenizer, cross.draft_tokenizer)
    targets = shared.target_ids.tolist()
    assert len(targets) == len(set(targets))
    assert len(set(shared.draft_ids.tolist())) == len(targets)
    spellings = token_spellings(cross.draft_tokenizer)
    assert spellings[cross.draft_tokenizer.convert_tokens_to_ids("<0x21>")] == b"!"
    bang = cross.tokenizer.convert_tokens_to_ids("!")
    chosen = int(shared.draft_ids[shared.target_ids == bang][0])
    assert [chosen] == cross.draft_tokenizer.encode("!", add_special_tokens=False)
    drafter = SharedVocabDrafter(cross.draft_model, cross.tokenizer, cross.draft_tokenizer)
    assert len(set(drafter.proposal.target_ids.tolist())) == drafter.proposal.target_ids.numel()


def test_what_depends_only_on_the_two_tokenizers_is_computed_once(cross, monkeypatch):
    """A second drafter over the same tokenizers reads no spelling again and reuses the
    shared vocabulary; a changed tokenizer gets its own."""
    reads = []
    read = vocab._read_spellings
    monkeypatch.setattr(vocab, "_read_spellings", lambda *args: reads.append(1) or read(*args))
    target, draft = copy.deepcopy(cross.tokenizer), copy.deepcopy(cross.draft_tokenizer)
    first = SharedVocabDrafter(cross.draft_model, target, draft)
    assert len(reads) == 2  # the target's spellings and the draft's
    second = SharedVocabDrafter(cross.draft_model, target, draft)
    TextDrafter(cross.draft_model, target, draft)
    assert len(reads) == 2
    assert shared_vocabulary(target, draft) is shared_vocabulary(target, draft)
    assert first.proposal.to_draft == second.proposal.to_draft
    changed = with_stripped_first_space(draft)
    token_spellings(changed)
    assert len(reads) == 3
    draft.add_special_tokens({"additional_special_tokens": ["<|sep|>"]})  # edited in place
    assert token_spellings(draft)[-1] is None and len(reads) == 4
