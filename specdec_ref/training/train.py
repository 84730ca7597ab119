"""Train the embedded tiny pair from scratch: tokenizer, target, distilled draft, model card.

`python -m specdec_ref.training` rebuilds `specdec_ref/pairs/tiny` from the Python
installation's own text (`corpus`) with a fixed seed, on a GPU when there is one and in
well under an hour on 2 CPU cores otherwise:

1. a byte-level BPE tokenizer (`tokenizers`), saved as a `PreTrainedTokenizerFast`;
2. the target, a Llama-style causal LM, trained on next-token cross-entropy;
3. the draft, one layer, trained by distillation: it minimises KL(p || q) between the
   target's next-token distribution p and its own q at every position. Speculative
   decoding accepts a drafted token with probability min(1, p/q), so the expected
   acceptance is sum_x min(p(x), q(x)) = 1 - TV(p, q): a draft that imitates the target
   is worth more than one that models the text on its own;
4. both saved in float16 safetensors, reloaded the way `load_pair` loads them, and
   measured (`evaluate`): held-out perplexity, acceptance rates with
   `speculative_generate`, per-token latencies; the numbers go to `metrics.json` and
   the model card `README.md`.

`--draft-only` keeps a trained folder's tokenizer and target and trains a new draft against
it (e.g. distilled for longer), then measures the pair and rewrites the card.

Invariant: the same seed, Python installation and hardware give the same tokenizer,
the same training batches and the same weights; the card only reports measured values.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from .config import DEFAULT_OUT, ModelShape, TrainConfig
from .corpus import CorpusConfig, load_corpus
from .evaluate import evaluate_tiny, write_card

EOS = "<|endoftext|>"
def train_tokenizer(texts: list[str], vocab_size: int, context: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2 style) trained on `texts`, wrapped for `transformers`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=EOS, eos_token=EOS, pad_token=EOS,
                                   unk_token=None, model_max_length=context)


def encode(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """All texts as one stream of token ids, each document followed by EOS: (N,)."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for encoding in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.extend(encoding.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)  # (N,)


def build_model(shape: ModelShape, tokenizer: PreTrainedTokenizerFast, context: int, seed: int) -> LlamaForCausalLM:
    """A randomly initialised Llama-style model with tied input/output embeddings."""
    eos = tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=shape.width, intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=context, tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos,
        pad_token_id=eos, initializer_range=0.02,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    return model


def _lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak`, then cosine decay to a tenth of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(steps - warmup, 1)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_model(
    model: PreTrainedModel,
    ids: torch.Tensor,
    config: TrainConfig,
    *,
    stage: str,
    steps: int,
    lr: float,
    log: csv.writer,
    teacher: PreTrainedModel | None = None,
) -> float:
    """Train `model` on random windows of `ids`; with a `teacher`, by distillation.

    Returns:
        The wall-clock seconds the stage took.
    """
    device = torch.device(config.device)
    model.to(device).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(config.seed + (1 if teacher is None else 2))
    offsets = torch.arange(config.context)  # (T,)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.bf16)
    start, running = time.perf_counter(), []
    bar = tqdm(range(steps), desc=stage, mininterval=2.0)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, steps, lr, config.warmup_steps)
        starts = torch.randint(0, ids.numel() - config.context, (config.batch_size,), generator=generator)
        batch = ids[starts[:, None] + offsets].to(device)  # (B, T)
        with autocast:
            logits = model(batch[:, :-1]).logits.float()  # (B, T - 1, V)
            if teacher is None:
                loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            else:
                with torch.no_grad():
                    p_logits = teacher(batch[:, :-1]).logits.float()  # (B, T - 1, V)
                # KL(p || q) per position, averaged: the draft learns the target's whole distribution.
                loss = F.kl_div(logits.log_softmax(-1).flatten(0, 1), p_logits.log_softmax(-1).flatten(0, 1),
                                log_target=True, reduction="batchmean")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        running.append(loss.item())
        if (step + 1) % config.log_every == 0 or step + 1 == steps:
            mean = sum(running) / len(running)
            log.writerow([stage, step + 1, f"{mean:.4f}", f"{optimizer.param_groups[0]['lr']:.2e}",
                          (step + 1) * config.batch_size * config.context, f"{time.perf_counter() - start:.1f}"])
            bar.set_postfix(loss=f"{mean:.3f}")
            running = []
    model.eval()
    return time.perf_counter() - start


def save_half(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, folder: Path) -> None:
    """Save a float16 copy of `model` (safetensors) and the tokenizer into `folder`.

    The config declares float32, so a plain `from_pretrained(folder)` computes in float32.
    """
    folder.mkdir(parents=True, exist_ok=True)
    half = type(model)(model.config)
    half.load_state_dict(model.state_dict())
    half.to(torch.float16).save_pretrained(folder, safe_serialization=True)
    # Stored in float16, loaded in float32 by default: CPUs compute float32 faster and exactly.
    config_file = folder / "config.json"
    config_file.write_text(config_file.read_text().replace('"dtype": "float16"', '"dtype": "float32"'))
    tokenizer.save_pretrained(folder)
    # transformers 5 names the class "TokenizersBackend", which 4.x cannot load; the
    # same fast tokenizer under its older name loads in both (the package's floor is 4.56).
    tokenizer_file = folder / "tokenizer_config.json"
    tokenizer_file.write_text(tokenizer_file.read_text().replace(
        '"tokenizer_class": "TokenizersBackend"', '"tokenizer_class": "PreTrainedTokenizerFast"'))


def num_params(model: PreTrainedModel) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> dict:
    """Command line: train, save, measure and write the model card. Returns the metrics."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: the package's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-steps", type=int, default=None,
                        help=f"default {TrainConfig.target_steps} (--quick: 4)")
    parser.add_argument("--draft-steps", type=int, default=None, help=f"default {TrainConfig.draft_steps} (--quick: 4)")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: CUDA when available)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-distill", action="store_true", help="train the draft on the text instead")
    parser.add_argument("--no-bf16", action="store_true", help="train in float32")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny corpus, models and step counts")
    parser.add_argument("--eval-only", action="store_true", help="re-measure a trained folder, rewrite the card")
    parser.add_argument("--draft-only", action="store_true",
                        help="keep the folder's tokenizer and target, train a new draft (e.g. with more --draft-steps)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    steps = {"target_steps": 4, "draft_steps": 4} if args.quick else {}
    for name in ("target_steps", "draft_steps"):
        if getattr(args, name) is not None:
            steps[name] = getattr(args, name)
    config = TrainConfig(out_dir=args.out, seed=args.seed, **steps, device=device, distill=not args.no_distill,
                         bf16=not args.no_bf16, draft_only=args.draft_only)
    if args.quick:
        config = replace(config, vocab_size=384, context=64, batch_size=4,
                         warmup_steps=2, target=ModelShape(2, 64, 4, 2, 128), draft=ModelShape(1, 32, 2, 2, 64),
                         log_every=2, eval_tokens=256, num_prompts=2, new_tokens=8,
                         corpus=CorpusConfig(max_documents=120))
    if args.eval_only:
        return remeasure(config)
    return retrain_draft(config) if config.draft_only else run(config)


def remeasure(config: TrainConfig) -> dict:
    """Measure an already trained folder again and rewrite its metrics and card."""
    out = Path(config.out_dir)
    metrics = json.loads((out / "metrics.json").read_text())
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "target")
    held_out_ids = encode(tokenizer, [d.text for d in load_corpus(config.corpus).held_out])  # (N_held_out,)
    trained = metrics["config"]
    metrics.update(evaluate_tiny(out, held_out_ids, replace(config, context=trained["context"], seed=trained["seed"])))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    write_card(out, metrics)
    return metrics


def retrain_draft(config: TrainConfig) -> dict:
    """Train a new draft against the folder's trained target; measure the pair, rewrite the card.

    The tokenizer and the target are read from `out_dir` as `load_pair` reads them (the
    target's float16 weights, in float32), so the draft imitates the target that ships. The
    target's shape, steps and training time in the card stay those of the run that trained it.
    """
    config = replace(config, device=config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out = Path(config.out_dir)
    previous = json.loads((out / "metrics.json").read_text())
    trained = previous["config"]
    config = replace(config, vocab_size=trained["vocab_size"], context=trained["context"],
                     target=ModelShape(**trained["target"]), target_steps=trained["target_steps"],
                     target_lr=trained["target_lr"])
    t0 = time.perf_counter()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out / "target")
    target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
    corpus = load_corpus(config.corpus)
    train_ids = encode(tokenizer, [d.text for d in corpus.train])  # (N_train,)
    held_out_ids = encode(tokenizer, [d.text for d in corpus.held_out])  # (N_held_out,)
    # The log keeps the target's rows; the old draft's rows give way to the new draft's.
    rows = list(csv.reader((out / "training_log.csv").read_text().splitlines()))
    with open(out / "training_log.csv", "w", newline="", buffering=1) as handle:
        csv.writer(handle).writerows(row for row in rows if row and row[0] != "draft")
        draft = build_model(config.draft, tokenizer, config.context, config.seed + 1)
        draft_seconds = train_model(draft, train_ids, config, stage="draft", steps=config.draft_steps,
                                    lr=config.draft_lr, log=csv.writer(handle),
                                    teacher=target.to(config.device) if config.distill else None)
    save_half(draft.float().cpu(), tokenizer, out / "draft")
    seconds = previous["seconds"]
    metrics = {
        **previous,
        "config": json.loads(json.dumps(asdict(config), default=str)),
        "params": {"target": previous["params"]["target"], "draft": num_params(draft)},
        "seconds": {**seconds, "draft": round(draft_seconds, 1),
                    "total_training": round(seconds["total_training"] - seconds["draft"] + draft_seconds, 1)},
        "device": config.device, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "notes": [  # replaces any note about an earlier draft
            f"The draft was retrained with `--draft-only` ({config.draft_steps} steps, "
            f"{(time.perf_counter() - t0) / 60:.1f} min with data) against the target trained earlier; "
            "the target's figures are those of the run that trained it."],
    }
    metrics.update(evaluate_tiny(out, held_out_ids, config))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    write_card(out, metrics)
    return metrics


def run(config: TrainConfig) -> dict:
    """Every step of the recipe for one `TrainConfig`; returns the metrics it wrote."""
    config = replace(config, device=config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    corpus = load_corpus(config.corpus)
    tokenizer = train_tokenizer([d.text for d in corpus.train], config.vocab_size, config.context)
    train_ids = encode(tokenizer, [d.text for d in corpus.train])  # (N_train,)
    held_out_ids = encode(tokenizer, [d.text for d in corpus.held_out])  # (N_held_out,)
    data_seconds = time.perf_counter() - t0
    print(f"corpus: {len(corpus.train)} train / {len(corpus.held_out)} held-out documents, "
          f"{train_ids.numel()} / {held_out_ids.numel()} tokens ({data_seconds:.0f} s)", file=sys.stderr)

    with open(out / "training_log.csv", "w", newline="", buffering=1) as handle:  # line-buffered: tail -f
        log = csv.writer(handle)
        log.writerow(["stage", "step", "loss", "lr", "tokens", "seconds"])
        target = build_model(config.target, tokenizer, config.context, config.seed)
        target_seconds = train_model(target, train_ids, config, stage="target", steps=config.target_steps,
                                     lr=config.target_lr, log=log)
        draft = build_model(config.draft, tokenizer, config.context, config.seed + 1)
        draft_seconds = train_model(draft, train_ids, config, stage="draft", steps=config.draft_steps,
                                    lr=config.draft_lr, log=log, teacher=target if config.distill else None)
    save_half(target.float().cpu(), tokenizer, out / "target")
    save_half(draft.float().cpu(), tokenizer, out / "draft")

    metrics = {
        "config": json.loads(json.dumps(asdict(config), default=str)),
        "corpus": {"python": platform.python_version(), "train_documents": len(corpus.train),
                   "held_out_documents": len(corpus.held_out), **corpus.num_chars(),
                   "train_tokens": train_ids.numel(), "held_out_tokens": held_out_ids.numel()},
        "params": {"target": num_params(target), "draft": num_params(draft)},
        "seconds": {"data": round(data_seconds, 1), "target": round(target_seconds, 1),
                    "draft": round(draft_seconds, 1), "total_training": round(time.perf_counter() - t0, 1)},
        "device": config.device, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    metrics.update(evaluate_tiny(out, held_out_ids, config))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    write_card(out, metrics)
    print(json.dumps({k: metrics[k] for k in ("params", "seconds", "perplexity", "acceptance", "latency_ms")},
                     indent=2), file=sys.stderr)
    return metrics
