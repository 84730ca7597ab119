"""Forward passes with and without a KV cache, and exact cache rollback.

Speculative decoding runs two models over one growing sequence. Every step asks a
model for "the logits of the last m positions of this sequence". Two ways to answer:

* `FullForward` (the teaching path of chapters 2 and 3) re-reads the whole sequence
  every time. Simple, obviously correct, and slow: O(n) work per token.
* `CachedForward` (chapter 5) keeps a `transformers` `DynamicCache` and feeds only
  the tokens the model has not seen yet. When drafts are rejected, the cache holds
  keys and values of tokens that are no longer in the sequence, so `rollback(n)`
  crops it back to the first n tokens.

Models with a sliding attention window (Mistral, Gemma 2 and 3) keep only the last
`sliding_window - 1` keys in their sliding layers, so a plain crop would have to
restore keys that were already dropped. `CachedForward` switches such a cache to
"past recording" (what `transformers`' own assisted generation does): each pass keeps
every new key until the next `rollback`, which removes the rejected tokens and only
then trims the layer back to its window.

Invariant: after `rollback(n)`, the logits a `CachedForward` returns for any
continuation equal (up to float rounding) those of a fresh pass over the sequence.
The draft is fed exactly the tokens it has not seen: the correction after a
rejection, or the last draft plus the bonus token after a fully accepted block.
"""

from __future__ import annotations

import inspect
from typing import Protocol, runtime_checkable

import torch
import transformers
from transformers import DynamicCache, PreTrainedModel

# The oldest transformers whose sliding-window layers roll back correctly: earlier
# releases either cannot record a sliding layer's past or build attention masks that
# assume a window-sized cache (tests/test_edges.py checks the rollback).
SLIDING_ROLLBACK_MIN = (5, 24)


def sliding_rollback_supported() -> bool:
    """Whether this transformers release can roll back a sliding-window cache."""
    release = tuple(int(part) for part in transformers.__version__.split(".")[:2] if part.isdigit())
    layer = getattr(transformers.cache_utils, "DynamicSlidingWindowLayer", None)
    return release >= SLIDING_ROLLBACK_MIN and hasattr(layer, "activate_past_recording")


@runtime_checkable
class LogitsSource(Protocol):
    """Anything that answers 'logits of the last m positions of this sequence'."""

    model: PreTrainedModel  # the model whose logits it returns
    max_length: int | None  # the most tokens its cache holds (None: no limit)
    forward_calls: int  # the model's forward passes so far

    def last_logits(self, sequence: torch.Tensor, num_positions: int) -> torch.Tensor: ...

    def rollback(self, length: int) -> None: ...


def forward_keywords(model: PreTrainedModel) -> tuple[str, bool]:
    """How `model.forward` takes a cache, and whether it takes `logits_to_keep`.

    transformers >= 5.24 names the cache argument `cache`, older releases
    `past_key_values`; the one place the package reads the signature.
    """
    parameters = inspect.signature(model.forward).parameters
    return ("cache" if "cache" in parameters else "past_key_values"), "logits_to_keep" in parameters


def uses_sliding_window(config: object) -> bool:
    """Whether a model config gives some layers a sliding attention window."""
    return bool(getattr(config, "use_sliding_window", False)) or any(
        kind != "full_attention" for kind in getattr(config, "layer_types", None) or [])


class FullForward:
    """No cache: every call runs the model over the whole sequence."""

    max_length = None  # no cache, no limit but the model's

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.forward_calls = 0
        _, self._logits_to_keep = forward_keywords(model)

    @torch.no_grad()
    def last_logits(self, sequence: torch.Tensor, num_positions: int) -> torch.Tensor:
        """Logits at the last `num_positions` positions of `sequence` (1, n) -> (m, V)."""
        kwargs = {"logits_to_keep": num_positions} if self._logits_to_keep else {}
        self.forward_calls += 1
        logits = self.model(sequence, use_cache=False, **kwargs).logits  # (1, n or m, V)
        return logits[0, -num_positions:]

    def rollback(self, length: int) -> None:
        """Nothing to undo: the next call re-reads the sequence it is given."""


class CachedForward:
    """A model with a `DynamicCache`: it only reads tokens it has not seen."""

    max_length = None  # the cache grows as needed

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.forward_calls = 0
        self.cache = rollback_cache(model)
        self._cache_kwarg, self._logits_to_keep = forward_keywords(model)

    @property
    def cached_length(self) -> int:
        """How many tokens of the sequence have keys and values in the cache."""
        return self.cache.get_seq_length()

    @torch.no_grad()
    def last_logits(self, sequence: torch.Tensor,
                    num_positions: int) -> torch.Tensor:
        """Logits at the last `num_positions` positions: (1, n) -> (m, V).

        Feeds only sequence[:, cached_length:]; those unseen tokens must
        include the last `num_positions` positions (roll back first if they
        do not).
        """
        seen = self.cached_length
        unseen = sequence[:, seen:]  # (1, n - seen)
        if unseen.size(1) < num_positions:
            raise ValueError(
                f"num_positions={num_positions} but only {unseen.size(1)} "
                f"tokens are unseen (cache holds {seen} of "
                f"{sequence.size(1)}); call rollback() first"
            )
        # Positions continue from the cache, so the new tokens attend to all
        # that came before.
        position_ids = torch.arange(seen, sequence.size(1),
                                    device=sequence.device)[None]
        kwargs = {self._cache_kwarg: self.cache, "use_cache": True,
                  "position_ids": position_ids}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = num_positions
        self.forward_calls += 1
        logits = self.model(unseen, **kwargs).logits  # (1, n - seen or m, V)
        return logits[0, -num_positions:]

    def rollback(self, length: int) -> None:
        """Forget every cached token after the first `length` ones.

        `crop(-k)` removes the last k tokens in every supported transformers
        release (a positive argument raises in recent ones, and crop(0)
        empties the cache in older ones, hence the guard). Rolling back to 0
        starts a new cache: nothing of the old one is needed.

        Raises:
            ValueError: when a layer cannot give back what must be kept
                (`can_roll_back` says so beforehand).
        """
        if length == 0:
            self.cache = rollback_cache(self.model)
            return
        excess = self.cached_length - length
        if excess > 0:
            if not getattr(self.cache, "is_croppable", True):
                # e.g. recurrent (linear-attention) layers, whose state
                # cannot be cut back.
                layers = sorted({type(layer).__name__
                                 for layer in self.cache.layers})
                raise ValueError(
                    f"{type(self.model).__name__}'s cache "
                    f"({type(self.cache).__name__} with layers {layers}) "
                    "cannot be rolled back; pass use_cache=False"
                )
            for layer in sliding_layers(self.cache):
                # A sliding layer holds its last window plus the keys fed
                # since the last rollback; keys older than that are gone and
                # cannot be brought back.
                if not self._sliding_layer_keeps(layer, length):
                    raise ValueError(
                        f"cannot roll {type(self.model).__name__}'s cache "
                        f"back from {self.cached_length} to {length} "
                        "tokens: its sliding-window layers (window "
                        f"{layer.sliding_window}) only keep the tokens fed "
                        "since the previous rollback"
                    )
            self.cache.crop(-excess)
        else:
            # Nothing to forget, but sliding layers still hold the keys of the
            # last pass beyond their window: crop(0) trims them (a no-op on
            # full-attention layers; a layer not yet fed holds nothing).
            for layer in sliding_layers(self.cache):
                if layer.is_initialized:
                    layer.crop(0)

    def can_roll_back(self, length: int) -> bool:
        """Whether `rollback(length)` would succeed: always, but for a sliding
        layer asked for keys it dropped, or a cache that cannot be cut."""
        if length == 0 or self.cached_length <= length:
            return True
        if not getattr(self.cache, "is_croppable", True):
            return False
        return all(self._sliding_layer_keeps(layer, length)
                   for layer in sliding_layers(self.cache))

    def _sliding_layer_keeps(self, layer, length: int) -> bool:
        """Whether a sliding layer still holds the keys a rollback to
        `length` tokens needs (the last window - 1 of them)."""
        excess = self.cached_length - length
        return not layer.is_initialized or (
            layer.keys.shape[-2] - excess
            >= min(layer.sliding_window - 1, length))


def sliding_layers(cache: DynamicCache) -> list:
    """The cache's sliding-window layers (none for a full-attention model)."""
    return [layer for layer in getattr(cache, "layers", []) if getattr(layer, "is_sliding", False)]


def rollback_cache(model: PreTrainedModel) -> DynamicCache:
    """A `DynamicCache` for `model` that `CachedForward.rollback` can crop at any length.

    Full-attention layers can always be cropped. Sliding-window layers drop keys that
    fall out of the window, so they are put in past-recording mode: keys stay until the
    next rollback has removed the rejected tokens.

    Raises:
        ValueError: if the model has sliding-window layers and this `transformers`
            release cannot record their past (use `use_cache=False` there).
    """
    cache = DynamicCache(config=model.config)
    sliding = sliding_layers(cache)
    recording = all(hasattr(layer, "activate_past_recording") for layer in sliding)
    if sliding and not (recording and sliding_rollback_supported()):
        raise ValueError(
            f"{type(model).__name__} uses sliding-window attention (sliding_window="
            f"{getattr(model.config, 'sliding_window', None)}), and transformers {transformers.__version__} "
            "cannot roll back a sliding-window cache (transformers >= "
            f"{'.'.join(map(str, SLIDING_ROLLBACK_MIN))} can); upgrade it or pass use_cache=False"
        )
    for layer in sliding:
        layer.activate_past_recording()
    return cache


def make_logits_source(model: PreTrainedModel, use_cache: bool) -> LogitsSource:
    """`CachedForward` when `use_cache`, else `FullForward`."""
    return CachedForward(model) if use_cache else FullForward(model)


def is_logits_source(obj: object) -> bool:
    """Whether `obj` is a `LogitsSource` over a transformers model (e.g.
    `fast.StaticForward` or `fast.LeanForward`)."""
    return isinstance(obj, LogitsSource) and isinstance(obj.model, PreTrainedModel)


def fresh_source(model: PreTrainedModel | LogitsSource,
                 use_cache: bool) -> LogitsSource:
    """A generation's logits source: a model gets a new one
    (`make_logits_source`); a source is used as it is, its cache emptied."""
    if isinstance(model, PreTrainedModel):
        return make_logits_source(model, use_cache)
    model.rollback(0)  # it may hold an earlier call's cache
    return model


def as_target_source(target_model: PreTrainedModel | LogitsSource,
                     use_cache: bool, name: str) -> LogitsSource:
    """The target as a logits source: a model gets a new one, a source
    (e.g. `fast.StaticForward`) is used with its cache emptied.

    Raises:
        TypeError: naming `name`, for anything else.
    """
    if not (isinstance(target_model, PreTrainedModel)
            or is_logits_source(target_model)):
        raise TypeError(
            f"{name} must be a transformers PreTrainedModel or a logits source "
            "(with .model, .max_length, last_logits(sequence, num_positions) "
            f"and rollback(length)), got {type(target_model).__name__}")
    return fresh_source(target_model, use_cache)
