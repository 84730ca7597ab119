"""Argument checks shared by every generation entry point.

Bad input gets a `ValueError` (or `TypeError` for a wrong type) whose message names
the argument, the value received and what is allowed, before any model runs.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from transformers import PreTrainedModel

from .sampling import SamplingConfig


def vocab_size(model: PreTrainedModel) -> int:
    """Number of logits the model produces per position (its output vocabulary)."""
    head = model.get_output_embeddings()
    return int(head.weight.size(0)) if head is not None else int(model.config.vocab_size)


def context_length(model: PreTrainedModel) -> int | None:
    """The longest sequence the model's position embeddings allow (None if unbounded)."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def model_device(model: PreTrainedModel) -> torch.device:
    """The device of the model's first parameter (its input embeddings for HF models)."""
    return next(model.parameters()).device


def eos_set(eos_token_id: int | Iterable[int] | None) -> set[int]:
    """The end-of-sequence ids as a set (empty: never stop early)."""
    if eos_token_id is None:
        return set()
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"eos_token_id must be None, an int >= 0 or a list of them, got {eos_token_id!r}")
    return set(ids)


def check_generation_args(
    models: dict[str, PreTrainedModel],
    input_ids: torch.Tensor,
    max_new_tokens: int,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
    num_draft_tokens: object = 1,
) -> None:
    """Raise a clear error for any argument a generation call cannot work with.

    Args:
        models: the models by argument name, e.g. {"target_model": ..., "draft_model": ...}.
        input_ids, max_new_tokens, sampling, generator, num_draft_tokens: as passed.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.long, torch.int):
        raise TypeError(f"input_ids must be an integer torch.Tensor of shape (1, n), got {type(input_ids).__name__}"
                        + (f" of dtype {input_ids.dtype}" if isinstance(input_ids, torch.Tensor) else ""))
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape (1, n), got shape {tuple(input_ids.shape)}")
    if input_ids.size(0) != 1:
        raise ValueError(f"input_ids must hold one sequence (batch size 1), got batch size {input_ids.size(0)}")
    if input_ids.size(1) == 0:
        raise ValueError("input_ids is empty: the prompt must have at least one token")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if isinstance(num_draft_tokens, bool) or (isinstance(num_draft_tokens, int) and num_draft_tokens < 1):
        raise ValueError(f"num_draft_tokens must be an integer >= 1 or a schedule, got {num_draft_tokens!r}")
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")

    names = list(models)
    first = names[0]
    for name, model in models.items():
        if not isinstance(model, PreTrainedModel):
            raise TypeError(f"{name} must be a transformers PreTrainedModel, got {type(model).__name__}")
        # Shared vocabulary: the rejection rule compares p and q token by token.
        if vocab_size(model) != vocab_size(models[first]):
            raise ValueError(
                f"{name} has a vocabulary of {vocab_size(model)} tokens but {first} has "
                f"{vocab_size(models[first])}: draft and target must share one vocabulary"
            )
        if model_device(model) != model_device(models[first]):
            raise ValueError(
                f"{name} is on {model_device(model)} but {first} is on {model_device(models[first])}: "
                "put both models on the same device"
            )
        limit = context_length(model)
        if limit is not None and input_ids.size(1) + max_new_tokens > limit:
            raise ValueError(
                f"prompt ({input_ids.size(1)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                f"{name}'s context length of {limit} positions"
            )
    device = model_device(models[first])
    if input_ids.device != device:
        raise ValueError(f"input_ids is on {input_ids.device} but {first} is on {device}: move the prompt there")
    vocab = vocab_size(models[first])
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise ValueError(f"input_ids must hold token ids in [0, {vocab}), got values up to {int(input_ids.max())}")
