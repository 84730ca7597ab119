"""Draft / target pairs by name: the embedded tiny pair, and real pairs from the hub.

`load_pair(name)` returns a `ModelPair` (draft_model, target_model, tokenizer): a
named tuple, so `pair.target_model` says which is which, while the decoders take
`(target_model, draft_model, ...)`. The pair is ready for `speculative_generate`:

* "tiny": the pair that ships inside this package (`pairs/tiny`, trained by
  `python -m specdec_ref.training`); loads offline, runs on a CPU;
* "gpt2": gpt2 -> gpt2-xl, the pair of the article;
* "qwen2.5": Qwen/Qwen2.5-0.5B -> Qwen/Qwen2.5-7B, and "qwen2.5-1.5b" (-> 1.5B, fits a
  free Colab GPU). These models pad their embedding matrices to different sizes (151936
  rows for 0.5B and 1.5B, 152064 for 7B) around one tokenizer of 151665 tokens;
* two pairs whose draft has a tokenizer of its own (chapter 9), returned as a
  `CrossPair` with both tokenizers: "tiny-cross" (the embedded draft with its own
  vocabulary, `pairs/tiny/own-vocab-draft`, -> the tiny target) and "pythia-gpt2"
  (EleutherAI/pythia-160m, GPT-NeoX's tokenizer, -> gpt2-xl; fits a free Colab GPU).

Invariant: the two returned models have output embeddings of the same size N, and
every id in [0, N) is a token of the tokenizer; so p and q are distributions over the
same real token ids, and no id that maps to no text can ever be emitted.

Padding rows. A checkpoint may have more embedding rows than its tokenizer has tokens
(Qwen2.5: 151936 or 152064 rows for 151665 tokens). No text maps to the extra rows,
but their logits are finite, so a softmax over all rows gives them mass (uncut, the
271 padding ids of Qwen2.5-0.5B could be sampled). `align_vocabularies` cuts both
models to N = the tokenizer's size (without a tokenizer: the rows the two share,
N = min(V_draft, V_target)), in place; the logits of the kept ids are unchanged. Each
model therefore samples its own softmax renormalised over the real token ids,
which is its distribution conditioned on emitting a real token: with logits z and
temperature T,

    p(x) = exp(z_x / T) / sum_{y < N} exp(z_y / T)  for x < N,  0 for padding ids,

and top-k / top-p then act on this distribution; greedy decoding takes the argmax
over real ids. Speculative decoding is exact with respect to this p: its output is
distributed as the restricted target's, i.e. as `target_model.generate` samples
after `load_pair` (which uses the restricted head too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .validation import model_device, vocab_size

TINY_DIR = Path(__file__).resolve().parent / "pairs" / "tiny"


@dataclass(frozen=True)
class PairSpec:
    """Where the two models of a named pair come from."""

    draft: str  # hub id, or a folder name under pairs/ for embedded pairs
    target: str  # hub id, or a folder name under pairs/ for embedded pairs
    embedded: bool = False  # True: folders inside this package, no network needed
    note: str = ""  # one line for listings
    cross: bool = False  # True: the draft has a tokenizer of its own (a `CrossPair`)


PAIRS: dict[str, PairSpec] = {
    "tiny": PairSpec("draft", "target", embedded=True, note="embedded, offline, CPU (see pairs/tiny/README.md)"),
    "gpt2": PairSpec("gpt2", "gpt2-xl", note="the article's pair: 124M -> 1.5B"),
    "qwen2.5": PairSpec("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-7B", note="vocabularies 151936 vs 152064"),
    "qwen2.5-1.5b": PairSpec("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B", note="fits a 16 GB GPU in float16"),
    "tiny-cross": PairSpec("own-vocab-draft", "target", embedded=True, cross=True,
                           note="embedded; the draft has its own tokenizer (pairs/tiny/own-vocab-draft)"),
    "pythia-gpt2": PairSpec("EleutherAI/pythia-160m", "gpt2-xl", cross=True,
                            note="GPT-NeoX's tokenizer -> GPT-2's: 162M -> 1.5B, fits a 16 GB GPU"),
}


class ModelPair(NamedTuple):
    """A loaded pair. It unpacks in this order, `draft_model, target_model, tokenizer =
    load_pair(...)`; name the fields (`pair.target_model`) where the order could mislead."""

    draft_model: PreTrainedModel  # the small model that proposes tokens
    target_model: PreTrainedModel  # the large model whose distribution the output follows
    tokenizer: PreTrainedTokenizerBase  # shared by both


class CrossPair(NamedTuple):
    """A loaded pair whose draft has a tokenizer of its own (chapter 9): it unpacks as
    `draft_model, target_model, tokenizer, draft_tokenizer = load_pair(...)`."""

    draft_model: PreTrainedModel  # the small model that proposes (in its own tokens)
    target_model: PreTrainedModel  # the large model whose distribution the output follows
    tokenizer: PreTrainedTokenizerBase  # the target's: the output's tokens
    draft_tokenizer: PreTrainedTokenizerBase  # the draft's own


class PairUnavailableError(OSError):
    """A hub pair could not be loaded (no network, no cached copy)."""


def _default_device(device: str | torch.device | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _default_dtype(dtype: torch.dtype | None, device: torch.device, embedded: bool) -> torch.dtype:
    """float32 on CPUs and for the tiny pair (exact comparisons); half precision on GPUs.

    bfloat16 only where the GPU computes it natively (Ampere and newer): a T4 reports
    bf16 "supported" through emulation, which is slow, so it gets float16.
    """
    if dtype is not None:
        return dtype
    if embedded or device.type == "cpu":
        return torch.float32
    if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.bfloat16
    return torch.float16


@torch.no_grad()
def restrict_vocabulary(model: PreTrainedModel, size: int) -> PreTrainedModel:
    """Keep only the first `size` rows of the model's input and output embeddings.

    Works in place on the existing parameters (tied embeddings stay tied, and the hooks
    `accelerate` puts on a model spread over several devices stay attached). The logits
    of ids below `size` are unchanged; the ids above disappear from the softmax, which
    is renormalised over the ids kept.

    Raises:
        ValueError: if `size` is not in [1, current vocabulary size].
    """
    current = vocab_size(model)
    if not 1 <= size <= current:
        raise ValueError(f"size must be in [1, {current}] (the model's vocabulary), got {size!r}")
    if size == current:
        return model
    embeddings = model.get_input_embeddings()
    embeddings.weight.data = embeddings.weight.data[:size].clone()  # (size, d)
    embeddings.num_embeddings = size
    head = model.get_output_embeddings()
    if head is not None:
        if head.weight.size(0) != size:  # untied head (a tied one was cut with the embeddings)
            head.weight.data = head.weight.data[:size].clone()  # (size, d)
        if getattr(head, "bias", None) is not None:
            head.bias.data = head.bias.data[:size].clone()  # (size,)
        head.out_features = size
    model.config.get_text_config().vocab_size = size
    return model


def _tokenizer_size(tokenizer: PreTrainedTokenizerBase) -> int:
    """How many ids the tokenizer can produce: len(tokenizer), or one past its largest id if that is more."""
    ids = tokenizer.get_vocab().values()
    return max(len(tokenizer), max(ids, default=-1) + 1)


def align_vocabularies(
    draft_model: PreTrainedModel, target_model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None
) -> int:
    """Restrict both models to the token ids that are real in both; return how many (N).

    N is the tokenizer's size when a tokenizer is given, so padding rows beyond it get
    zero probability in both models (see the module docstring for the distribution that
    is then sampled); without one, N = min(V_draft, V_target).

    Raises:
        ValueError: if the tokenizer has ids outside the rows the models share.
    """
    shared = min(vocab_size(draft_model), vocab_size(target_model))
    if tokenizer is not None:
        real = _tokenizer_size(tokenizer)
        if real > shared:
            raise ValueError(
                f"the tokenizer has {real} tokens but the models share only {shared} output rows: "
                "these checkpoints do not share a vocabulary"
            )
        shared = real  # ids in [len(tokenizer), shared) are padding: cut them too
    restrict_vocabulary(draft_model, shared)
    restrict_vocabulary(target_model, shared)
    return shared


def _finish(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """Eval mode, and a pad token for `generate` (the EOS when the checkpoint has none)."""
    if model.generation_config.pad_token_id is None:
        pad = tokenizer.pad_token_id
        model.generation_config.pad_token_id = pad if pad is not None else tokenizer.eos_token_id
    return model.eval()


def load_pair_from_folder(
    folder: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | None = None
) -> ModelPair:
    """Load a pair saved as `folder/draft`, `folder/target` (tokenizer in `target`), offline.

    Returns:
        A `ModelPair` (draft_model, target_model, tokenizer), float32 unless `dtype` says otherwise.
    """
    folder = Path(folder)
    for part in ("draft", "target"):
        if not (folder / part / "config.json").is_file():
            raise ValueError(f"folder {str(folder)!r} has no {part}/config.json: not a saved pair")
    device = _default_device(device)
    dtype = dtype or torch.float32
    tokenizer = AutoTokenizer.from_pretrained(folder / "target", local_files_only=True)
    models = [AutoModelForCausalLM.from_pretrained(folder / part, dtype=dtype, local_files_only=True).to(device)
              for part in ("draft", "target")]
    draft_model, target_model = (_finish(m, tokenizer) for m in models)
    align_vocabularies(draft_model, target_model, tokenizer)
    return ModelPair(draft_model, target_model, tokenizer)


def load_pair(
    name: str = "tiny",
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    *,
    device_map: str | dict | None = None,
    local_files_only: bool = False,
    **from_pretrained_kwargs,
) -> ModelPair:
    """Load a named draft / target pair and its shared tokenizer.

    Args:
        name: one of `PAIRS` ("tiny", "gpt2", "qwen2.5", "qwen2.5-1.5b"; "tiny-cross" and
            "pythia-gpt2", whose drafts have tokenizers of their own, give a `CrossPair`).
        device: where both models go (None: CUDA when available, else CPU).
        dtype: parameter dtype (None: float32 on CPU and for "tiny", else bfloat16 or float16).
        device_map: for hub pairs, e.g. "auto" to spread a large target over the visible
            GPUs (needs `accelerate`); the draft goes where the target's embeddings are.
        local_files_only: never touch the network (use the local hub cache only).
        **from_pretrained_kwargs: passed on to `from_pretrained` for hub pairs (e.g. `cache_dir`).

    Returns:
        A `ModelPair` (draft_model, target_model, tokenizer), in eval mode, with equal
        output vocabularies; for a cross pair a `CrossPair`, each model with its own.

    Raises:
        ValueError: for an unknown name.
        ImportError: for `device_map` without `accelerate` installed.
        PairUnavailableError: when a hub pair cannot be loaded (offline, not cached).
    """
    if name not in PAIRS:
        raise ValueError(f"name must be one of {sorted(PAIRS)}, got {name!r}")
    spec = PAIRS[name]
    if spec.embedded and device_map is not None:
        raise ValueError(f"device_map is for hub pairs; the {name!r} pair fits on one device, got {device_map!r}")
    if spec.cross:
        return _load_cross_pair(name, spec, device, dtype, local_files_only, **from_pretrained_kwargs)
    if spec.embedded:
        return load_pair_from_folder(TINY_DIR, device=device, dtype=dtype)
    device = _default_device(device)
    dtype = _default_dtype(dtype, device, embedded=False)
    if device_map is not None:
        try:
            import accelerate  # noqa: F401  (needed by transformers for device_map)
        except ImportError as error:
            message = f"device_map={device_map!r} needs the accelerate package: pip install accelerate"
            raise ImportError(message) from error
    kwargs = {"dtype": dtype, "local_files_only": local_files_only, **from_pretrained_kwargs}
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec.target, **{k: v for k, v in kwargs.items() if k != "dtype"})
        if device_map is None:
            target_model = AutoModelForCausalLM.from_pretrained(spec.target, **kwargs).to(device)
        else:
            target_model = AutoModelForCausalLM.from_pretrained(spec.target, device_map=device_map, **kwargs)
        draft_model = AutoModelForCausalLM.from_pretrained(spec.draft, **kwargs).to(model_device(target_model))
    except OSError as error:
        raise PairUnavailableError(
            f"could not load the {name!r} pair ({spec.draft} -> {spec.target}) from the Hugging Face hub or "
            f"its local cache ({type(error).__name__}: {error}). Without network access, use "
            "load_pair('tiny'), the pair embedded in this package."
        ) from error
    draft_model, target_model = _finish(draft_model, tokenizer), _finish(target_model, tokenizer)
    align_vocabularies(draft_model, target_model, tokenizer)
    return ModelPair(draft_model, target_model, tokenizer)


def _load_cross_pair(name: str, spec: PairSpec, device: str | torch.device | None, dtype: torch.dtype | None,
                     local_files_only: bool, **kwargs) -> CrossPair:
    """Two models, each with its own tokenizer; neither vocabulary is cut."""
    device = _default_device(device)
    dtype = _default_dtype(dtype, device, embedded=spec.embedded)
    root = TINY_DIR if spec.embedded else None
    sources = [str(root / part) if root else part for part in (spec.draft, spec.target)]
    options = {"local_files_only": local_files_only or spec.embedded, **kwargs}
    try:
        tokenizers = [AutoTokenizer.from_pretrained(source, **options) for source in sources]
        models = [AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **options).to(device)
                  for source in sources]
    except OSError as error:
        raise PairUnavailableError(
            f"could not load the {name!r} pair ({spec.draft} -> {spec.target}) from the Hugging Face hub or "
            f"its local cache ({type(error).__name__}: {error}). Without network access, use "
            "load_pair('tiny-cross'), the cross-tokenizer pair embedded in this package (or load_pair('tiny'))."
        ) from error
    (draft_tokenizer, tokenizer), (draft_model, target_model) = tokenizers, models
    return CrossPair(_finish(draft_model, draft_tokenizer), _finish(target_model, tokenizer), tokenizer,
                     draft_tokenizer)
