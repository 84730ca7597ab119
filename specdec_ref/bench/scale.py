"""How the gain grows with the target: c and v(K) for random-init targets of growing size.

Speculative decoding pays K draft steps and one target pass over K + 1 tokens per
iteration; the performance model (`analysis.expected_speedup`) needs only two measured
costs for that: c = tau_q / tau_p and v(K) = tau_p(K + 1) / tau_p. Both depend on the
target's size. Here one draft model (a real pair's) is timed against Llama-style
targets of growing width and depth, random-init (the time of a pass does not depend
on the weights' values), with `measure.measure_pass_latency`: the cached pass the
decoder runs, medians of interleaved repetitions.

`python -m specdec_ref.bench.scale` writes the sweep as JSON; the performance chapter
draws it, and combines it with a measured alpha into a predicted speedup per size.
With `--linear packed` every model runs with oneDNN-prepacked linear layers
(`packed.pack_linear_layers`), as the CPU benchmark runs them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from ..analysis import verify_cost_from_latency
from ..fast.packed import pack_linear_layers
from ..measure import measure_pass_latency
from ..validation import vocab_size

# (layers, width) of the targets: on a CPU small ones (a quick run takes seconds); on a
# GPU the shapes of GPT-2 small, medium, large and XL. The full sweeps add larger ones.
QUICK_SHAPES = {"cpu": ((8, 512), (12, 768)), "cuda": ((12, 768), (24, 1024), (36, 1280), (48, 1600))}
# The full GPU sweep ends at the shape of a 7B Llama (32 x 4096), bf16 13 GB.
FULL_SHAPES = {"cpu": ((8, 512), (12, 768), (16, 1024), (24, 1024)),
               "cuda": ((12, 768), (24, 1024), (36, 1280), (48, 1600), (32, 4096))}


@dataclass(frozen=True)
class SizePoint:
    """The measured costs of one target against the draft."""

    name: str  # e.g. "12 x 768" or the pair's own target
    parameters: int  # the target's parameter count
    target_step_s: float  # tau_p: median time of a 1-token cached target pass
    draft_step_s: float  # tau_q: median time of a 1-token cached draft pass
    verify_cost: dict[int, float]  # v(K) = tau_p(K + 1) / tau_p for K = 0..max_k

    @property
    def cost_ratio(self) -> float:
        """c = tau_q / tau_p."""
        return self.draft_step_s / self.target_step_s


def sized_target(layers: int, width: int, *, vocab: int, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> PreTrainedModel:
    """A random-init Llama-style target: `layers` x `width`, 64-dim heads, SwiGLU of 8/3 width.

    The weights are created on `device` directly (no copy of a large model through the CPU).
    """
    if width % 64 or layers < 1:
        raise ValueError(f"width must be a multiple of 64 and layers >= 1, got {width!r} and {layers!r}")
    config = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=64 * round(8 * width / 3 / 64),
                         num_hidden_layers=layers, num_attention_heads=width // 64, num_key_value_heads=width // 64,
                         max_position_embeddings=2048, bos_token_id=0, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype=dtype).eval()


def measure_size(draft_model: PreTrainedModel, target_model: PreTrainedModel, *, name: str, context: int = 64,
                 max_k: int = 8, repeats: int = 5, draft_step_s: float | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> SizePoint:
    """Time the target's passes over 1..max_k + 1 new tokens, and the draft's 1-token pass.

    Args:
        draft_model, target_model: on the same device, in the dtype to measure.
        name: how the point is labelled.
        context: tokens in both caches before each timed pass.
        max_k: v(K) is measured for K = 0..max_k.
        repeats: timed passes of each size (medians are kept).
        draft_step_s: tau_q when already measured (the draft is the same for every size).
        clock: passed to `measure_pass_latency` (wall time by default; `bench.costs`
            passes `time.thread_time` at one thread).
    """
    curve = measure_pass_latency(target_model, context=context, num_tokens=tuple(range(1, max_k + 2)),
                                 repeats=repeats, warmup=1, clock=clock)
    if draft_step_s is None:
        draft_curve = measure_pass_latency(draft_model, context=context, num_tokens=(1,), repeats=3 * repeats,
                                           clock=clock)
        draft_step_s = draft_curve.median_s[0]
    parameters = sum(p.numel() for p in target_model.parameters())
    return SizePoint(name, parameters, curve.median_s[0], draft_step_s,
                     verify_cost_from_latency(curve.num_tokens, curve.median_s))


def size_sweep(draft_model: PreTrainedModel, shapes: Sequence[tuple[int, int]], *,
               targets: Mapping[str, PreTrainedModel] | None = None, context: int = 64, max_k: int = 8,
               repeats: int = 5, packed: bool = False) -> list[SizePoint]:
    """`measure_size` for existing `targets` (e.g. the pair's own) and one random target per shape.

    The random targets share the draft's vocabulary, device and dtype; each is freed
    before the next is built. The draft is timed again right after each target, so
    that c divides two timings taken back to back (a shared machine's load drifts).
    packed: prepack each random target's linear layers (the draft and `targets` are
    timed as given).
    """
    device, dtype = draft_model.device, next(draft_model.parameters()).dtype
    points = [measure_size(draft_model, model, name=name, context=context, max_k=max_k, repeats=repeats)
              for name, model in (targets or {}).items()]
    for layers, width in shapes:
        model = sized_target(layers, width, vocab=vocab_size(draft_model), device=device, dtype=dtype)
        if packed:
            pack_linear_layers(model)
        points.append(measure_size(draft_model, model, name=f"{layers} x {width}", context=context, max_k=max_k,
                                   repeats=repeats))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return points


def sweep_report(points: Sequence[SizePoint], *, device: torch.device, dtype: torch.dtype, context: int) -> dict:
    """The sweep as plain data (what `main` writes as JSON)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {"meta": {"device": device.type, "device_name": name, "dtype": str(dtype).removeprefix("torch."),
                     "threads": torch.get_num_threads(), "context": context, "torch": torch.__version__,
                     "date": datetime.datetime.now().astimezone().isoformat()},
            "points": [asdict(point) for point in points]}


def load_sweep(path: str | Path) -> tuple[dict, list[SizePoint]]:
    """Read a sweep written by `main`: (meta, points)."""
    data = json.loads(Path(path).read_text())
    points = [SizePoint(**{**p, "verify_cost": {int(k): v for k, v in p["verify_cost"].items()}})
              for p in data["points"]]
    return data["meta"], points


def _shapes(text: str) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((int(a), int(b)) for a, b in (part.split("x") for part in text.split(",") if part.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected shapes like 8x512,12x768, got {text!r}") from None


def main(argv: list[str] | None = None) -> dict:
    """Sweep the target size against a pair's draft and write the JSON report."""
    parser = argparse.ArgumentParser(prog="python -m specdec_ref.bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="tiny", help="the pair whose draft (and target) are timed")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: load_pair's choice")
    parser.add_argument("--device", help="default: cuda when available, else cpu")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--full", action="store_true", help="the larger set of shapes")
    parser.add_argument("--shapes", type=_shapes, help="LxW,... e.g. 8x512,12x768 (default: by device)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--linear", choices=["plain", "packed"], default="plain",
                        help="packed: every model with oneDNN-prepacked linear layers (a CPU)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from ..models import load_pair

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    draft_model, target_model, _ = load_pair(args.pair, device=args.device,
                                             dtype=getattr(torch, args.dtype) if args.dtype else None)
    device = draft_model.device
    shapes = args.shapes or (FULL_SHAPES if args.full else QUICK_SHAPES)["cuda" if device.type == "cuda" else "cpu"]
    if args.linear == "packed":
        for model in (draft_model, target_model):
            pack_linear_layers(model)  # raises, naming why, where it cannot
    with torch.no_grad():
        points = size_sweep(draft_model.eval(), shapes, targets={f"the {args.pair} target": target_model.eval()},
                            repeats=args.repeats, packed=args.linear == "packed")
    report = sweep_report(points, device=device, dtype=next(draft_model.parameters()).dtype, context=64)
    report["meta"]["linear"] = args.linear
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for point in points:
        print(f"{point.name:>20}: {point.parameters / 1e6:8.1f}M parameters, tau_p {point.target_step_s * 1e3:6.2f} "
              f"ms, c {point.cost_ratio:.3f}, v(4) {point.verify_cost[4]:.2f}")
    return report


if __name__ == "__main__":
    main()
