"""batched_speculative_generate is exact per row: greedy token for token, sampling in law."""

import random

import pytest
import torch
from conftest import chi_square_pvalue, exact_joint_law, generator_on, make_model, needs_bf16_packing, noisy_copy

from specdec_ref import SamplingConfig, rejection, speculative_generate
from specdec_ref.batched import BatchedForward, accept_reject_rows, batched_speculative_generate
from specdec_ref.kv_cache import FullForward
from specdec_ref.rejection import accept_reject, emission_distribution

GREEDY = SamplingConfig(temperature=0.0)


def random_prompts(lengths, seed=0, vocab=48, device="cpu"):
    """One 1-D prompt per length, ids in [2, vocab) (0 and 1 are BOS / EOS), on `device`."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=generator).to(device) for n in lengths]


def count_passes(model):
    """Record the batch size of every forward pass of `model`: (list, hook handle)."""
    sizes = []
    handle = model.register_forward_pre_hook(lambda _, args, kwargs: sizes.append(
        (args[0] if args else kwargs["input_ids"]).size(0)), with_kwargs=True)
    return sizes, handle


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_rows_match_target_generate(close_pair, k, device):
    """Temperature 0: every row, whatever its length, is the target's greedy output,
    token for token (transformers' generate and speculative_generate, float32)."""
    target, draft = (model.to(device) for model in close_pair)
    prompts = random_prompts([1, 4, 7, 10], seed=k, device=device)
    outs = batched_speculative_generate(target, draft, prompts, max_new_tokens=40, num_draft_tokens=k,
                                        sampling=GREEDY)
    for prompt, out in zip(prompts, outs, strict=True):
        expected = target.generate(prompt[None], max_new_tokens=40, min_new_tokens=40, do_sample=False)
        assert torch.equal(out.sequences, expected)
        single = speculative_generate(target, draft, prompt[None], max_new_tokens=40, num_draft_tokens=k,
                                      sampling=GREEDY)
        assert torch.equal(out.sequences, single.sequences)
        assert out.stats.accepted_tokens == single.stats.accepted_tokens
    # Rows accepted different numbers of drafts, so they fell out of step.
    assert len({out.stats.accepted_tokens for out in outs}) > 1
    assert 0 < sum(o.stats.accepted_tokens for o in outs) < sum(o.stats.drafted_tokens for o in outs)


def test_batched_forward_matches_full_forward_after_rollbacks(pair, device):
    """The realigned, left-padded cache gives every row the logits of a fresh pass over
    that row alone, after feeds of different sizes and per-row rollbacks."""
    target = pair[0].to(device)
    rng = random.Random(0)
    rows = [row.tolist() for row in random_prompts([1, 6, 3], seed=4)]
    source, full = BatchedForward(target, len(rows)), FullForward(target)
    for step in range(10):
        # Each row gets 0 to 3 new tokens after its unseen last one: rows fall out of step.
        new = [rng.randint(0, 3) for _ in rows]
        rows = [row + [rng.randrange(2, 48) for _ in range(k)] for row, k in zip(rows, new, strict=True)]
        m = 1 + min(new)
        logits = source.last_logits(rows, m)  # (B, m, V)
        for b, row in enumerate(rows):
            fresh = full.last_logits(torch.tensor([row], device=device), m)
            assert torch.allclose(logits[b], fresh, atol=1e-5), (step, b)
        # Each row keeps a different prefix, at times older than this pass; its last token stays unseen.
        keep = [rng.randint(max(1, len(row) - 6), len(row) - 1) for row in rows]
        rows = [row[:n + 1] for row, n in zip(rows, keep, strict=True)]
        source.rollback(keep)
    assert source.width <= max(len(row) for row in rows) + 3  # padding columns do not pile up


def law_pvalues(sampling, family="gpt2", copies=1500, device="cpu"):
    """One batch holding `copies` rows of each of three prompts of different lengths
    (interleaved), generated on `device`; the chi-square p-value of each prompt's first
    3 tokens against its exact law (computed on the CPU)."""
    vocab = 5
    target = make_model(family, layers=1, width=32, vocab=vocab, seed=7, init_range=0.5)
    draft = noisy_copy(target, noise=0.8, seed=8)
    prompts = [torch.tensor([1]), torch.tensor([1, 2]), torch.tensor([3, 0, 4, 2])]
    laws = [exact_joint_law(target, prompt, sampling, 3, vocab) for prompt in prompts]
    outs = batched_speculative_generate(target.to(device), draft.to(device),
                                        [prompt.to(device) for prompt in prompts] * copies, max_new_tokens=3,
                                        num_draft_tokens=2, sampling=sampling, generator=generator_on(device, 123))
    accepted = sum(out.stats.accepted_tokens for out in outs)
    assert 0 < accepted < sum(out.stats.drafted_tokens for out in outs)  # both branches ran
    pvalues = []
    for i, (prompt, law) in enumerate(zip(prompts, laws, strict=True)):
        samples = [tuple(out.sequences[0, prompt.numel():].tolist()) for out in outs[i::len(prompts)]]
        pvalues.append(chi_square_pvalue(law, samples))
    return pvalues


def test_row_rule_has_the_law_of_accept_reject(device):
    """accept_reject_rows emits, in every row, what accept_reject would: the law of
    emission_distribution (chi-square), rows with K_b = 2 and K_b = 1 in one batch."""
    generator = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(2, 4, generator=generator) * 2, -1)  # (K, V)
    p = torch.softmax(torch.randn(3, 4, generator=generator) * 2, -1)  # (K + 1, V)
    rows = 20000
    drafted = torch.stack([torch.multinomial(q[i], rows, replacement=True, generator=generator)
                           for i in range(2)], 1)  # (B, K): drafts sampled from q
    num_drafts = [2, 1] * (rows // 2)
    # The inputs come from the CPU generator; the rule draws on `device` (on the CPU, from
    # the same generator as before).
    rule_generator = generator if device == "cpu" else generator_on(device, 0)
    emitted = accept_reject_rows(drafted.to(device), q.expand(rows, -1, -1).to(device),
                                 p.expand(rows, -1, -1).to(device), num_drafts, rule_generator)
    for k, law in ((2, emission_distribution(q, p)), (1, emission_distribution(q[:1], p[:2]))):
        samples = [tuple(e) for e, kb in zip(emitted, num_drafts, strict=True) if kb == k]
        assert chi_square_pvalue(law, samples) > 1e-3
        assert max(map(len, samples)) == k + 1  # whole blocks were accepted
    # Greedy: the same tokens as accept_reject, row by row.
    p_rows = torch.softmax(torch.randn(64, 4, 6, generator=generator) * 3, -1)  # (B, K + 1, V)
    greedy_drafts = torch.where(torch.rand(64, 3, generator=generator) < 0.7, p_rows[:, :3].argmax(-1),
                                torch.randint(0, 6, (64, 3), generator=generator))
    counts = [3, 2, 0, 1] * 16
    q_rows = torch.nn.functional.one_hot(greedy_drafts, 6).float()
    rows_out = accept_reject_rows(greedy_drafts.to(device), q_rows.to(device), p_rows.to(device), counts,
                                  greedy=True)
    for b in range(64):
        k = counts[b]
        assert rows_out[b] == accept_reject(greedy_drafts[b, :k], q_rows[b, :k], p_rows[b, :k + 1], greedy=True)


@pytest.mark.parametrize("family, sampling", [("gpt2", SamplingConfig(1.0)), ("llama", SamplingConfig(1.0)),
                                              ("gpt2", SamplingConfig(0.7, top_k=3))])
def test_sampled_rows_follow_target_law(family, sampling, device):
    """Each row's first 3 tokens follow the target's exact joint law (chi-square),
    for prompts of lengths 1, 2 and 4 sharing one batch."""
    assert min(law_pvalues(sampling, family, device=device)) > 1e-3


@pytest.mark.slow
def test_chi_square_rejects_the_article_rule(monkeypatch, device):
    """Power check: the same test fails when rejected drafts are resampled from p
    (the source article's biased rule) instead of the residual."""
    monkeypatch.setattr(rejection, "residual_distribution", lambda p, q: p)
    assert max(law_pvalues(SamplingConfig(1.0), device=device)) < 1e-6  # every prompt fails


def test_same_seed_same_output(close_pair):
    """Same prompts, seed and arguments: the same rows and traces; the cache-free path
    consumes the generator in the same order and gives the same rows."""
    target, draft = close_pair
    prompts = random_prompts([2, 5, 3], seed=1)

    def run(seed, use_cache=True):
        return batched_speculative_generate(target, draft, prompts, max_new_tokens=20, num_draft_tokens=3,
                                            generator=torch.Generator().manual_seed(seed), use_cache=use_cache)

    first, again, recompute, other = run(7), run(7), run(7, use_cache=False), run(8)
    for a, b, c in zip(first, again, recompute, strict=True):
        assert torch.equal(a.sequences, b.sequences) and a.trace == b.trace
        assert torch.equal(a.sequences, c.sequences)
    assert any(not torch.equal(a.sequences, d.sequences) for a, d in zip(first, other, strict=True))


def test_each_row_stops_right_after_its_eos():
    """A row ends right after its own first EOS (even inside an accepted block); the
    other rows go on to their budget."""
    target = make_model("llama", layers=2, seed=1)
    draft = noisy_copy(target, noise=0.1, seed=3)
    prompts = random_prompts([3, 6, 2], seed=2)
    references = [target.generate(p[None], max_new_tokens=30, min_new_tokens=30, do_sample=False)[0, p.numel():]
                  for p in prompts]
    # An EOS id that row 0 emits early and that some other row never emits.
    eos = next(t for t in references[0][2:].tolist() if any(t not in r.tolist() for r in references[1:]))
    outs = batched_speculative_generate(target, draft, prompts, max_new_tokens=30, num_draft_tokens=4,
                                        sampling=GREEDY, eos_token_id=eos)
    stopped = 0
    for prompt, reference, out in zip(prompts, references, outs, strict=True):
        tokens = reference.tolist()
        expected = tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
        assert out.sequences[0, prompt.numel():].tolist() == expected
        assert out.stats.new_tokens == len(expected)
        stopped += len(expected) < 30
    assert 1 <= stopped < len(prompts)


def test_finished_rows_leave_the_batch(close_pair):
    """One draft pass per draft step and one target pass per iteration for the whole
    batch, and a row that has finished is no longer in the passes."""
    target, draft = close_pair
    prompts = random_prompts([4, 2, 6], seed=3)
    target_sizes, target_hook = count_passes(target)
    draft_sizes, draft_hook = count_passes(draft)
    try:
        outs = batched_speculative_generate(target, draft, prompts, max_new_tokens=30, num_draft_tokens=3,
                                            generator=torch.Generator().manual_seed(0))
    finally:
        target_hook.remove()
        draft_hook.remove()
    # One target pass per iteration; each row counts the passes it took part in.
    assert len(target_sizes) == max(out.stats.iterations for out in outs)
    assert [out.stats.target_calls for out in outs] == [out.stats.iterations for out in outs]
    assert len(draft_sizes) == max(out.stats.draft_calls for out in outs)
    # Rows finish at different iterations, and the passes shrink as they do.
    assert len({out.stats.iterations for out in outs}) > 1
    iterations = [out.stats.iterations for out in outs]
    assert target_sizes == [sum(n > t for n in iterations) for t in range(max(iterations))]
    assert target_sizes[0] == 3 > target_sizes[-1]


@pytest.mark.parametrize("max_new_tokens", [0, 1, 2, 7])
@pytest.mark.parametrize("k", [1, 4])
def test_exactly_max_new_tokens_per_row(close_pair, max_new_tokens, k):
    """Never more, never fewer than max_new_tokens in any row without an EOS."""
    target, draft = close_pair
    prompts = random_prompts([1, 3, 2], seed=5)
    outs = batched_speculative_generate(target, draft, prompts, max_new_tokens=max_new_tokens,
                                        num_draft_tokens=k, generator=torch.Generator().manual_seed(0))
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.sequences.shape == (1, prompt.numel() + max_new_tokens)
        assert torch.equal(out.sequences[0, :prompt.numel()], prompt)
        assert out.stats.new_tokens == max_new_tokens == sum(len(r.emitted) for r in out.trace)


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"prompts": torch.tensor([1, 2])}, TypeError, "prompts must be a list"),
        ({"prompts": []}, ValueError, "prompts is empty"),
        ({"prompts": [torch.tensor([1, 2]), torch.tensor([[3, 4]])]}, ValueError, r"prompts\[1\] must have shape"),
        ({"prompts": [torch.tensor([1]), torch.empty(0, dtype=torch.long)]}, ValueError, r"prompts\[1\] is empty"),
        ({"prompts": [torch.tensor([1.0])]}, TypeError, r"prompts\[0\] must be a 1-D integer"),
        ({"prompts": [torch.tensor([1]), torch.tensor([3, 99])]}, ValueError, r"prompts\[1\] must hold token ids"),
        ({"num_draft_tokens": 0}, ValueError, "num_draft_tokens"),
        ({"num_draft_tokens": 2.0}, TypeError, "num_draft_tokens"),
        ({"max_new_tokens": -1}, ValueError, "max_new_tokens"),
        ({"max_new_tokens": 600}, ValueError, "context length"),
        ({"eos_token_id": -3}, ValueError, "eos_token_id"),
        ({"sampling": 0.0}, TypeError, "sampling"),
        ({"generator": 0}, TypeError, "generator"),
    ],
)
def test_bad_arguments_name_the_argument(pair, change, error, match):
    """Every malformed argument is named in the error, before any model runs."""
    target, draft = pair
    kwargs = {"prompts": [torch.tensor([1, 2]), torch.tensor([3])], "max_new_tokens": 4, "num_draft_tokens": 2,
              **change}
    with pytest.raises(error, match=match):
        batched_speculative_generate(target, draft, **kwargs)


def test_mismatched_models_are_refused():
    """A draft with another vocabulary, or a draft that is not a model, is refused."""
    target = make_model("gpt2", vocab=48)
    with pytest.raises(ValueError, match="vocabulary"):
        batched_speculative_generate(target, make_model("gpt2", vocab=40), [torch.tensor([1])], max_new_tokens=2)
    with pytest.raises(TypeError, match="draft_model"):
        batched_speculative_generate(target, "gpt2", [torch.tensor([1])], max_new_tokens=2)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(1.0)], ids=["greedy", "t1"])
def test_rows_near_the_context_limit_never_get_drafts_past_their_budget(sampling):
    """Prompts of 30 and 2 tokens, n_positions 36, 6 new tokens, K = 4: a row near its
    budget is fed only the drafts it may judge, never positions past the context, and
    greedy rows stay the target's greedy output."""
    target = make_model("gpt2", layers=2, seed=1, positions=36)
    draft = noisy_copy(target, noise=0.3, seed=2)  # close enough to accept whole blocks
    prompts = random_prompts([30, 2], seed=4)
    for seed in range(6):
        outs = batched_speculative_generate(target, draft, prompts, max_new_tokens=6, num_draft_tokens=4,
                                            sampling=sampling, generator=torch.Generator().manual_seed(seed))
        for prompt, out in zip(prompts, outs, strict=True):
            assert out.sequences.size(1) == len(prompt) + 6
            if sampling.greedy:
                expected = target.generate(prompt[None], max_new_tokens=6, min_new_tokens=6, do_sample=False)
                assert torch.equal(out.sequences, expected)


@needs_bf16_packing
@pytest.mark.parametrize("attention", ["grouped_eager", "rowwise_sdpa"])
def test_bfloat16_padded_batches_are_row_invariant_with_rowwise_attention(attention):
    """bfloat16, prepacked, grouped eager or row-by-row attention: a padded batch's logits are,
    row by row, bitwise what the row alone gives, so batched greedy is `generate`'s output
    for every row whatever the other rows are (12 prompts of different lengths)."""
    from specdec_ref.fast.batch_invariant import use_rowwise_attention
    from specdec_ref.fast.packed import pack_linear_layers, packing_unsupported
    from specdec_ref.kv_cache import CachedForward

    if packing_unsupported(torch.nn.Linear(2, 2)) is not None:
        pytest.skip("this torch build cannot prepack linear layers")
    target = make_model("llama", layers=2, seed=11).to(torch.bfloat16)
    draft = make_model("llama", layers=1, seed=12).to(torch.bfloat16)
    for model in (target, draft):
        pack_linear_layers(model)
        use_rowwise_attention(model, attention)
    prompts = random_prompts([3, 17, 9, 30, 1, 12, 25, 6, 20, 4, 14, 8], seed=5)
    rows = [prompt.tolist() for prompt in prompts]
    batch = BatchedForward(target, len(rows))
    batch.last_logits(rows, 1)  # a first pass fills the cache
    longer = [row + [7, 9, 11, 13][: 1 + i % 4] for i, row in enumerate(rows)]  # ragged again
    together = batch.last_logits(longer, 2)  # (B, 2, V)
    for row, logits in zip(longer, together, strict=True):
        alone = CachedForward(target).last_logits(torch.tensor([row]), 2)
        assert torch.equal(logits, alone)
    outs = batched_speculative_generate(target, draft, prompts, max_new_tokens=24, num_draft_tokens=4,
                                        sampling=GREEDY)
    for prompt, out in zip(prompts, outs, strict=True):
        expected = target.generate(prompt[None], max_new_tokens=24, min_new_tokens=24, do_sample=False)
        assert torch.equal(out.sequences, expected)
