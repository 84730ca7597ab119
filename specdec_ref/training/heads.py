"""Train draft heads on the tiny target's own features: EAGLE's head, Medusa's heads.

`python -m specdec_ref.training.heads --threads 1` writes `specdec_ref/pairs/tiny/eagle-head`
(and, with `--kind medusa`, `medusa-heads`): the trained head in float16, `training.json`
(the configuration and what the run took) and `training_log.csv`. Its card is written
from measurements by `specdec_ref.training.heads_card`.

1. Features, once: the frozen target (as `load_pair("tiny")` loads it) reads windows of
   the tiny pair's training corpus (`corpus`, the same split and tokenizer) in bfloat16;
   the input of its final norm at every position (`heads.features`) is kept in float16
   with the tokens, in a file that both kinds of head reuse.
2. EAGLE (Li et al. 2024), EAGLE-1's loss: the head reads (h_t + noise, x_{t+1}) and
   predicts h^_{t+1}; SmoothL1 between norm(h^_{t+1}) and norm(h_{t+1}) (what the LM head
   reads) plus `ce_weight` times the cross-entropy of q = softmax(lm_head(norm(h^)))
   against the target's p = softmax(lm_head(norm(h_{t+1}))).
3. Medusa (Cai et al. 2024): head k reads h_t and is trained on the cross-entropy of its
   q against the target's p at position t + k (the target's own distribution of x_{t+k+1},
   self-distillation), weighted 0.8^(k - 1).

Invariant: the same seed, corpus and hardware give the same windows, batches and
weights. A run that stops early (`--max-minutes`) saves what it has; every checkpoint
is a usable head, and `training.json` says how many steps it took.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from ..heads.eagle import EagleHead
from ..heads.features import TargetParts, decoder_of
from .config import DEFAULT_OUT
from .corpus import CorpusConfig, load_corpus
from .train import _lr_at, encode


@dataclass(frozen=True)
class HeadTrainConfig:
    """Everything that determines a trained head."""

    kind: str = "eagle"  # "eagle" or "medusa"
    target_dir: Path = DEFAULT_OUT / "target"  # the frozen target (and its tokenizer)
    out_dir: Path | None = None  # None: pairs/tiny/eagle-head or pairs/tiny/medusa-heads
    features_file: Path = Path("/tmp/specdec-heads/features.pt")  # the features, computed once
    seed: int = 0  # seeds the windows, the head's initialisation and the batches
    context: int = 512  # tokens per window
    windows: int = 2400  # training windows of features (windows * context tokens)
    held_out_windows: int = 16  # held-out windows for the validation top-1
    batch_size: int = 8  # windows per step
    steps: int = 1500  # optimizer steps (the learning-rate schedule's length)
    lr: float = 2e-3  # peak learning rate (linear warm-up, cosine decay to 10%)
    warmup_steps: int = 50
    weight_decay: float = 0.0
    clip: float = 0.5  # gradient-norm clip (EAGLE's)
    noise: float = 0.1  # uniform noise on input features, as a share of their RMS (EAGLE)
    ce_weight: float = 0.1  # EAGLE: weight of the cross-entropy beside the regression
    medusa_heads: int = 4  # Medusa: heads (drafts per round)
    log_every: int = 10  # steps between rows of training_log.csv
    checkpoint_every: int = 100  # steps between saved heads
    max_minutes: float | None = None  # stop (and save) after this much training time
    stop_at: int | None = None  # stop (and save) after this many steps; the schedule still spans `steps`
    corpus: CorpusConfig = CorpusConfig()

    def folder(self) -> Path:
        """Where the trained head goes."""
        name = "eagle-head" if self.kind == "eagle" else "medusa-heads"
        return Path(self.out_dir) if self.out_dir is not None else DEFAULT_OUT / name


def windows_of(ids: torch.Tensor, context: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """`count` distinct non-overlapping windows of `ids` (N,), drawn at random: (count, T)."""
    total = ids.numel() // context
    chosen = torch.randperm(total, generator=generator)[:count].sort().values  # (count,)
    return ids[: total * context].view(total, context)[chosen]  # (count, T)


@torch.no_grad()
def extract_features(target, windows: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """The target's features (the input of its final norm) over each window: (W, T, H) float16."""
    parts = TargetParts.of(target)
    captured = {}
    hook = parts.norm.register_forward_hook(lambda module, inputs, output: captured.__setitem__("h", inputs[0]))
    out = torch.empty(*windows.shape, target.config.hidden_size, dtype=torch.float16)  # (W, T, H)
    try:
        for start in range(0, len(windows), batch_size):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                decoder_of(target)(windows[start : start + batch_size])
            out[start : start + batch_size] = captured["h"].to(torch.float16)
    finally:
        hook.remove()
    return out


def load_features(config: HeadTrainConfig, target, tokenizer) -> dict:
    """Training and held-out windows and their features, from the file or computed (and saved)."""
    meta = {"seed": config.seed, "context": config.context, "windows": config.windows,
            "held_out_windows": config.held_out_windows, "corpus": asdict(config.corpus)}
    path = Path(config.features_file)
    if path.is_file():
        stored = torch.load(path)
        if stored["meta"] == meta:
            return stored
    start = time.perf_counter()
    corpus = load_corpus(config.corpus)
    generator = torch.Generator().manual_seed(config.seed)
    train_ids = encode(tokenizer, [d.text for d in corpus.train])  # (N_train,)
    held_ids = encode(tokenizer, [d.text for d in corpus.held_out])  # (N_held_out,)
    train = windows_of(train_ids, config.context, config.windows, generator)  # (W, T)
    held = windows_of(held_ids, config.context, config.held_out_windows, generator)  # (W', T)
    stored = {"meta": meta, "train_ids": train, "held_ids": held,
              "train": extract_features(target, train), "held": extract_features(target, held),
              "train_tokens_total": train_ids.numel()}
    stored["seconds"] = round(time.perf_counter() - start, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(stored, path)
    return stored


def soft_ce(q_logits: torch.Tensor, p_logits: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of q against the target's p, both given as logits (..., V)."""
    return -(p_logits.float().softmax(-1) * q_logits.float().log_softmax(-1)).sum(-1).mean()


def eagle_loss(head, parts: TargetParts, ids: torch.Tensor, feats: torch.Tensor, config: HeadTrainConfig,
               generator: torch.Generator | None) -> dict:
    """EAGLE-1's loss on windows ids (B, T) with features (B, T, H); also its top-1 agreement."""
    h = feats.float()  # (B, T, H)
    inputs = h[:, :-1]  # h_t, (B, T - 1, H)
    if generator is not None and config.noise:
        rms = inputs.pow(2).mean(-1, keepdim=True).sqrt()  # (B, T - 1, 1)
        uniform = torch.rand(inputs.shape, generator=generator) * 2 - 1  # U(-1, 1)
        inputs = inputs + uniform * config.noise * rms
    positions = torch.arange(ids.size(1) - 1)[None].expand(ids.size(0), -1)  # (B, T - 1)
    predicted = head(parts.embed(ids[:, 1:]), inputs, positions)  # h^_{t+1}, (B, T - 1, H)
    normed, real = parts.norm(predicted), parts.norm(h[:, 1:])  # (B, T - 1, H)
    with torch.no_grad():
        p_logits = parts.lm_head(real)  # (B, T - 1, V)
    q_logits = parts.lm_head(normed)  # (B, T - 1, V)
    regression = F.smooth_l1_loss(normed.float(), real.float())
    ce = soft_ce(q_logits, p_logits)
    top1 = (q_logits.argmax(-1) == p_logits.argmax(-1)).float().mean()
    return {"loss": regression + config.ce_weight * ce, "regression": regression, "ce": ce, "top1": top1}


def medusa_loss(heads, parts: TargetParts, ids: torch.Tensor, feats: torch.Tensor, config: HeadTrainConfig,
                generator: torch.Generator | None) -> dict:
    """Medusa's loss: head k at t against the target's p at t + k, weighted 0.8^(k-1)."""
    h = feats.float()  # (B, T, H)
    K = len(heads.blocks)
    with torch.no_grad():
        p_logits = parts.logits(h)  # p for x_{t+1} at every t, (B, T, V)
    total, top1 = 0.0, []
    for k in range(1, K + 1):
        q_logits = heads.logits(h[:, :-k], parts, k - 1)  # (B, T - k, V)
        target = p_logits[:, k:]  # (B, T - k, V)
        total = total + 0.8 ** (k - 1) * soft_ce(q_logits, target)
        top1.append((q_logits.argmax(-1) == target.argmax(-1)).float().mean())
    return {"loss": total, "top1": top1[0], **{f"top1_head{k + 1}": t for k, t in enumerate(top1)}}


def build_head(config: HeadTrainConfig, target):
    """A freshly initialised head of `config.kind` for `target`."""
    torch.manual_seed(config.seed)
    if config.kind == "eagle":
        return EagleHead.for_target(target)
    from ..heads.medusa import MedusaHeads

    return MedusaHeads.for_target(target, config.medusa_heads)


def train_head(config: HeadTrainConfig) -> dict:
    """Features, then the head's training loop; saves checkpoints and returns the run's facts."""
    if config.kind not in ("eagle", "medusa"):
        raise ValueError(f"kind must be 'eagle' or 'medusa', got {config.kind!r}")
    t0 = time.perf_counter()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(config.target_dir)
    target = AutoModelForCausalLM.from_pretrained(config.target_dir, dtype=torch.float32).eval()
    target.requires_grad_(False)
    data = load_features(config, target, tokenizer)
    feature_seconds = time.perf_counter() - t0
    print(f"features: {tuple(data['train'].shape)} train, {tuple(data['held'].shape)} held out "
          f"({feature_seconds:.0f} s)", file=sys.stderr, flush=True)
    parts = TargetParts.of(target)
    head = build_head(config, target).train()
    loss_fn = eagle_loss if config.kind == "eagle" else medusa_loss
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, betas=(0.9, 0.95),
                                  weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(config.seed + 1)
    out = config.folder()
    out.mkdir(parents=True, exist_ok=True)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    start, running, step = time.perf_counter(), [], 0
    facts = {"config": json.loads(json.dumps(asdict(config), default=str)),
             "feature_tokens": int(data["train_ids"].numel()),
             # The extraction's time, as measured when the features file was written.
             "feature_seconds": data["seconds"], "corpus_train_tokens": int(data["train_tokens_total"]),
             "params": sum(p.numel() for p in head.parameters()), "torch_threads": torch.get_num_threads(),
             "torch": torch.__version__}

    def checkpoint(done: int, held: dict | None) -> None:
        seconds = time.perf_counter() - start
        head.eval()
        extra = {**facts, "steps_done": done, "tokens_seen": done * config.batch_size * config.context,
                 "train_seconds": round(seconds, 1), "held_out": held}
        head.save(out, extra)
        (out / "training.json").write_text(json.dumps(extra, indent=2) + "\n")
        head.train()

    with open(out / "training_log.csv", "w", newline="", buffering=1) as handle:
        log = csv.writer(handle)
        log.writerow(["step", "loss", "top1", "held_out_top1", "lr", "tokens", "seconds"])
        held = None
        for step in range(1, config.steps + 1):
            for group in optimizer.param_groups:
                group["lr"] = _lr_at(step - 1, config.steps, config.lr, config.warmup_steps)
            index = torch.randint(0, len(data["train"]), (config.batch_size,), generator=generator)
            with autocast:
                result = loss_fn(head, parts, data["train_ids"][index], data["train"][index], config, generator)
            result["loss"].backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), config.clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            running.append((result["loss"].item(), result["top1"].item()))
            elapsed = time.perf_counter() - start
            out_of_time = (config.max_minutes is not None and elapsed > 60 * config.max_minutes) \
                or step == config.stop_at
            held_row = ""
            if step % config.checkpoint_every == 0 or step == config.steps or out_of_time:
                held = held_out_metrics(head, parts, data, config, loss_fn)
                held_row = f"{held['top1']:.4f}"
                checkpoint(step, held)
            if step % config.log_every == 0 or held_row:
                loss, top1 = (sum(column) / len(running) for column in zip(*running, strict=True))
                log.writerow([step, f"{loss:.4f}", f"{top1:.4f}", held_row,
                              f"{optimizer.param_groups[0]['lr']:.2e}",
                              step * config.batch_size * config.context, f"{elapsed:.1f}"])
                print(f"step {step}: loss {loss:.4f} top1 {top1:.3f} held {held_row} {elapsed:.0f} s",
                      file=sys.stderr, flush=True)
                running = []
            if out_of_time:
                break
    return json.loads((out / "training.json").read_text())


@torch.no_grad()
def held_out_metrics(head, parts: TargetParts, data: dict, config: HeadTrainConfig, loss_fn) -> dict:
    """The loss terms and top-1 agreement on the held-out windows (no noise)."""
    head.eval()
    totals: dict[str, float] = {}
    count = len(data["held"])
    for start in range(0, count, config.batch_size):
        rows = slice(start, start + config.batch_size)
        ids, feats = data["held_ids"][rows], data["held"][rows]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            result = loss_fn(head, parts, ids, feats, config, None)
        for name, value in result.items():
            totals[name] = totals.get(name, 0.0) + float(value) * len(ids) / count
    head.train()
    return {name: round(value, 4) for name, value in totals.items()}


def main(argv: list[str] | None = None) -> dict:
    """Command line: train one head and save it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("eagle", "medusa"), default="eagle")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: in pairs/tiny)")
    parser.add_argument("--features", type=Path, default=HeadTrainConfig.features_file,
                        help="where the features are kept (computed once, reused)")
    parser.add_argument("--steps", type=int, default=HeadTrainConfig.steps)
    parser.add_argument("--windows", type=int, default=HeadTrainConfig.windows)
    parser.add_argument("--max-minutes", type=float, default=None, help="stop and save after this long")
    parser.add_argument("--stop-at", type=int, default=None,
                        help="stop and save after this many steps (reproduces a run cut by --max-minutes)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few windows and steps")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    config = HeadTrainConfig(kind=args.kind, out_dir=args.out, features_file=args.features, steps=args.steps,
                             windows=args.windows, max_minutes=args.max_minutes, stop_at=args.stop_at)
    if args.quick:
        config = replace(config, windows=8, held_out_windows=2, steps=4, batch_size=2, log_every=1,
                         checkpoint_every=2, corpus=CorpusConfig(max_documents=120))
    facts = train_head(config)
    print(json.dumps({k: facts[k] for k in ("steps_done", "tokens_seen", "train_seconds", "held_out")}),
          file=sys.stderr)
    return facts


if __name__ == "__main__":
    main()
