"""The model registry, the embedded tiny pair, its corpus and its training script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from specdec_ref import SamplingConfig, autoregressive_generate, speculative_generate
from specdec_ref import models as models_module
from specdec_ref.drafting import draft_tokens
from specdec_ref.models import (
    PAIRS,
    TINY_DIR,
    PairUnavailableError,
    align_vocabularies,
    load_pair,
    restrict_vocabulary,
)
from specdec_ref.sampling import logits_to_probs
from specdec_ref.training.corpus import CorpusConfig, held_out_prompts, is_held_out, iter_documents, load_corpus
from specdec_ref.training.evaluate import perplexity
from specdec_ref.training.train import encode
from specdec_ref.validation import vocab_size
from specdec_ref.verification import target_distributions

# The quality bar of the model card, and the margin the tests allow below it: the tests
# use 8 prompts and 48 new tokens (the card: 32 prompts, 64 tokens), so their estimate
# of alpha rests on about 350 judged drafts; 0.1 is about four binomial standard errors.
ALPHA_GREEDY, ALPHA_TEMPERATURE_1, MARGIN = 0.6, 0.45, 0.1
QWEN_SMALL_VOCAB, QWEN_LARGE_VOCAB = 151936, 152064  # Qwen2.5-0.5B / 1.5B and Qwen2.5-7B


@pytest.fixture(scope="module")
def tiny():
    """(draft_model, target_model, tokenizer) of the embedded pair, float32 on the CPU."""
    return load_pair("tiny", device="cpu")


@pytest.fixture(scope="module")
def prompts(tiny):
    """Eight 32-token prompts from held-out documents (the first 8 of the model card's)."""
    return held_out_prompts(tiny[2], num_prompts=8, prompt_tokens=32)


def test_tiny_pair_loads_offline_and_generates_64_tokens():
    """A fresh interpreter with HF_HUB_OFFLINE=1 loads the shipped folders and generates."""
    code = (
        "import torch; from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "from specdec_ref.models import TINY_DIR\n"
        "tok = AutoTokenizer.from_pretrained(TINY_DIR / 'target')\n"
        "ids = tok('def main():', return_tensors='pt').input_ids\n"
        "for part in ('draft', 'target'):\n"
        "    m = AutoModelForCausalLM.from_pretrained(TINY_DIR / part).eval()\n"
        "    out = m.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False)\n"
        "    print(part, out.shape[1] - ids.shape[1])\n"
        "from specdec_ref.decoder import speculative_generate\n"
        "from specdec_ref.models import load_pair\n"
        "draft, target, tok = load_pair('tiny', device='cpu')\n"
        "out = speculative_generate(target, draft, ids, max_new_tokens=64,\n"
        "                           generator=torch.Generator().manual_seed(0))\n"
        "print('speculative', out.stats.new_tokens)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    # The limit only guards against a hang: on a busy machine this run can take minutes.
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "draft 64" in result.stdout and "target 64" in result.stdout and "speculative 64" in result.stdout


def test_tiny_pair_shapes_sizes_and_shared_vocabulary(tiny):
    """Target 10-30M params, draft 1-2 layers, one vocabulary, <= 30 MB of weights."""
    draft_model, target_model, tokenizer = tiny
    target_params = sum(p.numel() for p in target_model.parameters())
    assert 10e6 <= target_params <= 30e6
    assert draft_model.config.num_hidden_layers <= 2 < target_model.config.num_hidden_layers
    assert vocab_size(draft_model) == vocab_size(target_model) == len(tokenizer)
    assert draft_model.dtype == target_model.dtype == torch.float32
    assert target_model.generation_config.eos_token_id == tokenizer.eos_token_id
    sizes = [(TINY_DIR / part / "model.safetensors").stat().st_size for part in ("draft", "target")]
    assert sum(sizes) <= 30e6
    assert (TINY_DIR / "README.md").is_file()


def test_tiny_sampling_is_deterministic_at_a_fixed_seed(tiny, prompts):
    """The same seed gives the same sequences, speculative and autoregressive."""
    draft_model, target_model, _ = tiny

    def run(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        spec = speculative_generate(target_model, draft_model, prompts[0], max_new_tokens=32,
                                    generator=torch.Generator().manual_seed(seed))
        base = autoregressive_generate(target_model, prompts[0], max_new_tokens=32,
                                       generator=torch.Generator().manual_seed(seed))
        return spec.sequences, base.sequences

    first, again, other = run(0), run(0), run(1)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])  # the seed matters: sampling is really random


def test_tiny_greedy_speculative_matches_target_greedy(tiny, prompts):
    """Greedy speculative decoding reproduces the target's own greedy output on held-out prompts."""
    draft_model, target_model, tokenizer = tiny
    greedy = SamplingConfig(temperature=0.0)
    for prompt in prompts[:4]:
        spec = speculative_generate(target_model, draft_model, prompt, max_new_tokens=48, sampling=greedy,
                                    eos_token_id=tokenizer.eos_token_id)
        # transformers' own greedy search, which also stops right after EOS.
        hf = target_model.generate(prompt, max_new_tokens=48, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        assert torch.equal(spec.sequences, hf)


@pytest.mark.parametrize(("temperature", "threshold"), [(0.0, ALPHA_GREEDY), (1.0, ALPHA_TEMPERATURE_1)])
def test_tiny_acceptance_rate_on_held_out_prompts(tiny, prompts, temperature, threshold):
    """alpha (accepted / judged drafts) at K = 4 on held-out prompts: above the card's bar minus the margin."""
    draft_model, target_model, _ = tiny
    generator = torch.Generator().manual_seed(0)
    judged = accepted = 0
    for prompt in prompts:
        stats = speculative_generate(target_model, draft_model, prompt, max_new_tokens=48, num_draft_tokens=4,
                                     sampling=SamplingConfig(temperature=temperature), generator=generator).stats
        judged, accepted = judged + stats.judged_tokens, accepted + stats.accepted_tokens
    assert accepted / judged >= threshold - MARGIN


def test_tiny_target_perplexity_is_below_the_drafts(tiny):
    """On held-out text (the first 4096 tokens, as the card measures) the target predicts clearly better."""
    draft_model, target_model, tokenizer = tiny
    ids = encode(tokenizer, [d.text for d in iter_documents(side="held_out")])[:4096]  # (4096,)
    target_ppl, draft_ppl = perplexity(target_model, ids, 512), perplexity(draft_model, ids, 512)
    assert target_ppl < 0.8 * draft_ppl


def test_model_card_reports_measured_figures():
    """metrics.json holds the measured figures the card quotes, and they meet the bar."""
    metrics = json.loads((TINY_DIR / "metrics.json").read_text())
    card = (TINY_DIR / "README.md").read_text()
    assert metrics["acceptance"]["greedy"]["alpha"] >= ALPHA_GREEDY
    assert metrics["acceptance"]["temperature_1"]["alpha"] >= ALPHA_TEMPERATURE_1
    assert metrics["perplexity"]["target"] < metrics["perplexity"]["draft"]
    latency = metrics["latency_ms"]
    # c <= 0.1 holds for the decoder's fastest draft forward, lean.LeanForward. Through transformers
    # the same 1-layer pass is mostly per-call overhead and varies from run to run (0.085-0.164 on
    # one machine), so it is reported, and must cost more than the lean pass.
    assert latency["cost_ratio_c_lean"] <= 0.1
    assert latency["cost_ratio_c_lean"] < latency["cost_ratio_c"]
    assert f"c = {latency['cost_ratio_c_lean']:.3f}" in card
    assert f"{metrics['acceptance']['greedy']['alpha']:.3f}" in card
    assert f"{metrics['perplexity']['target']:.2f}" in card


def _qwen2(vocab: int, tied: bool, seed: int) -> Qwen2ForCausalLM:
    """A random Qwen2 with a real Qwen2.5 vocabulary size and tiny hidden sizes."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=tied, bos_token_id=0, eos_token_id=1, initializer_range=0.5)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config.pad_token_id = 1
    return model


def test_padded_vocabularies_are_restricted_to_the_shared_range():
    """Qwen2.5-shaped pair (151936 tied vs 152064 untied): same sizes after, same logits on kept ids."""
    draft_model = _qwen2(QWEN_SMALL_VOCAB, tied=True, seed=0)
    target_model = _qwen2(QWEN_LARGE_VOCAB, tied=False, seed=1)
    ids = torch.tensor([[5, 17, 151000, 42, 99]])  # (1, 5)
    with torch.no_grad():
        before = target_model(ids).logits  # (1, 5, 152064)
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(target_model, draft_model, ids, max_new_tokens=4)

    shared = align_vocabularies(draft_model, target_model)
    assert shared == QWEN_SMALL_VOCAB
    assert vocab_size(draft_model) == vocab_size(target_model) == shared
    assert target_model.get_input_embeddings().weight.shape[0] == shared
    assert draft_model.get_output_embeddings().weight is draft_model.get_input_embeddings().weight  # still tied
    with torch.no_grad():
        after = target_model(ids).logits  # (1, 5, 151936)
    torch.testing.assert_close(after, before[..., :shared])

    greedy = SamplingConfig(temperature=0.0)
    spec = speculative_generate(target_model, draft_model, ids, max_new_tokens=8, sampling=greedy)
    base = autoregressive_generate(target_model, ids, max_new_tokens=8, sampling=greedy)
    assert torch.equal(spec.sequences, base.sequences)


def _word_tokenizer(size: int) -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with exactly `size` ids ("w0" ... )."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {f"w{i}": i for i in range(size)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="w0")))


def _make_padding_loud(model: Qwen2ForCausalLM, real: int, scale: float = 50.0) -> None:
    """Scale the output rows of ids >= real, so that the padding ids dominate the softmax."""
    with torch.no_grad():
        model.get_output_embeddings().weight[real:] *= scale


def test_padding_ids_get_zero_probability_and_are_never_emitted():
    """Rows beyond the tokenizer are cut from both models: p and q cover only real ids, renormalised."""
    real = 256  # the tokenizer's ids; the draft has 300 rows (tied), the target 320 (untied)
    draft_model, target_model = _qwen2(300, tied=True, seed=0), _qwen2(320, tied=False, seed=1)
    _make_padding_loud(draft_model, real)
    _make_padding_loud(target_model, real)
    ids = torch.tensor([[5, 17, 200, 42, 99]])  # (1, 5)
    with torch.no_grad():
        before = {"draft": draft_model(ids).logits[0], "target": target_model(ids).logits[0]}  # (5, 300 or 320)
    for logits in before.values():  # unaligned, the padding ids would take nearly all the mass
        assert (logits.softmax(-1)[:, real:].sum(-1) > 0.99).all()

    assert align_vocabularies(draft_model, target_model, _word_tokenizer(real)) == real
    assert vocab_size(draft_model) == vocab_size(target_model) == target_model.config.vocab_size == real
    assert draft_model.get_output_embeddings().weight is draft_model.get_input_embeddings().weight  # still tied

    # What is sampled: each model's softmax renormalised over the real ids (here at T = 0.7).
    sampling = SamplingConfig(temperature=0.7)
    for name, model in (("draft", draft_model), ("target", target_model)):
        with torch.no_grad():
            probs = logits_to_probs(model(ids).logits[0], sampling)  # (5, real)
        torch.testing.assert_close(probs, (before[name][:, :real] / 0.7).softmax(-1))

    # q and p, as the decoder computes them, lie on the real ids only, and so does every token drawn.
    generator = torch.Generator().manual_seed(0)
    draft = draft_tokens(draft_model, ids, 4, sampling, generator)
    p = target_distributions(target_model, ids, draft.tokens, sampling)
    assert draft.probs.shape == (4, real) and p.shape == (5, real)
    torch.testing.assert_close(p.sum(-1), torch.ones(5))
    for seed in range(3):
        out = speculative_generate(target_model, draft_model, ids, max_new_tokens=24, num_draft_tokens=3,
                                   generator=torch.Generator().manual_seed(seed))
        assert int(out.sequences.max()) < real
        assert max(token for record in out.trace for token in record.drafted) < real

    # Greedy: the target's own `generate` on the restricted model, i.e. the argmax over real ids.
    greedy = SamplingConfig(temperature=0.0)
    eos = target_model.generation_config.eos_token_id
    spec = speculative_generate(target_model, draft_model, ids, max_new_tokens=24, sampling=greedy, eos_token_id=eos)
    hf = target_model.generate(ids, max_new_tokens=24, do_sample=False)
    assert torch.equal(spec.sequences, hf)
    assert int(spec.sequences[0, ids.size(1)]) == int(before["target"][-1, :real].argmax())


@pytest.mark.parametrize(
    ("cuda", "native_bf16", "emulated_bf16", "expected"),
    [
        (True, True, True, torch.bfloat16),  # Ampere and newer: bf16 in hardware
        (True, False, True, torch.float16),  # a T4: bf16 only through emulation
        (False, False, False, torch.float32),  # a CPU
    ],
)
def test_default_dtype_is_bfloat16_only_where_the_gpu_computes_it(monkeypatch, cuda, native_bf16, emulated_bf16,
                                                                   expected):
    """Native bf16 -> bfloat16, emulated-only bf16 -> float16, CPU -> float32; the tiny pair stays float32."""

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return native_bf16 or (including_emulation and emulated_bf16)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    device = models_module._default_device(None)
    assert device.type == ("cuda" if cuda else "cpu")
    assert models_module._default_dtype(None, device, embedded=False) is expected
    assert models_module._default_dtype(None, device, embedded=True) is torch.float32
    assert models_module._default_dtype(torch.float16, device, embedded=False) is torch.float16


def test_restrict_vocabulary_rejects_a_size_out_of_range():
    """The size must lie in [1, V]."""
    model = _qwen2(300, tied=True, seed=0)
    for bad in (0, 301):
        with pytest.raises(ValueError, match="size must be in"):
            restrict_vocabulary(model, bad)


def test_align_vocabularies_rejects_a_tokenizer_beyond_the_shared_range(tiny):
    """A tokenizer with ids the models cannot score is an error, not a silent cut."""
    _, _, tokenizer = tiny
    small, large = _qwen2(len(tokenizer) - 10, tied=True, seed=0), _qwen2(len(tokenizer), tied=True, seed=1)
    with pytest.raises(ValueError, match="do not share a vocabulary"):
        align_vocabularies(small, large, tokenizer)


@pytest.mark.parametrize("name", [n for n, spec in PAIRS.items() if not spec.embedded])
def test_unreachable_hub_pair_raises_an_error_suggesting_tiny(name, tmp_path):
    """With no network and an empty cache, a hub pair fails with a message that names 'tiny'."""
    with pytest.raises(PairUnavailableError, match="load_pair\\('tiny'\\)"):
        load_pair(name, device="cpu", local_files_only=True, cache_dir=tmp_path)


def test_load_pair_rejects_bad_arguments():
    """Unknown names, device_map for the tiny pair, device_map without accelerate."""
    with pytest.raises(ValueError, match="name must be one of"):
        load_pair("gpt5")
    with pytest.raises(ValueError, match="device_map"):
        load_pair("tiny", device_map="auto")
    try:
        import accelerate  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="accelerate"):
            load_pair("gpt2", device_map="auto", local_files_only=True)


def test_corpus_split_is_disjoint_and_a_function_of_the_name():
    """Held-out documents never appear in training; the split depends only on names."""
    config = CorpusConfig(max_documents=200)
    corpus = load_corpus(config)
    train, held_out = {d.name for d in corpus.train}, {d.name for d in corpus.held_out}
    assert train and held_out and not train & held_out
    assert all(is_held_out(name, config) for name in held_out)
    assert [d.name for d in iter_documents(config, side="held_out")] == [d.name for d in corpus.held_out]
    assert any(name.startswith("topics/") for name in train | held_out)


def test_held_out_prompts_are_deterministic(tiny):
    """Same seed, same prompts; another seed, other prompts; the requested shape."""
    tokenizer = tiny[2]
    first = held_out_prompts(tokenizer, num_prompts=3, prompt_tokens=16, seed=0)
    again = held_out_prompts(tokenizer, num_prompts=3, prompt_tokens=16, seed=0)
    other = held_out_prompts(tokenizer, num_prompts=3, prompt_tokens=16, seed=1)
    assert all(p.shape == (1, 16) for p in first)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.slow
def test_training_quick_run_writes_a_loadable_pair(tmp_path):
    """`python -m specdec_ref.training --quick` writes folders, metrics, log and card."""
    from specdec_ref.models import load_pair_from_folder
    from specdec_ref.training.train import main

    metrics = main(["--quick", "--out", str(tmp_path), "--threads", "1"])
    draft_model, target_model, tokenizer = load_pair_from_folder(tmp_path, device="cpu")
    assert vocab_size(draft_model) == vocab_size(target_model) == len(tokenizer)
    assert AutoTokenizer.from_pretrained(tmp_path / "draft").get_vocab() == tokenizer.get_vocab()
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "target").dtype == torch.float32
    log = (tmp_path / "training_log.csv").read_text().splitlines()
    assert log[0].startswith("stage,step,loss") and any(row.startswith("draft,") for row in log)
    assert metrics["acceptance"]["greedy"]["matches_target_greedy"] == "2/2"
    assert Path(tmp_path / "README.md").read_text().count("|") > 20

    # --draft-only: the same target, a new draft trained longer, the card rewritten.
    target_before = (tmp_path / "target" / "model.safetensors").read_bytes()
    draft_before = (tmp_path / "draft" / "model.safetensors").read_bytes()
    again = main(["--quick", "--draft-only", "--draft-steps", "6", "--out", str(tmp_path), "--threads", "1"])
    assert (tmp_path / "target" / "model.safetensors").read_bytes() == target_before
    assert (tmp_path / "draft" / "model.safetensors").read_bytes() != draft_before
    assert again["config"]["draft_steps"] == 6 and again["config"]["target_steps"] == metrics["config"]["target_steps"]
    assert again["seconds"]["target"] == metrics["seconds"]["target"]
    stages = [row.split(",")[:2] for row in (tmp_path / "training_log.csv").read_text().splitlines()[1:]]
    assert [step for stage, step in stages if stage == "draft"] == ["2", "4", "6"]  # only the new draft's rows
    assert any(stage == "target" for stage, _ in stages)
    card = (tmp_path / "README.md").read_text()
    assert "| 6 steps, distilled" in card and "--draft-only" in card
    assert again["acceptance"]["greedy"]["matches_target_greedy"] == "2/2"
