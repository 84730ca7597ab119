"""The article's loop is reproduced with its errata: biased law, extra token, overshoot, no EOS, rate > 100%."""

import copy

import pytest
import torch

import specdec_ref.article as article_module
from specdec_ref.article import article_draft, article_generate, article_law
from specdec_ref.audit import audit
from specdec_ref.laws import decoder_law, law_tv, small_random_pair, target_law
from specdec_ref.sampling import SamplingConfig

PROMPT = torch.tensor([[1, 2, 3]])


@pytest.fixture(scope="module")
def small_pair():
    """A random target / draft pair on 8 tokens whose p and q disagree."""
    return small_random_pair(8, seed=4)


def test_article_first_token_follows_the_biased_law(small_pair):
    """Its first token follows min(p, q) + (1 - beta) p, not p: the audit fails it and matches the prediction."""
    target, draft = small_pair
    exact = target_law(target, PROMPT, SamplingConfig(), 1)
    predicted = decoder_law(target, draft, PROMPT, num_draft_tokens=1, num_tokens=1, rule="article")
    assert law_tv(predicted, exact) > 0.15

    def article(input_ids, generator):
        return article_generate(target, draft, input_ids, max_new_tokens=1, num_draft_tokens=1, generator=generator)

    assert not audit(article, PROMPT, exact, num_samples=500, first_token_speculative=True,
                     generator=torch.Generator().manual_seed(0)).passed
    assert audit(article, PROMPT, predicted, num_samples=500, first_token_speculative=True,
                 generator=torch.Generator().manual_seed(1)).passed


class Chooser:
    """Replays one sequence of choices (`script`), then takes the first option at every
    new choice point and queues its siblings in `pending`; `weight` is the run's probability."""

    def __init__(self, script, pending):
        self.script, self.pending, self.taken, self.weight = script, pending, [], 1.0

    def choose(self, options):
        # options: (value, probability > 0).
        if len(self.taken) < len(self.script):
            index = self.script[len(self.taken)]
        else:
            index = 0
            self.pending.extend(tuple(self.taken) + (j,) for j in range(1, len(options)))
        self.taken.append(index)
        self.weight *= options[index][1]
        return options[index][0]

    def draw(self, probs, generator):
        return self.choose([(y, float(probs[y])) for y in probs.nonzero().flatten().tolist()])

    def coin(self, ratio, generator):
        accept = min(1.0, ratio)
        return self.choose([(v, w) for v, w in ((True, accept), (False, 1 - accept)) if w > 0])


def code_law(monkeypatch, run, num_tokens):
    """The exact law of the first `num_tokens` tokens `run()` emits, by following every
    random branch of the article's code itself: its two sources of randomness
    (`_draw`, `_coin`) are replaced by a chooser that replays every sequence of
    choices once, weighting each by its probability."""
    pending, law = [()], {}
    while pending:
        chooser = Chooser(pending.pop(), pending)
        monkeypatch.setattr(article_module, "_draw", chooser.draw)
        monkeypatch.setattr(article_module, "_coin", chooser.coin)
        tokens = tuple(run()[:num_tokens])
        law[tokens] = law.get(tokens, 0.0) + chooser.weight
    return law


def test_article_loop_draws_an_extra_token_after_a_last_slot_rejection(monkeypatch, small_pair):
    """Erratum 10, by exact enumeration of the code: after a rejection at the last slot the
    length test len(emitted) == K holds and a "bonus" is drawn from p after the rejected
    draft. At K = 1 every block emits 2 tokens and the first two follow a law at TV about
    0.43 from the target's, where the zero residual alone gives about 0.2."""
    target, draft = small_pair

    def run():
        out = article_generate(target, draft, PROMPT, max_new_tokens=2, num_draft_tokens=1)
        return out.sequences[0, PROMPT.size(1):].tolist()

    code = code_law(monkeypatch, run, 2)
    monkeypatch.undo()
    assert sum(code.values()) == pytest.approx(1, abs=1e-5)
    exact = target_law(target, PROMPT, SamplingConfig(), 2)
    rule_only = decoder_law(target, draft, PROMPT, num_draft_tokens=1, num_tokens=2, rule="article")
    assert law_tv(code, exact) > 0.4 and law_tv(rule_only, exact) < 0.25
    assert law_tv(code, rule_only) > 0.25  # a loop without erratum 10 fails here
    # `article_law` enumerates the same law (float32 code against float64 enumeration).
    assert law_tv(code, article_law(target, draft, PROMPT, num_draft_tokens=1, num_tokens=2)) < 1e-5
    # At K = 1 every block emits 2 tokens: a correction comes with an extra token.
    out = article_generate(target, draft, PROMPT, max_new_tokens=40, num_draft_tokens=1,
                           generator=torch.Generator().manual_seed(0))
    assert {len(r.emitted) for r in out.trace} == {2}


def test_article_law_hides_the_extra_token_when_k_reaches_the_outcome(small_pair):
    """With K >= m the extra token comes after the first m tokens, and only the zero
    residual shows (K = 2 over 2 tokens); K = 2 over 3 tokens shows it."""
    target, draft = small_pair
    for k, m, shows in ((2, 2, False), (2, 3, True)):
        loop = article_law(target, draft, PROMPT, num_draft_tokens=k, num_tokens=m)
        rule_only = decoder_law(target, draft, PROMPT, num_draft_tokens=k, num_tokens=m, rule="article")
        assert sum(loop.values()) == pytest.approx(1, abs=1e-12)
        assert (law_tv(loop, rule_only) > 0.03) is shows


def test_article_loop_is_exact_when_the_draft_is_the_target(small_pair):
    """With q = p nothing is ever rejected, so the zero residual never matters: the audit passes."""
    target, _ = small_pair
    twin = copy.deepcopy(target)

    def article(input_ids, generator):
        return article_generate(target, twin, input_ids, max_new_tokens=2, num_draft_tokens=2, generator=generator)

    exact = target_law(target, PROMPT, SamplingConfig(), 2)
    assert audit(article, PROMPT, exact, num_samples=300, num_tokens=2,
                 generator=torch.Generator().manual_seed(0)).passed


def test_article_drafting_keeps_only_the_scalar_q(small_pair):
    """Drafting returns K token ids and K floats, q_i(x_i): not the (K, V) rows the residual needs."""
    _, draft = small_pair
    tokens, scalars = article_draft(draft, PROMPT, 3, generator=torch.Generator().manual_seed(0))
    assert len(tokens) == len(scalars) == 3
    assert all(isinstance(s, float) and 0 < s <= 1 for s in scalars)


def test_article_loop_overshoots_max_new_tokens(small_pair):
    """max_new_tokens = 1 with K = 4 can emit up to 5 tokens; some seed does emit more than 1."""
    target, draft = small_pair
    lengths = set()
    for seed in range(20):
        out = article_generate(target, draft, PROMPT, max_new_tokens=1, num_draft_tokens=4,
                               generator=torch.Generator().manual_seed(seed))
        lengths.add(out.sequences.size(1) - PROMPT.size(1))
    assert min(lengths) >= 1 and max(lengths) <= 5
    assert max(lengths) > 1


def test_article_loop_runs_past_eos(small_pair):
    """eos_token_id is ignored: tokens follow the first EOS."""
    target, draft = small_pair
    out = article_generate(target, draft, PROMPT, max_new_tokens=40, num_draft_tokens=2,
                           generator=torch.Generator().manual_seed(0))
    new = out.sequences[0, PROMPT.size(1):].tolist()
    eos = new[0]  # call the first emitted token "EOS"
    again = article_generate(target, draft, PROMPT, max_new_tokens=40, num_draft_tokens=2,
                             generator=torch.Generator().manual_seed(0), eos_token_id=eos)
    assert again.sequences.tolist() == out.sequences.tolist()
    assert len(new) >= 40


def test_article_acceptance_rate_can_exceed_one(small_pair):
    """With q = p every draft and the bonus are 'accepted': (K + 1) / K > 100%."""
    target, _ = small_pair
    twin = copy.deepcopy(target)
    out = article_generate(target, twin, PROMPT, max_new_tokens=12, num_draft_tokens=3,
                           generator=torch.Generator().manual_seed(0))
    assert out.acceptance_rate == pytest.approx(4 / 3)
    assert out.accepted == sum(len(r.emitted) for r in out.trace)
    assert out.drafted == 3 * out.iterations


def test_article_errors_name_the_argument(small_pair):
    """Malformed arguments raise errors that name them."""
    target, draft = small_pair
    with pytest.raises(ValueError, match="temperature"):
        article_generate(target, draft, PROMPT, max_new_tokens=2, temperature=0.0)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        article_generate(target, draft, PROMPT, max_new_tokens=2, num_draft_tokens=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        article_generate(target, draft, PROMPT, max_new_tokens=-1)
    with pytest.raises(ValueError, match="input_ids"):
        article_generate(target, draft, PROMPT[0], max_new_tokens=2)
    with pytest.raises(TypeError, match="generator"):
        article_generate(target, draft, PROMPT, max_new_tokens=2, generator=0)
