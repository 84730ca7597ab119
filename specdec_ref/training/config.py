"""What determines the trained tiny pair: the two model shapes and the training recipe.

`train` trains from a `TrainConfig`, `evaluate` measures what it trained; both read
this one definition, so the card always states the configuration that was run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .corpus import CorpusConfig

# The embedded pair's folder inside the package: specdec_ref/pairs/tiny.
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "pairs" / "tiny"


@dataclass(frozen=True)
class ModelShape:
    """The size of one Llama-style model."""

    layers: int  # transformer blocks
    width: int  # hidden size
    heads: int  # attention heads (head size = width / heads)
    kv_heads: int  # key/value heads (grouped-query attention when < heads)
    ffn: int  # SwiGLU intermediate size


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines the trained pair."""

    out_dir: Path = DEFAULT_OUT  # gets target/, draft/, metrics.json, training_log.csv, README.md
    seed: int = 0  # seeds model initialisation and the batch sampler
    vocab_size: int = 4096  # byte-level BPE vocabulary, shared by both models
    context: int = 512  # training window and max_position_embeddings
    batch_size: int = 8  # windows per step (batch_size * context tokens)
    target: ModelShape = ModelShape(layers=7, width=384, heads=6, kv_heads=2, ffn=1024)
    draft: ModelShape = ModelShape(layers=1, width=256, heads=4, kv_heads=4, ffn=768)
    target_steps: int = 1600  # optimizer steps for the target
    draft_steps: int = 1800  # optimizer steps for the draft
    target_lr: float = 1.5e-3  # peak learning rate (linear warm-up, cosine decay to 10%)
    draft_lr: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1  # on matrices only
    distill: bool = True  # draft trained on the target's soft labels (False: on the text)
    draft_only: bool = False  # keep out_dir's tokenizer and trained target; train (and measure) a new draft
    bf16: bool = True  # bfloat16 autocast for training (evaluation is float32)
    device: str | None = None  # None: CUDA when available, else CPU
    log_every: int = 10  # steps between rows of training_log.csv
    eval_tokens: int = 65_536  # held-out tokens for perplexity
    num_prompts: int = 32  # held-out prompts for the acceptance rates
    new_tokens: int = 64  # tokens generated per prompt
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
