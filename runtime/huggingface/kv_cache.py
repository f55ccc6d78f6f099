"""The key/value cache of the streams a text-generation model runs: one batch, rearranged as streams come and go.

Each running stream has its own keys and values (every layer's, for every token it has seen).
The streams joining at a step are prefilled together in ONE forward call (``prefill``): their
prompts left-padded to the longest, with an attention mask that hides the padding and each row's
own position ids (those ``model.generate`` gives a left-padded batch); each stream then keeps its
own rows, the padding cut off, until its next step. Every step then runs ONE forward call over
all the decoding streams: their caches are rows of one batch, left-padded to the longest, masked
and positioned the same way, so that every row computes what it would alone, to float rounding
(the test suite checks greedy tokens against ``model.generate`` alone). The batch is
transformers' ``DynamicCache`` (each step appends one column); it is rebuilt only when the set of
streams changes: a new stream's row is added, a stream that sits a step out takes its row back,
and a stream that ended is cut out at once (``free``), trimming columns that only held padding.

Why this and not transformers' own continuous batching (``generate_batch``,
``ContinuousBatchingManager``): that runs a generation loop of its own on a thread of its own,
beside the server's continuous batcher, and on the CPU it measured some 35 tokens/s where this
cache gave over 4000 on the same model (docs/llm.md has the figures and the command).

Only models whose every layer attends to all earlier tokens are served (Llama, Mistral without a
sliding window, GPT-2, Qwen2...); a model whose cache has sliding-window or recurrent layers is
refused at load. Everything here runs on the model's one executor thread.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class Sequence:
    """One stream's tokens as the cache knows them."""

    __slots__ = ("freed", "kv", "length")

    def __init__(self) -> None:
        self.length = 0
        """Tokens in the stream's cache (0: not prefilled yet)."""
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        """The stream's own cache while it is outside the batch: per layer, (keys, values) of
        shape [1, heads, length, head_dim]."""
        self.freed = False


class BatchCache:
    """The cache of one model's decoding streams; see the module docstring."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.config = model.config
        self.device = model.device
        self.rows: list[Sequence] = []
        self.rebuilds = 0
        """Times the batch was rebuilt (streams came, sat out or went)."""
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        layers = DynamicCache(config=self.config).layers
        if not all(type(layer) is DynamicLayer for layer in layers):
            kinds = sorted({type(layer).__name__ for layer in layers})
            raise ValueError(
                f"the model's cache has layers of kinds {kinds}: only models whose every layer "
                "attends to all earlier tokens (DynamicLayer) are served"
            )

    # ------------------------------------------------------------------ calls

    def prefill(self, sequences: list[Sequence], prompts: list[list[int]]) -> torch.Tensor:
        """Run the prompts of the streams joining this step, together, in one forward call; each
        stream's cache is kept aside. The logits of each one's next token, one row each, in order.

        The prompts are left-padded to the longest, with an attention mask that hides the padding
        and each row's own position ids (those ``model.generate`` gives a left-padded batch:
        ``cumsum(mask) - 1``), so that every row computes what its prompt would alone. Each
        stream then keeps its own rows, the padding cut off: per layer, keys and values of shape
        [1, heads, prompt length, head_dim], as ``_arrange`` takes them."""
        size = len(prompts)
        longest = max(len(prompt) for prompt in prompts)
        pad = self.config.pad_token_id if isinstance(self.config.pad_token_id, int) else 0
        ids = torch.full((size, longest), pad, dtype=torch.long)
        mask = torch.zeros(size, longest, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, longest - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, longest - len(prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        cache = DynamicCache(config=self.config)
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_argument: cache},
        )
        layers: list[Any] = list(cache.layers)
        for row, (sequence, prompt) in enumerate(zip(sequences, prompts, strict=True)):
            start = longest - len(prompt)
            sequence.kv = [
                (
                    layer.keys[row : row + 1, :, start:].contiguous(),
                    layer.values[row : row + 1, :, start:].contiguous(),
                )
                for layer in layers
            ]
            sequence.length = len(prompt)
        logits: torch.Tensor = out.logits[:, -1]
        return logits

    def decode(self, sequences: list[Sequence], tokens: list[int]) -> torch.Tensor:
        """One step of every stream in ``sequences`` (each fed its last token, ``tokens``), in one
        forward call. The logits of each one's next token, one row each, in order."""
        self._arrange(sequences)
        assert self.cache is not None and self.mask is not None
        size = len(sequences)
        ids = torch.tensor(tokens, device=self.device).view(size, 1)
        positions = torch.tensor([s.length for s in sequences], device=self.device).view(size, 1)
        self.mask = torch.cat([self.mask, self.mask.new_ones(size, 1)], dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_argument: self.cache},
        )
        for sequence in sequences:
            sequence.length += 1
        logits: torch.Tensor = out.logits[:, -1]
        return logits

    def free(self, sequence: Sequence) -> None:
        """A stream ended: its cache goes, now (cut out of the batch when it is in it)."""
        sequence.freed = True
        sequence.kv = None
        if sequence in self.rows:
            self._arrange([s for s in self.rows if s is not sequence])

    @property
    def tokens(self) -> int:
        """Positions the batch holds (rows times columns, padding included)."""
        return 0 if self.mask is None else int(self.mask.numel())

    # ------------------------------------------------------------------ rearranging

    def _arrange(self, sequences: list[Sequence]) -> None:
        """Make the batch's rows ``sequences``, in that order."""
        if len(sequences) == len(self.rows) and all(
            a is b for a, b in zip(sequences, self.rows, strict=True)
        ):
            return
        self.rebuilds += 1
        wanted = {id(s) for s in sequences}
        old_rows = {id(s): i for i, s in enumerate(self.rows)}
        old: list[Any] = list(self.cache.layers) if self.cache is not None else []
        width = self.mask.shape[1] if self.mask is not None else 0
        for i, sequence in enumerate(self.rows):  # a stream sitting this step out keeps its own copy
            if id(sequence) not in wanted and not sequence.freed:
                start = width - sequence.length
                sequence.kv = [
                    (layer.keys[i : i + 1, :, start:].clone(), layer.values[i : i + 1, :, start:].clone())
                    for layer in old
                ]
        if not sequences:
            self.rows, self.cache, self.mask = [], None, None
            return
        total = max(s.length for s in sequences)
        cache = DynamicCache(config=self.config)
        new: list[Any] = list(cache.layers)
        for index, layer in enumerate(new):
            sources = []
            for sequence in sequences:
                row = old_rows.get(id(sequence))
                if row is not None:
                    sources.append((old[index].keys[row], old[index].values[row]))
                else:
                    assert sequence.kv is not None
                    keys, values = sequence.kv[index]
                    sources.append((keys[0], values[0]))
            first = sources[0][0]
            keys = first.new_zeros(len(sequences), first.shape[0], total, first.shape[2])
            values = torch.zeros_like(keys)
            for row, (sequence, (k, v)) in enumerate(zip(sequences, sources, strict=True)):
                length = sequence.length
                keys[row, :, total - length :] = k[:, k.shape[1] - length :]
                values[row, :, total - length :] = v[:, v.shape[1] - length :]
            layer.update(keys, values)
        mask = torch.zeros(len(sequences), total, dtype=torch.long, device=self.device)
        for row, sequence in enumerate(sequences):
            mask[row, total - sequence.length :] = 1
            sequence.kv = None
        self.rows, self.cache, self.mask = list(sequences), cache, mask
