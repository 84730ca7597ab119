"""Argument checks shared by every generation entry point.

Bad input gets a `ValueError` (or `TypeError` for a wrong type) whose message names
the argument, the value received and what is allowed, before any model runs.
"""

from __future__ import annotations

import operator

import torch
from transformers import PreTrainedModel


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


def as_integer(value: object) -> int | None:
    """`value` as a Python int if it is integer-like (int, numpy integer, one-element
    integer tensor), else None. Booleans are not counted as integers here."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        return None
    if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_integer(name: str, value: object, *, minimum: int, maximum: int | None = None,
                  optional: bool = False) -> int | None:
    """`value` as a Python int, if it is integer-like (`as_integer`: int, numpy integer,
    one-element integer tensor; not bool) and within [minimum, maximum]; None for None
    when `optional`. The one rule for every integer argument of the package.

    Raises:
        ValueError: naming `name`, the allowed range and the value received.
    """
    if optional and value is None:
        return None
    number = as_integer(value)
    if number is None or number < minimum or (maximum is not None and number > maximum):
        allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {'None or ' if optional else ''}an integer {allowed}, got {value!r}")
    return number


def check_sequence(sequence: object, name: str = "sequence") -> None:
    """A logits source's input: an integer tensor of shape (1, n), n >= 1.

    Raises:
        TypeError: naming `name`, for anything but an integer tensor.
        ValueError: naming `name`, for another shape (a batch, a 1-D sequence).
    """
    if not isinstance(sequence, torch.Tensor) or sequence.is_floating_point() or sequence.is_complex() \
            or sequence.dtype == torch.bool:
        kind = f"a tensor of dtype {sequence.dtype}" if isinstance(sequence, torch.Tensor) else type(sequence).__name__
        raise TypeError(f"{name} must be an integer tensor of token ids, shape (1, n), got {kind}")
    if sequence.dim() != 2 or sequence.size(0) != 1 or sequence.size(1) == 0:
        raise ValueError(f"{name} must have shape (1, n), got {tuple(sequence.shape)}: one sequence of n >= 1 "
                         "tokens")


def eos_set(eos_token_id: object) -> set[int]:
    """The end-of-sequence ids as a set of Python ints (empty: never stop early).

    Args:
        eos_token_id: None, one integer-like id (int, numpy integer, 0-d integer
            tensor), or a list / tuple / set / 1-d integer tensor of them.

    Raises:
        TypeError: for anything else (a float, a string, a 2-d tensor, a bool).
        ValueError: for a negative id.
    """
    if eos_token_id is None:
        return set()
    allowed = "None, an integer id >= 0, or a list / tuple / set / 1-d integer tensor of them"
    if isinstance(eos_token_id, torch.Tensor):
        if eos_token_id.dim() > 1:
            raise TypeError(f"eos_token_id must be {allowed}, got a tensor of shape {tuple(eos_token_id.shape)}")
        items = list(eos_token_id.reshape(-1).unbind())
    elif isinstance(eos_token_id, (list, tuple, set, frozenset)):
        items = list(eos_token_id)
    else:
        items = [eos_token_id]
    ids = set()
    for item in items:
        token = as_integer(item)
        if token is None:
            raise TypeError(f"eos_token_id must be {allowed}, got {eos_token_id!r}")
        if token < 0:
            raise ValueError(f"eos_token_id must hold token ids >= 0, got {token} in {eos_token_id!r}")
        ids.add(token)
    return ids


def check_draft_length(k: object, source: str) -> int:
    """A draft length K as a Python int >= 0, or a clear error naming where it came from.

    Args:
        k: the value a schedule's `next_k()` returned.
        source: what produced it, for the message (e.g. "MySchedule.next_k()").

    Raises:
        TypeError: if `k` is not an integer (a float, a bool, None).
        ValueError: if `k` is negative.
    """
    value = as_integer(k)
    if value is None:
        raise TypeError(f"{source} must return an integer K >= 0 (0 drafts nothing), got {k!r}")
    if value < 0:
        raise ValueError(f"{source} must return an integer K >= 0 (0 drafts nothing), got {k!r}")
    return value


def check_drafter(drafter: object, name: str = "draft_model") -> None:
    """A `drafting.Drafter` has `draft`, `rollback` and `forward_calls`; a TypeError names what is missing."""
    for attribute in ("draft", "rollback", "forward_calls"):
        value = getattr(drafter, attribute, None)
        if value is None or (attribute != "forward_calls" and not callable(value)):
            raise TypeError(
                f"{type(drafter).__name__} has no {attribute}: {name} must be a transformers PreTrainedModel "
                "or a Drafter (with draft(input_ids, num_draft_tokens, vocab_size), rollback(length) and "
                "forward_calls)")


def check_capacity(name: str, max_length: int | None, needed: int) -> None:
    """A logits source with a fixed cache (`max_length`) must hold the prompt
    and every new token; None holds any length.

    Raises:
        ValueError: naming `name`, its `max_length` and the length needed.
    """
    if max_length is not None and needed > max_length:
        raise ValueError(
            f"{name} holds at most max_length={max_length} tokens, but the prompt "
            f"and max_new_tokens need {needed}: build it with a larger max_length")


def check_proposal(drafter: object, proposal: object, num_draft_tokens: int, vocab: int) -> None:
    """A drafter's proposal before the target judges it: at most `num_draft_tokens` integer
    token ids, shape (K',), each in [0, vocab). One device sync.

    Raises:
        TypeError: naming the drafter, if the tokens are not an integer tensor.
        ValueError: naming the drafter, for another shape, more tokens than it was asked
            for (they would run past `max_new_tokens`) or ids outside the vocabulary.
    """
    name = f"{type(drafter).__name__}.draft"
    tokens = getattr(proposal, "tokens", None)
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.is_complex() \
            or tokens.dtype == torch.bool:
        kind = tokens.dtype if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise TypeError(f"{name} must return integer token ids, got {kind}")
    if tokens.dim() != 1:
        raise ValueError(f"{name} must return tokens of shape (K,), got {tuple(tokens.shape)}")
    count = tokens.numel()
    if count > num_draft_tokens:
        raise ValueError(f"{name} returned {count} tokens, but was asked for at most "
                         f"num_draft_tokens={num_draft_tokens}: a Drafter may propose fewer tokens, never more")
    if count and bool(((tokens < 0) | (tokens >= vocab)).any()):
        raise ValueError(f"{name} returned token ids outside [0, {vocab}): {tokens.tolist()}")


def check_generation_args(
    models: dict[str, PreTrainedModel],
    input_ids: torch.Tensor,
    max_new_tokens: int,
    sampling: object,
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
    check_integer("max_new_tokens", max_new_tokens, minimum=0)
    if not (hasattr(num_draft_tokens, "next_k") and hasattr(num_draft_tokens, "update")):
        k = as_integer(num_draft_tokens)
        if k is None or k < 1:
            raise (TypeError if k is None else ValueError)(
                f"num_draft_tokens must be an integer >= 1 or a schedule (with next_k and update), "
                f"got {num_draft_tokens!r}"
            )
    # Checked by what it offers rather than by class: `sampling` builds on this module
    # (its own fields are checked with `check_integer`), so this module cannot import it.
    if not all(hasattr(sampling, name) for name in ("greedy", "temperature", "top_k", "top_p")):
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
    outside = ((input_ids < 0) | (input_ids >= vocab)).nonzero()  # (bad, 2) positions
    if outside.numel():
        position = int(outside[0, 1])
        raise ValueError(
            f"input_ids must hold token ids in [0, {vocab}), got {int(input_ids[0, position])} at position "
            f"{position}" + (f" ({outside.size(0)} ids out of range)" if outside.size(0) > 1 else "")
        )


def check_prompts(prompts: object, model: PreTrainedModel | None = None) -> None:
    """Raise a ValueError / TypeError naming `prompts[i]` for any malformed prompt.

    Without `model`, only the structure is checked (a non-empty list of non-empty
    1-D integer tensors); with it, also the device and the token ids' range.
    """
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a list of 1-D integer tensors, got {type(prompts).__name__}")
    if not prompts:
        raise ValueError("prompts is empty: pass at least one prompt")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, torch.Tensor) or prompt.dtype not in (torch.long, torch.int):
            kind = f"a tensor of dtype {prompt.dtype}" if isinstance(prompt, torch.Tensor) else type(prompt).__name__
            raise TypeError(f"prompts[{i}] must be a 1-D integer torch.Tensor, got {kind}")
        if prompt.dim() != 1:
            raise ValueError(f"prompts[{i}] must have shape (n,), got shape {tuple(prompt.shape)}")
        if prompt.numel() == 0:
            raise ValueError(f"prompts[{i}] is empty: every prompt must have at least one token")
    if model is None:
        return
    vocab, device = vocab_size(model), model_device(model)
    for i, prompt in enumerate(prompts):
        if prompt.device != device:
            raise ValueError(f"prompts[{i}] is on {prompt.device} but the models are on {device}")
    # One range check over all ids, then the first offending prompt and position.
    ids = torch.cat(list(prompts))
    bad = ((ids < 0) | (ids >= vocab)).nonzero()
    if bad.numel():
        index, ends = int(bad[0, 0]), torch.tensor([len(p) for p in prompts]).cumsum(0).tolist()
        i = next(i for i, end in enumerate(ends) if index < end)
        raise ValueError(f"prompts[{i}] must hold token ids in [0, {vocab}), got {int(ids[index])} at position "
                         f"{index - (ends[i - 1] if i else 0)}")
