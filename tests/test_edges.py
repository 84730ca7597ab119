"""Edges of the core loop: sliding windows, tiny temperatures, integer-like ids, bad
schedules, and an EOS accepted in the middle of a block."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from conftest import generator_on, make_model, noisy_copy, through
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    MistralConfig,
    MistralForCausalLM,
)
from transformers.cache_utils import DynamicSlidingWindowLayer

from specdec_ref import SamplingConfig, autoregressive_generate, speculative_generate
from specdec_ref.decoder import speculative_step
from specdec_ref.kv_cache import CachedForward, FullForward, rollback_cache, sliding_rollback_supported

GREEDY = SamplingConfig(temperature=0.0)
WINDOW = 6


# Rolling back a sliding-window cache needs transformers >= 5.24 (kv_cache.SLIDING_ROLLBACK_MIN);
# older releases get the clear error of test_sliding_window_refused_where_transformers_cannot_roll_back.
needs_past_recording = pytest.mark.skipif(
    not sliding_rollback_supported(),
    reason="this transformers release cannot roll back a sliding-window cache",
)


def sliding_model(family: str, *, window: int = WINDOW, seed: int = 0):
    """A tiny random-init model with a sliding attention window (all layers for Mistral,
    every other layer for Gemma 2 and 3). Gemma's embeddings are untied: tied, its tiny
    random models echo the last token and never reject a draft."""
    torch.manual_seed(seed)
    common = dict(vocab_size=48, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=0, eos_token_id=1, pad_token_id=None, initializer_range=0.2,
                  sliding_window=window)
    if family == "mistral":
        model = MistralForCausalLM(MistralConfig(**common))
    elif family == "gemma2":
        model = Gemma2ForCausalLM(Gemma2Config(head_dim=16, tie_word_embeddings=False, **common))
    else:
        model = Gemma3ForCausalLM(Gemma3TextConfig(head_dim=16, tie_word_embeddings=False,
                                                   sliding_window_pattern=2, **common))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def greedy_reference(model, prompt, n):
    return model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)


@needs_past_recording
@pytest.mark.parametrize("path", ["models", "prepared"])
@pytest.mark.parametrize("family", ["mistral", "gemma2", "gemma3"])
def test_sliding_window_greedy_matches_target_generate(family, device, path):
    """K=3, 60 tokens, window 6: rollbacks far past the window give generate's tokens, on the
    models as built and on the path `fast.prepare` sets up (its own target's generate)."""
    target = sliding_model(family)
    draft = noisy_copy(target, noise=0.1, seed=3).to(device)
    target = target.to(device)
    prompt = torch.tensor([[3, 4, 5]], device=device)
    # The window really shapes the output: without it, greedy decoding differs.
    assert not torch.equal(greedy_reference(target, prompt, 60),
                           greedy_reference(sliding_model(family, window=4096).to(device), prompt, 60))
    route = through(path, target, draft, max_length=63, sampling=GREEDY)
    expected = greedy_reference(route.target_model, prompt, 60)
    out = speculative_generate(route.target, route.draft, prompt, max_new_tokens=60, num_draft_tokens=3,
                               sampling=GREEDY)
    assert torch.equal(out.sequences, expected)
    assert 0 < out.stats.accepted_tokens < out.stats.judged_tokens  # rejections, hence rollbacks


@needs_past_recording
def test_sliding_window_sampling_is_the_same_with_and_without_cache():
    """Temperature 1, same seed: the cached decoder draws exactly what the cache-free one does."""
    target = sliding_model("mistral")
    draft = noisy_copy(target, noise=0.1, seed=3)
    runs = [speculative_generate(target, draft, torch.tensor([[3, 4, 5]]), max_new_tokens=40, num_draft_tokens=3,
                                 generator=torch.Generator().manual_seed(2), use_cache=use_cache)
            for use_cache in (True, False)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].stats.accepted_tokens < runs[0].stats.drafted_tokens


@needs_past_recording
def test_sliding_layers_are_trimmed_back_to_their_window(device):
    """After every iteration a sliding layer holds at most window - 1 keys; logits stay exact."""
    target_model = sliding_model("gemma2")
    draft_model = noisy_copy(target_model, noise=0.1, seed=3).to(device)
    target_model = target_model.to(device)
    target, draft = CachedForward(target_model), CachedForward(draft_model)
    sequence = torch.tensor([[3, 4, 5]], device=device)
    for _ in range(15):
        sequence, _, _ = speculative_step(target, draft, sequence, 3, GREEDY)
        for source in (target, draft):
            layers = source.cache.layers
            assert [layer.keys.shape[-2] <= WINDOW - 1 for layer in layers if layer.is_sliding] == [True]
            assert [layer.keys.shape[-2] for layer in layers if not layer.is_sliding] == [source.cached_length]
    assert sequence.size(1) > 3 * WINDOW
    assert torch.allclose(target.last_logits(sequence, 1), FullForward(target_model).last_logits(sequence, 1),
                          atol=1e-5)


@needs_past_recording
def test_sliding_rollback_beyond_what_was_kept_is_refused():
    """Keys that left the window cannot come back: rolling back that far is a ValueError."""
    source = CachedForward(sliding_model("mistral"))
    sequence = torch.arange(2, 42)[None]  # (1, 40)
    source.last_logits(sequence, 1)
    source.rollback(38)  # fine: trims every sliding layer to its window
    with pytest.raises(ValueError, match="sliding-window layers .window 6"):
        source.rollback(20)


def test_sliding_window_without_past_recording_is_refused_up_front(monkeypatch):
    """A transformers release that cannot record a sliding layer's past gets a clear error."""
    monkeypatch.delattr(DynamicSlidingWindowLayer, "activate_past_recording", raising=False)
    with pytest.raises(ValueError, match="MistralForCausalLM uses sliding-window attention .sliding_window=6"):
        rollback_cache(sliding_model("mistral"))


def test_sliding_window_refused_where_transformers_cannot_roll_back(monkeypatch):
    """A release below kv_cache.SLIDING_ROLLBACK_MIN (5.17 has past recording, wrong masks) is refused."""
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    assert not sliding_rollback_supported()
    with pytest.raises(ValueError, match="transformers >= 5.24 can"):
        rollback_cache(sliding_model("mistral"))


@pytest.mark.parametrize("temperature", [1e-45, 1e-320])
def test_tiny_temperature_generates_the_greedy_tokens(close_pair, temperature, device):
    """T -> 0 is greedy in the limit: both decoders emit the greedy tokens, no NaN, no error."""
    target, draft = (model.to(device) for model in close_pair)
    prompt = torch.tensor([[3, 4, 5]], device=device)
    expected = greedy_reference(target, prompt, 30)
    sampling = SamplingConfig(temperature=temperature)
    generator = generator_on(device, 0)
    baseline = autoregressive_generate(target, prompt, max_new_tokens=30, sampling=sampling, generator=generator)
    assert torch.equal(baseline.sequences, expected)
    out = speculative_generate(target, draft, prompt, max_new_tokens=30, num_draft_tokens=3, sampling=sampling,
                               generator=generator)
    assert torch.equal(out.sequences, expected)
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens


def eos_run(eos_token_id):
    target = make_model("llama", layers=2, seed=1)
    return speculative_generate(target, target, torch.tensor([[3, 4, 5]]), max_new_tokens=30, num_draft_tokens=4,
                                sampling=GREEDY, eos_token_id=eos_token_id)


@pytest.mark.parametrize("wrap", [lambda e, _: np.int64(e), lambda e, _: np.int32(e), lambda e, _: torch.tensor(e),
                                  lambda e, _: [np.int64(e)], lambda e, other: (e, other), lambda e, _: {e},
                                  lambda e, other: torch.tensor([other, e])])
def test_integer_like_eos_ids_act_like_ints(wrap):
    """numpy ints, 0-d and 1-d integer tensors, tuples and sets stop where the int does."""
    reference = eos_run(None).sequences[0, 3:].tolist()
    eos, never = reference[7], next(t for t in range(48) if t not in reference)
    expected = eos_run(eos)
    assert expected.sequences.size(1) == 3 + reference.index(eos) + 1  # the EOS did stop generation
    assert torch.equal(eos_run(wrap(eos, never)).sequences, expected.sequences)


@pytest.mark.parametrize(
    "eos_token_id, error, match",
    [
        (2.5, TypeError, r"eos_token_id must be None, an integer id >= 0.*got 2\.5"),
        ("1", TypeError, "eos_token_id"),
        (True, TypeError, "eos_token_id"),
        (torch.tensor(1.0), TypeError, "eos_token_id"),
        (torch.tensor([[1]]), TypeError, r"eos_token_id .*shape \(1, 1\)"),
        (-3, ValueError, r"eos_token_id must hold token ids >= 0, got -3"),
        ([1, np.int64(-2)], ValueError, "got -2 in"),
    ],
)
def test_bad_eos_ids_name_the_argument(eos_token_id, error, match):
    """Anything but integer-like ids >= 0 raises, naming eos_token_id and the value."""
    with pytest.raises(error, match=match):
        eos_run(eos_token_id)


@pytest.mark.parametrize("ids, bad", [([[5, -7, 3]], "-7 at position 1"), ([[1, 99, 2, 120]], "99 at position 1")])
def test_out_of_range_input_id_reports_the_bad_value(pair, ids, bad):
    """The message names the offending id and where it is, not the largest id."""
    target, draft = pair
    with pytest.raises(ValueError, match=rf"input_ids must hold token ids in \[0, 48\), got {bad}"):
        speculative_generate(target, draft, torch.tensor(ids), max_new_tokens=2)


class ScriptedSchedule:
    """A custom schedule that proposes the given K values in turn (then the last one)."""

    def __init__(self, ks):
        self.ks, self.updates = list(ks), []

    def next_k(self):
        return self.ks[min(len(self.updates), len(self.ks) - 1)]

    def update(self, num_drafted, num_accepted):
        self.updates.append((num_drafted, num_accepted))


@pytest.mark.parametrize("k, error", [(-2, ValueError), (2.5, TypeError), (True, TypeError), (None, TypeError)])
def test_bad_schedule_value_names_the_schedule(pair, k, error):
    """next_k() returning a negative, a float, a bool or None fails, naming schedule and value."""
    target, draft = pair
    with pytest.raises(error, match=rf"ScriptedSchedule\.next_k\(\) must return an integer K >= 0.*got {k!r}"):
        speculative_generate(target, draft, torch.tensor([[3, 4]]), max_new_tokens=6,
                             num_draft_tokens=ScriptedSchedule([2, k]), sampling=GREEDY)


def test_num_draft_tokens_takes_integer_likes_and_names_the_rest(pair):
    """A numpy K works like the int; 2.5 or True is a TypeError naming num_draft_tokens."""
    target, draft = pair
    kwargs = {"max_new_tokens": 12, "sampling": GREEDY}
    expected = speculative_generate(target, draft, torch.tensor([[3, 4]]), num_draft_tokens=3, **kwargs)
    out = speculative_generate(target, draft, torch.tensor([[3, 4]]), num_draft_tokens=np.int64(3), **kwargs)
    assert torch.equal(out.sequences, expected.sequences) and out.stats == expected.stats
    for k in (2.5, True):
        with pytest.raises(TypeError, match=rf"num_draft_tokens must be an integer >= 1 or a schedule.*got {k!r}"):
            speculative_generate(target, draft, torch.tensor([[3, 4]]), num_draft_tokens=k, **kwargs)


def test_schedule_returning_zero_takes_plain_target_steps(close_pair, device):
    """K = 0 from a schedule is one target step: greedy output unchanged, counts consistent."""
    target, draft = (model.to(device) for model in close_pair)
    prompt = torch.tensor([[3, 4]], device=device)
    schedule = ScriptedSchedule([0, 3, 0, np.int64(2)] * 10)
    out = speculative_generate(target, draft, prompt, max_new_tokens=40, num_draft_tokens=schedule, sampling=GREEDY)
    assert torch.equal(out.sequences, greedy_reference(target, prompt, 40))
    ks = [len(r.drafted) for r in out.trace]
    assert ks[:4] == [0, 3, 0, 2] and all(len(r.emitted) == 1 for r in out.trace if not r.drafted)
    stats = out.stats
    assert stats.drafted_tokens == sum(ks) >= stats.judged_tokens >= stats.accepted_tokens >= 0
    assert schedule.updates == [(len(r.drafted), r.num_accepted) for r in out.trace]


class ScriptedSource:
    """A stand-in model: after a sequence of length L its logits pick script[L]."""

    def __init__(self, script, vocab=16):
        self.script, self.vocab, self.forward_calls = script, vocab, 0
        # What the decoder reads of a model: its vocabulary size.
        self.model = SimpleNamespace(get_output_embeddings=lambda: None, config=SimpleNamespace(vocab_size=vocab))

    def last_logits(self, sequence, num_positions):
        self.forward_calls += 1
        n = sequence.size(1)
        logits = torch.zeros(num_positions, self.vocab)
        for row, length in enumerate(range(n - num_positions + 1, n + 1)):
            logits[row, self.script[length]] = 10.0
        return logits

    def rollback(self, length):
        pass


def test_drafts_after_an_accepted_eos_count_neither_as_accepted_nor_judged():
    """Drafted [4, 4, 1, 1, 10] with EOS 1, target agreeing on 4, 4, 1, 1: emitted [4, 4, 1], 3 accepted."""
    prompt = torch.tensor([[2, 3]])
    draft = ScriptedSource({2: 4, 3: 4, 4: 1, 5: 1, 6: 10})
    target = ScriptedSource({2: 4, 3: 4, 4: 1, 5: 1, 6: 11, 7: 5})
    sequence, record, hit_eos = speculative_step(target, draft, prompt, 5, GREEDY, eos={1})
    assert record.drafted == [4, 4, 1, 1, 10] and record.emitted == [4, 4, 1] and hit_eos
    assert record.num_accepted == 3 and record.num_judged == 3
    assert sequence[0].tolist() == [2, 3, 4, 4, 1]
    # Without the EOS the same block accepts 4 drafts and the target corrects the 5th.
    _, record, _ = speculative_step(target, draft, prompt, 5, GREEDY)
    assert record.emitted == [4, 4, 1, 1, 11] and record.num_accepted == 4 and record.num_judged == 5


def test_schedule_hears_of_an_eos_block_as_short_and_fully_accepted():
    """The drafts after an accepted EOS reach the schedule neither as drafted nor as rejected."""
    target = make_model("llama", layers=2, seed=1)
    prompt = torch.tensor([[3, 4, 5]])
    reference = greedy_reference(target, prompt, 30)[0, 3:].tolist()
    position = next(i for i in range(2, 30) if i % 6 in (1, 2, 3) and reference[i] not in reference[:i])
    schedule = ScriptedSchedule([5])
    out = speculative_generate(target, target, prompt, max_new_tokens=30, num_draft_tokens=schedule,
                               sampling=GREEDY, eos_token_id=reference[position])
    assert schedule.updates[:-1] == [(5, 5)] * (len(out.trace) - 1)
    assert schedule.updates[-1] == (position % 6 + 1, position % 6 + 1)


class ScriptedDrafter:
    """A drafter that proposes `tokens` whatever it is asked for, with one-hot q rows (zero
    rows where the tokens are no ids); `forward_calls` and `rollback` can be left out."""

    def __init__(self, tokens, *, forward_calls=True, rollback=True):
        self.tokens = tokens
        if forward_calls:
            self.forward_calls = 0
        if rollback:
            self.rollback = lambda length: None

    def draft(self, input_ids, num_draft_tokens, vocab_size):
        tokens = torch.as_tensor(self.tokens)
        probs = torch.zeros(tokens.numel(), vocab_size)
        valid = not tokens.is_floating_point() and bool(((tokens >= 0) & (tokens < vocab_size)).all())
        if valid:
            probs.scatter_(1, tokens.view(-1, 1).long(), 1.0)
        return SimpleNamespace(tokens=tokens, probs=probs)


def test_a_drafter_proposing_more_than_asked_is_refused_by_name():
    """11 drafts for a budget of 1 new token: a ValueError naming the drafter, not 11 new tokens."""
    target = make_model("llama", layers=1, seed=1)
    drafter = ScriptedDrafter([5] * 11)
    with pytest.raises(ValueError, match=r"ScriptedDrafter\.draft returned 11 tokens.*num_draft_tokens=0"):
        speculative_generate(target, drafter, torch.tensor([[3, 4]]), max_new_tokens=1, num_draft_tokens=4,
                             sampling=GREEDY)
    with pytest.raises(ValueError, match=r"ScriptedDrafter\.draft returned 11 tokens.*num_draft_tokens=4"):
        speculative_generate(target, drafter, torch.tensor([[3, 4]]), max_new_tokens=20, num_draft_tokens=4,
                             sampling=GREEDY)


@pytest.mark.parametrize(("tokens", "error", "match"), [
    ([3, 48], ValueError, r"ScriptedDrafter\.draft returned token ids outside \[0, 48\): \[3, 48\]"),
    ([-1], ValueError, r"ScriptedDrafter\.draft returned token ids outside \[0, 48\): \[-1\]"),
    ([2.0, 3.0], TypeError, r"ScriptedDrafter\.draft must return integer token ids, got torch\.float32"),
    ([[2, 3]], ValueError, r"ScriptedDrafter\.draft must return tokens of shape \(K,\), got \(1, 2\)"),
])
def test_bad_drafted_tokens_are_refused_by_name_before_the_target_runs(tokens, error, match):
    """Ids outside the vocabulary, negative or float ids, a 2-D proposal: a clear error, no target pass."""
    target = make_model("llama", layers=1, seed=1)
    calls = []
    target.register_forward_hook(lambda *args: calls.append(1))
    with pytest.raises(error, match=match):
        speculative_generate(target, ScriptedDrafter(tokens), torch.tensor([[3, 4]]), max_new_tokens=8,
                             num_draft_tokens=4, sampling=GREEDY)
    assert not calls


@pytest.mark.parametrize("missing", ["forward_calls", "rollback"])
def test_a_drafter_missing_part_of_the_protocol_is_refused_by_name(missing):
    """A drafter without `forward_calls` or `rollback`: a TypeError that says what a Drafter needs."""
    target = make_model("llama", layers=1, seed=1)
    drafter = ScriptedDrafter([5], **{missing: False})
    with pytest.raises(TypeError, match=rf"ScriptedDrafter has no {missing}.*draft_model must be"):
        speculative_generate(target, drafter, torch.tensor([[3, 4]]), max_new_tokens=4, sampling=GREEDY)


def test_a_model_drafter_over_a_logits_source_gets_the_models_checks():
    """ModelDrafter(LeanForward(draft)) with another vocabulary: the same ValueError as the bare model."""
    from specdec_ref.drafting import ModelDrafter
    from specdec_ref.fast.lean import LeanForward

    target = make_model("llama", layers=1, seed=1)
    draft = make_model("llama", layers=1, vocab=80, seed=2)
    for given in (draft, ModelDrafter(LeanForward(draft), GREEDY)):
        with pytest.raises(ValueError, match="draft_model has a vocabulary of 80 tokens but target_model has 48"):
            speculative_generate(target, given, torch.tensor([[3, 4]]), max_new_tokens=4, sampling=GREEDY)


def test_lean_forward_and_prompt_lookup_name_their_bad_inputs():
    """A 1-D sequence to LeanForward.last_logits, a negative id to PromptLookupDrafter.draft."""
    from specdec_ref.fast.lean import LeanForward
    from specdec_ref.lookup import PromptLookupDrafter

    lean = LeanForward(make_model("llama", layers=1, seed=1))
    with pytest.raises(ValueError, match=r"sequence must have shape \(1, n\), got \(4,\)"):
        lean.last_logits(torch.tensor([3, 4, 5, 6]), 1)
    with pytest.raises(ValueError, match=r"input_ids holds token -2, outside \[0, 6\)"):
        PromptLookupDrafter().draft(torch.tensor([[1, -2, 3, 1]]), 3, vocab_size=6)


def test_one_rule_for_integer_arguments():
    """`validation.check_integer` takes ints, numpy integers and one-element integer tensors,
    refuses booleans, floats and values out of range by name, and every entry point uses it:
    a numpy integer is accepted wherever an int is."""
    import numpy as np

    from specdec_ref import SamplingConfig
    from specdec_ref.analysis import expected_tokens
    from specdec_ref.validation import check_integer

    assert check_integer("k", np.int64(3), minimum=1) == 3 and check_integer("k", torch.tensor(2), minimum=1) == 2
    assert check_integer("top_k", None, minimum=1, optional=True) is None
    for bad, match in ((True, "k must be an integer >= 1, got True"), (2.0, "got 2.0"), (0, "got 0")):
        with pytest.raises(ValueError, match=match):
            check_integer("k", bad, minimum=1)
    with pytest.raises(ValueError, match=r"max_length must be an integer in \[1, 8\], got 9"):
        check_integer("max_length", 9, minimum=1, maximum=8)
    with pytest.raises(ValueError, match="top_k must be None or an integer >= 1, got 0"):
        SamplingConfig(top_k=0)
    assert SamplingConfig(top_k=np.int32(5)).top_k == 5
    assert expected_tokens(0.5, np.int64(2)) == pytest.approx(1.75)
