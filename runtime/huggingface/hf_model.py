"""The Hugging Face runtime's model: text generation on the continuous batcher, and embeddings.

``"implementation": "runtime.huggingface.HuggingFaceModel"`` (or MLServer's
``mlserver_huggingface.HuggingFaceRuntime``) with ``parameters.extra.task``:

- ``text-generation``: served with continuous batching whatever the settings say (MLServer's
  settings do not have the key), at most ``max_batch_size`` streams at a time (16 when the
  settings leave it unset); the rest wait in order. A stream joining is prefilled alone; every
  step is then one forward call over all the decoding streams (:mod:`.kv_cache`), and a stream
  that finishes, is stopped or whose client goes away frees its cache at once, so that a waiting
  one takes its place at the next step. The request: a BYTES ``text_input`` (one prompt; the
  generate extension's input), or INT64 ``input_ids`` (the prompt's tokens), or a BYTES
  ``messages`` (the chat messages as JSON, rendered by the chat template); the parameters of
  :mod:`.options`. Each chunk's BYTES ``text_output`` is the new text only (the prompt is not
  repeated, unless ``echo``); the last chunk carries ``finish_reason`` (``length``, ``eos_token``
  or ``stop_sequence``), ``prompt_tokens`` and ``completion_tokens``; with ``logprobs``, every
  chunk carries its tokens' ``logprobs``; with ``return_token_ids``, their ``token_ids``. A unary
  request (``infer``, ``generate``) is answered with the whole text.
- ``feature-extraction``: ``infer`` with a BYTES ``text_input`` of N texts answers an FP32
  ``embedding`` [N, hidden size]: the last hidden state pooled per text (``pooling``: the mean
  over its tokens by default), and ``prompt_tokens`` (the tokens read) as a parameter.

torch and transformers are imported when such a model is loaded, never by the server's start.
All model calls run on one thread of the model's own, off the event loop.
"""

from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import orjson

from runtime.continuous import ContinuousModel, StepResult, Stream, StreamEnd
from runtime.errors import InvalidInput
from runtime.huggingface.hf_settings import DEFAULT_STREAMS, HuggingFaceConfig, read_config
from runtime.huggingface.options import GenerationOptions, read_options
from runtime.huggingface.text import TextStream
from runtime.settings import ModelSettings
from runtime.telemetry.tokens import TokenStats
from runtime.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
    Parameters,
    ResponseOutput,
)

CONTEXT_TOKENS = 6
"""Prompt tokens a stream's text decoder starts from, so that its first word reads as it will."""


class Generation:
    """One stream's generation, from its joining to its end."""

    __slots__ = (
        "count",
        "counted",
        "entries",
        "finish",
        "first",
        "generator",
        "last",
        "last_at",
        "max_tokens",
        "options",
        "pending",
        "prompt",
        "prompt_text",
        "sequence",
        "text",
        "token_ids",
    )

    def __init__(
        self,
        options: GenerationOptions,
        prompt: list[int],
        prompt_text: str,
        max_tokens: int,
        text: TextStream,
    ) -> None:
        self.options = options
        self.prompt = prompt
        self.prompt_text = prompt_text
        self.max_tokens = max_tokens
        self.text = text
        self.sequence: Any = None
        self.generator: Any = None
        self.count = 0
        self.counted = False
        """Its tokens were added to the model's ``token_stats``."""
        self.last = -1
        self.finish: str | None = None
        self.first = True
        self.pending: list[dict[str, Any]] = []
        """Log-probability entries not sent yet."""
        self.entries: list[dict[str, Any]] = []
        """Every log-probability entry (a unary answer lists them)."""
        self.token_ids: list[int] = []
        self.last_at = 0.0


class Produced:
    """What one step gave one stream: its new text, why it ended (or None), its new tokens'
    log-probability entries (when asked for)."""

    __slots__ = ("finish", "logprobs", "piece")

    def __init__(self, piece: str, finish: str | None, logprobs: list[dict[str, Any]] | None) -> None:
        self.piece, self.finish, self.logprobs = piece, finish, logprobs


class HuggingFaceModel(ContinuousModel):
    """A folder written by ``save_pretrained``, served; see the module docstring."""

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.config: HuggingFaceConfig = read_config(settings)
        self.task = self.config.options.task
        if self.task == "text-generation":
            settings.continuous_batching = True  # the only way this runtime generates
            if "max_batch_size" not in settings.model_fields_set or settings.max_batch_size == 0:
                settings.max_batch_size = DEFAULT_STREAMS
            if not settings.outputs:
                settings.outputs = [MetadataTensor(name="text_output", datatype=Datatype.BYTES, shape=[1])]
        elif not settings.outputs:
            settings.outputs = [MetadataTensor(name="embedding", datatype=Datatype.FP32, shape=[-1, -1])]
        self.token_stats = TokenStats() if self.task == "text-generation" else None
        """What the metrics read (vLLM's families), for a language model."""
        self.executor: ThreadPoolExecutor | None = None
        self.context_length = 0

    # ------------------------------------------------------------------ loading

    async def load(self) -> bool:
        import torch

        from runtime.huggingface.hf_loading import load

        options = self.config.options
        threads = options.intra_op_threads or 1
        self.executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix=f"model-{self.name}",
            initializer=torch.set_num_threads,
            initargs=(threads,),
        )
        process_default = torch.get_num_threads()
        loop = asyncio.get_running_loop()
        loaded = await loop.run_in_executor(self.executor, load, self.config)
        torch.set_num_threads(process_default)
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.device = loaded.device
        model_config = loaded.model.config
        self.context_length = options.max_model_len or int(
            getattr(model_config, "max_position_embeddings", 0) or self.tokenizer.model_max_length
        )
        if self.task == "text-generation":
            from runtime.huggingface.kv_cache import BatchCache

            self.cache = BatchCache(loaded.model)
            self.eos = _eos_ids(loaded.model, self.tokenizer)
        return True

    async def unload(self) -> bool:
        if self.executor is not None:
            await asyncio.to_thread(self.executor.shutdown, wait=True)
        return True

    async def _run(self, function: Any, *args: Any) -> Any:
        assert self.executor is not None
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    # ------------------------------------------------------------------ a stream joins

    async def start_stream(self, stream: Stream) -> None:
        request = stream.request
        parameters = dict(request.parameters.model_extra or {}) if request.parameters else {}
        options = read_options(parameters)
        prompt, prompt_text = self._prompt(request)
        if not prompt:
            raise InvalidInput("The prompt is empty: it has no tokens")
        stream.state = self._generation(options, prompt, prompt_text)

    def _generation(self, options: GenerationOptions, prompt: list[int], prompt_text: str) -> Generation:
        import torch

        from runtime.huggingface.kv_cache import Sequence

        length, context = len(prompt), self.context_length
        max_tokens = options.max_tokens
        if max_tokens is None:
            default = self.config.options.max_tokens
            max_tokens = min(default, context - length) if default else context - length
            if max_tokens < 1:
                raise InvalidInput(
                    f"This model's maximum context length is {context} tokens, and the prompt has "
                    f"{length} tokens: no room is left to generate. Please reduce the prompt."
                )
        elif length + max_tokens > context:
            raise InvalidInput(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{length + max_tokens} tokens ({length} in the prompt, {max_tokens} for the "
                "completion). Please reduce the prompt or max_tokens."
            )
        g = Generation(
            options,
            prompt,
            prompt_text,
            max_tokens,
            TextStream(self.tokenizer, options.stop, prompt[-CONTEXT_TOKENS:]),
        )
        g.sequence = Sequence()
        if not options.greedy:
            seed = options.seed if options.seed is not None else random.getrandbits(63)
            g.generator = torch.Generator(device=self.device).manual_seed(seed)
        return g

    def _prompt(self, request: InferenceRequest) -> tuple[list[int], str]:
        """The prompt's tokens, and its text (for ``echo``)."""
        inputs = {inp.name: inp for inp in request.inputs}
        if "messages" in inputs:
            messages = _json_input(inputs["messages"])
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise InvalidInput("messages must be a JSON list of objects with a role and a content")
            if not self.tokenizer.chat_template:
                raise InvalidInput(
                    f"Model {self.name!r} has no chat template: its tokenizer has none and "
                    "parameters.extra.chat_template sets none"
                )
            try:
                text = self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False
                )
            except Exception as exc:  # the template's own checks (roles, alternation) speak to the client
                raise InvalidInput(f"The chat template refused the messages: {exc}") from None
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]), str(text)
        if "input_ids" in inputs:
            data = np.asarray(inputs["input_ids"].data)
            if data.dtype.kind not in "iu":
                raise InvalidInput("input_ids must hold integer token ids")
            ids = data.reshape(-1).tolist()
            vocabulary = len(self.tokenizer)
            if any(not 0 <= t < vocabulary for t in ids):
                raise InvalidInput(
                    f"input_ids holds a token id outside the vocabulary (0 to {vocabulary - 1})"
                )
            return ids, str(self.tokenizer.decode(ids))
        name = self.settings.generate.text_input
        if name not in inputs:
            raise InvalidInput(
                f"Model {self.name!r} needs a BYTES input {name!r} (the prompt), 'input_ids' or 'messages'"
            )
        text = _text_input(inputs[name])
        return list(self.tokenizer(text)["input_ids"]), text

    # ------------------------------------------------------------------ steps

    async def step(self, streams: list[Stream]) -> list[StepResult]:  # type: ignore[override]  # async: allowed
        generations: list[Generation] = [stream.state for stream in streams]
        produced: list[Produced] = await self._run(self._advance, generations)
        now = time.monotonic()
        stats = self.token_stats
        assert stats is not None
        results = []
        for stream, g, out in zip(streams, generations, produced, strict=True):
            if g.count == 1:
                stats.first_token(now - stream.arrived)
            else:
                stats.next_token(now - g.last_at)
            g.last_at = now
            if out.finish is not None:  # counted before the answer goes: a client reads it at once
                g.counted = True
                label = "length" if out.finish == "length" else "stop"
                stats.ended(len(g.prompt), g.count, label, now - stream.arrived)
            if out.piece or out.finish is not None:
                results.append(StepResult(self._chunk(g, out), finished=out.finish is not None))
            else:
                results.append(StepResult())
        return results

    def _advance(self, generations: list[Generation]) -> list[Produced]:
        """One token for every stream, in one forward call (plus the prefill of those joining):
        runs on the model's thread."""
        import torch

        from runtime.huggingface.sampling import choose

        with torch.inference_mode():
            rows: list[Any] = [None] * len(generations)
            decoding = []
            for i, g in enumerate(generations):
                if g.sequence.length == 0:
                    rows[i] = self.cache.prefill(g.sequence, g.prompt)
                else:
                    decoding.append(i)
            if decoding:
                logits = self.cache.decode(
                    [generations[i].sequence for i in decoding], [generations[i].last for i in decoding]
                )
                for j, i in enumerate(decoding):
                    rows[i] = logits[j]
            banned = [self._banned(g) for g in generations]
            choices = choose(
                torch.stack(rows),
                [g.options for g in generations],
                [g.generator for g in generations],
                banned,
            )
        return [self._take(g, c) for g, c in zip(generations, choices, strict=True)]

    def _banned(self, g: Generation) -> list[int] | None:
        """Tokens that may not end the stream yet (``min_tokens``)."""
        if g.count >= g.options.min_tokens:
            return None
        return sorted(g.options.stop_token_ids | (set() if g.options.ignore_eos else self.eos))

    def _take(self, g: Generation, choice: Any) -> Produced:
        token = choice.token
        g.count += 1
        g.last = token
        g.token_ids.append(token)
        options = g.options
        stop_token = token in options.stop_token_ids
        g.text.add(token, text=not stop_token)
        if options.logprobs:
            entry = self._entry(token, choice.logprob)
            entry["top_logprobs"] = [self._entry(t, lp) for t, lp in choice.top or ()]
            g.pending.append(entry)
            g.entries.append(entry)
        finish = None
        if stop_token or (token in self.eos and not options.ignore_eos):
            finish = "eos_token"
        elif g.text.stopped:
            finish = "stop_sequence"
        elif g.count >= g.max_tokens:
            finish = "length"
        g.finish = finish
        piece = g.text.flush() if finish is not None else g.text.take()
        if g.first and options.echo:
            piece = g.prompt_text + piece
        if not piece and finish is None:
            return Produced("", None, None)
        g.first = False
        logprobs = None
        if options.logprobs:
            logprobs, g.pending = g.pending, []
        return Produced(piece, finish, logprobs)

    def _entry(self, token: int, logprob: float | None) -> dict[str, Any]:
        text = str(self.tokenizer.decode([token]))
        return {"id": token, "token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def _chunk(self, g: Generation, out: Produced) -> InferenceResponse:
        parameters: dict[str, Any] = {}
        if out.logprobs is not None:
            parameters["logprobs"] = out.logprobs
        if out.finish is not None:
            parameters.update(self._ending(g))
        return self._response(out.piece, parameters)

    def _ending(self, g: Generation) -> dict[str, Any]:
        ending: dict[str, Any] = {
            "finish_reason": g.finish,
            "prompt_tokens": len(g.prompt),
            "completion_tokens": g.count,
            "token_ids": g.token_ids,
        }
        if g.options.details:
            ending["details"] = {"generated_tokens": g.count, "prompt_tokens": len(g.prompt)}
        return ending

    def _response(self, text: str, parameters: dict[str, Any]) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            parameters=Parameters(**parameters) if parameters else None,
            outputs=[
                ResponseOutput(
                    name=self.settings.generate.text_output,
                    shape=[1],
                    datatype="BYTES",
                    data=np.array([text.encode("utf-8")], dtype=object),
                )
            ],
        )

    def combine(self, stream: Stream, chunks: list[InferenceResponse]) -> InferenceResponse:
        g: Generation = stream.state
        parameters = self._ending(g)
        if g.options.logprobs:
            parameters["logprobs"] = g.entries
        text = (g.prompt_text if g.options.echo else "") + g.text.text
        return self._response(text, parameters)

    async def end_stream(self, stream: Stream, reason: StreamEnd) -> None:
        g: Generation | None = stream.state
        if g is None:
            return
        await self._run(self.cache.free, g.sequence)
        if g.counted:
            return
        g.counted = True
        assert self.token_stats is not None
        prefilled = g.count > 0  # a stream cut short counts the tokens it was computed
        self.token_stats.ended(
            len(g.prompt) if prefilled else 0,
            g.count,
            "abort" if reason != "failed" else "error",
            g.last_at - stream.arrived if prefilled else None,
        )

    # ------------------------------------------------------------------ embeddings

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        if self.task != "feature-extraction":
            raise InvalidInput(f"Model {self.name!r} generates text: it is served by its streams")
        name = self.settings.generate.text_input
        inp = next((i for i in payload.inputs if i.name == name), None)
        if inp is None:
            raise InvalidInput(f"Model {self.name!r} needs a BYTES input {name!r}: the texts to embed")
        texts = [_decoded(item) for item in np.asarray(inp.data, dtype=object).reshape(-1)]
        if not texts:
            raise InvalidInput(f"Input {name!r} holds no text")
        vectors, tokens = await self._run(self._embed, texts)
        return InferenceResponse(
            model_name=self.name,
            parameters=Parameters(prompt_tokens=tokens),
            outputs=[
                ResponseOutput(name="embedding", shape=list(vectors.shape), datatype="FP32", data=vectors)
            ],
        )

    def _embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        import torch

        options = self.config.options
        with torch.inference_mode():
            encoded = self.tokenizer(
                texts, padding=True, truncation=True, max_length=self.context_length, return_tensors="pt"
            ).to(self.device)
            hidden = self.loaded.model(**encoded).last_hidden_state.float()
            mask = encoded["attention_mask"]
            if options.pooling == "mean":
                weights = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
            elif options.pooling == "cls":
                pooled = hidden[:, 0]
            elif self.tokenizer.padding_side == "left":
                pooled = hidden[:, -1]
            else:  # the last real token of each row
                pooled = hidden[torch.arange(hidden.shape[0]), mask.sum(1) - 1]
            if options.normalize:
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.cpu().numpy().astype(np.float32, copy=False), int(mask.sum())


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The tokens that end a generation: the generation config's, else the tokenizer's."""
    found = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if found is None:
        found = getattr(model.config, "eos_token_id", None)
    if found is None:
        found = tokenizer.eos_token_id
    if found is None:
        return frozenset()
    return frozenset(found if isinstance(found, list) else [found])


def _decoded(item: Any) -> str:
    return (
        bytes(item).decode("utf-8", errors="replace") if isinstance(item, (bytes, bytearray)) else str(item)
    )


def _text_input(inp: Any) -> str:
    items = np.asarray(inp.data, dtype=object).reshape(-1)
    if items.size != 1:
        raise InvalidInput(f"{inp.name} must hold one prompt, got {items.size}")
    return _decoded(items[0])


def _json_input(inp: Any) -> Any:
    try:
        return orjson.loads(_text_input(inp))
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"{inp.name} must be JSON: {exc}") from None
