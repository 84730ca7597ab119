"""What defines one benchmark run (`BenchConfig`, from the command line: `parse_args`),
and what `run.build` makes of it (`BenchSetup`): the pair as every arm runs it, the
prompts, the measured costs, the arms.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..fast.batch_invariant import GROUPED, ROWWISE
from ..validation import check_integer
from .arms import Arm, ArmRunner, build_arms
from .pair import RANDOM_SHAPES, BenchPair, RandomPairShape
from .trees import DEFAULT_TREES, parse_trees, tree_label

DESCRIPTION = "`python -m specdec_ref.bench`: a fair benchmark of speculative decoding against `transformers`."
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ATTENTIONS = ("sdpa", "eager", ROWWISE, GROUPED)  # both models' attention implementation (None: as loaded)
LINEAR_KINDS = ("auto", "packed", "plain")  # `packed`: every arm's models run `packed.PackedLinear` layers


@dataclass
class BenchConfig:
    """Everything that defines one benchmark run."""

    pair: str = "tiny"  # "tiny", "random", or another name `models.load_pair` knows
    max_new_tokens: int = 128  # tokens generated per prompt by every arm
    repeats: int = 5  # timed repetitions over all prompts
    k_values: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)  # fixed K of the cached and assisted arms
    modes: tuple[str, ...] = ("greedy", "t1.0", "t0.7")  # keys of arms.MODES
    num_prompts: int = 8  # prompts in the fixed set
    prompt_tokens: int = 32  # tokens per prompt (random pairs: between half and this)
    nocache_k: int = 4  # K of the specdec_ref arm without a KV cache
    device: str | None = None  # None: cuda when available, else cpu
    dtype: str = "float32"  # a key of DTYPES
    threads: int | None = None  # torch intra-op threads (None: torch's default)
    seed: int = 0  # seeds prompts and sampling
    cost_repeats: int = 20  # timings per measured pass cost
    shape: RandomPairShape = field(default_factory=RandomPairShape)  # shapes of a random pair
    progress: bool = True  # show a progress bar
    lean: bool = True  # add arms whose draft runs through `lean.LeanForward` (Llama-style drafts only)
    linear: str = "auto"  # a key of LINEAR_KINDS; auto: packed where `packed.packing_unsupported` allows
    attention: str | None = None  # one of ATTENTIONS for both models (None: as loaded, sdpa)
    fast: bool | None = None  # fast-path arms (`bench.fast`); None: on a GPU, where the pair allows
    compiled: bool | None = None  # a torch.compile'd `generate` baseline; None: on a GPU
    fast_k_values: tuple[int, ...] | None = None  # fixed K of the fast arms (None: k_values)
    trees: tuple = ()  # tree shapes (`bench.trees`): a tree arm each, next to the chain arms

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "repeats", "num_prompts", "prompt_tokens", "nocache_k", "cost_repeats"):
            value = getattr(self, name)
            check_integer(name, value, minimum=1)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be None or >= 1, got {self.threads!r}")
        if self.linear not in LINEAR_KINDS:
            raise ValueError(f"linear must be one of {LINEAR_KINDS}, got {self.linear!r}")
        if self.attention is not None and self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be None or one of {ATTENTIONS}, got {self.attention!r}")
        build_arms(list(self.modes), list(self.k_values), nocache_k=self.nocache_k)  # raises on bad modes / K



@dataclass
class BenchSetup:
    """What `build` made for one run: the pair, prompts, costs and arms."""

    pair: BenchPair  # both models, as every arm runs them
    device: torch.device  # where they run
    prepared: list[str]  # what `fast.prepare` would choose for the pair as loaded
    linear: str  # "packed" or "plain": what `_pack` did
    variants: tuple[str, ...]  # the baseline variants run (keys of arms.VARIANTS)
    prompts: list[torch.Tensor]  # the fixed prompt set, each (1, n)
    prompt_source: str  # where the prompts came from
    costs: object  # the measured c and v(K) (`pair.measure_costs`)
    fast: bool  # whether the fast-path arms run
    fast_costs: object | None  # their measured costs (`bench.fast`)
    fast_k: list[int]  # fixed K of the fast arms
    compile_error: str | None  # why a torch.compile'd baseline could not run
    arms: list[Arm]  # every arm, in a fixed order (`run_arms` drops an assisted arm that crashed)
    runner: ArmRunner  # runs one arm on one prompt
    # transformers' assisted arms that crashed: {"arm", "mode", "called", "transformers", "error"}
    peer_crashes: list[dict] = field(default_factory=list)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _trees(text: str) -> tuple:
    try:
        return parse_trees(text)
    except ValueError as error:
        raise SystemExit(f"--trees: {error}") from None


def parse_args(argv: list[str] | None = None) -> tuple[BenchConfig, Path | None]:
    """The command line as a `BenchConfig` and the output path (None: the default)."""
    parser = argparse.ArgumentParser(prog="python -m specdec_ref.bench", description=DESCRIPTION)
    parser.add_argument("--pair", default="tiny", help="tiny (default), random, gpt2-shapes (random GPT-2 -> "
                        "GPT-2 XL shapes; gpt2-shapes-small for a dry run), or a registry name")
    parser.add_argument("--max-new-tokens", type=int, help="tokens per prompt (default 128; --quick 24)")
    parser.add_argument("--repeats", type=int, help="timed repetitions (default 5; --quick 1)")
    parser.add_argument("--k-values", type=_int_list, help="fixed K values, e.g. 1,2,4 (default 1..8; --quick 2,4)")
    parser.add_argument("--modes", default="greedy,t1.0,t0.7", help="comma-separated subset of greedy,t1.0,t0.7")
    parser.add_argument("--num-prompts", type=int, help="prompts in the set (default 8; --quick 2)")
    parser.add_argument("--prompt-tokens", type=int, help="tokens per prompt (default 32; --quick 16)")
    parser.add_argument("--out", type=Path, help="JSON report path (default bench-results/bench-<pair>.json)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--linear", default="auto", choices=LINEAR_KINDS,
                        help="packed: oneDNN-prepacked linear layers in both models, every arm "
                             "(default auto: packed on a CPU that supports it)")
    parser.add_argument("--attention", choices=ATTENTIONS,
                        help=f"both models' attention implementation (default: as loaded, sdpa); {ROWWISE} "
                             f"and {GROUPED} (`specdec_ref.fast.batch_invariant`) keep each row of a K + 1-token pass "
                             "bitwise equal to a one-token step's, so greedy stays exact in bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a short run: few prompts, tokens and K values")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-lean", action="store_true", help="leave out the lean-draft arms")
    parser.add_argument("--fast", action=argparse.BooleanOptionalAction, default=None,
                        help="arms on the fast path (static cache, CUDA graphs; default: on a GPU)")
    parser.add_argument("--fast-k-values", type=_int_list, help="fixed K values of the fast arms (default: --k-values)")
    parser.add_argument("--trees", nargs="?", const="default", default=None,
                        help="tree arms (`specdec_ref.trees.tree`): shapes 'w1,w2,...' (children per node and "
                             "level) or "
                             "'cn1,n2,.../top' (nodes per level by the draft's confidence), ';'-separated "
                             "(no value: " + "; ".join(tree_label(t) for t in DEFAULT_TREES) + ")")
    parser.add_argument("--random-shape", default="tiny", choices=sorted(RANDOM_SHAPES),
                        help="shapes of a random pair (default: the tiny pair's); --random-* below override them")
    parser.add_argument("--random-target-layers", type=int)
    parser.add_argument("--random-draft-layers", type=int)
    parser.add_argument("--random-width", type=int)
    parser.add_argument("--random-vocab", type=int)
    args = parser.parse_args(argv)
    quick = args.quick
    overrides = {name: getattr(args, f"random_{name}") for name in ("target_layers", "draft_layers", "width", "vocab")}
    shape = replace(RANDOM_SHAPES[args.random_shape],
                    **{name: value for name, value in overrides.items() if value is not None})

    def pick(value, full, short):
        return value if value is not None else (short if quick else full)

    config = BenchConfig(
        pair=args.pair, max_new_tokens=pick(args.max_new_tokens, 128, 24), repeats=pick(args.repeats, 5, 1),
        k_values=pick(args.k_values, BenchConfig.k_values, (2, 4)),
        modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
        num_prompts=pick(args.num_prompts, 8, 2), prompt_tokens=pick(args.prompt_tokens, 32, 16),
        device=args.device, dtype=args.dtype, threads=args.threads, seed=args.seed, linear=args.linear,
        attention=args.attention,
        cost_repeats=5 if quick else 20, progress=not args.no_progress, lean=not args.no_lean, fast=args.fast,
        fast_k_values=args.fast_k_values,
        shape=shape,
        trees=() if args.trees is None else DEFAULT_TREES if args.trees == "default" else _trees(args.trees),
    )
    return config, args.out
