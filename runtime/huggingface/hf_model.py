"""The Hugging Face runtime's model: text generation on the continuous batcher, and embeddings.

``"implementation": "runtime.huggingface.HuggingFaceModel"`` (or MLServer's
``mlserver_huggingface.HuggingFaceRuntime``) with ``parameters.extra.task``:

- ``text-generation``: served with continuous batching whatever the settings say (MLServer's
  settings do not have the key), at most ``max_batch_size`` streams at a time (16 when the
  settings leave it unset); the rest wait in order. The streams joining at a step are prefilled
  together, in one padded forward call; every step is then one forward call over all the
  decoding streams (:mod:`.kv_cache`), and a stream that finishes, is stopped or whose client
  goes away frees its cache at once, so that a waiting one takes its place at the next step.
  The request: a BYTES ``text_input`` (one prompt; the generate extension's input), or INT64
  ``input_ids`` (the prompt's tokens), or a BYTES ``messages`` (the chat messages as JSON,
  rendered by the chat template); the parameters of :mod:`.options`. Each chunk's BYTES
  ``text_output`` is the new text only (the prompt is not repeated, unless ``echo``); the last
  chunk carries ``finish_reason`` (``length``, ``eos_token`` or ``stop_sequence``),
  ``prompt_tokens`` and ``completion_tokens``; with ``logprobs``, every chunk carries its tokens'
  ``logprobs``; with ``return_token_ids``, their ``token_ids``. A unary request (``infer``,
  ``generate``) is answered with the whole text.
- ``feature-extraction``: ``infer`` with a BYTES ``text_input`` of N texts answers an FP32
  ``embedding`` [N, hidden size]: the last hidden state pooled per text (``pooling``: the mean
  over its tokens by default), and ``prompt_tokens`` (the tokens read) as a parameter.

torch and transformers are imported when such a model is loaded, never by the server's start.
All model calls run on one thread of the model's own, off the event loop.

This module is the model's life (load, the streams' steps, unload); a stream's state and what
each token gives it are :mod:`.hf_generation`, the prompt's reading :mod:`.hf_prompt`, the
embeddings :mod:`.hf_embeddings`.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from runtime.continuous import ContinuousModel, StepResult, Stream, StreamEnd
from runtime.errors import InvalidInput
from runtime.huggingface.hf_embeddings import embed, embeddings_response, texts_of
from runtime.huggingface.hf_generation import (
    Generation,
    Produced,
    banned,
    ending,
    eos_ids,
    max_tokens_of,
    start,
    take,
)
from runtime.huggingface.hf_prompt import prompt_of
from runtime.huggingface.hf_settings import DEFAULT_STREAMS, HuggingFaceConfig, read_config
from runtime.huggingface.options import read_options
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
            self.eos = eos_ids(loaded.model, self.tokenizer)
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
        prompt, prompt_text = prompt_of(request, self.tokenizer, self.name, self.settings.generate.text_input)
        if not prompt:
            raise InvalidInput("The prompt is empty: it has no tokens")
        max_tokens = max_tokens_of(options, len(prompt), self.context_length, self.config.options.max_tokens)
        stream.state = start(options, prompt, prompt_text, max_tokens, self.tokenizer, self.device)

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
        """One token for every stream, in one forward call (plus one prefill call for those
        joining): runs on the model's thread."""
        import torch

        from runtime.huggingface.sampling import choose

        with torch.inference_mode():
            rows: list[Any] = [None] * len(generations)
            joining = [i for i, g in enumerate(generations) if g.sequence.length == 0]
            decoding = [i for i, g in enumerate(generations) if g.sequence.length != 0]
            if joining:
                logits = self.cache.prefill(
                    [generations[i].sequence for i in joining], [generations[i].prompt for i in joining]
                )
                for j, i in enumerate(joining):
                    rows[i] = logits[j]
            if decoding:
                logits = self.cache.decode(
                    [generations[i].sequence for i in decoding], [generations[i].last for i in decoding]
                )
                for j, i in enumerate(decoding):
                    rows[i] = logits[j]
            banned_tokens = [banned(g, self.eos) for g in generations]
            choices = choose(
                torch.stack(rows),
                [g.options for g in generations],
                [g.generator for g in generations],
                banned_tokens,
            )
        return [take(g, c, self.eos, self.tokenizer) for g, c in zip(generations, choices, strict=True)]

    def _chunk(self, g: Generation, out: Produced) -> InferenceResponse:
        parameters: dict[str, Any] = {}
        if out.logprobs is not None:
            parameters["logprobs"] = out.logprobs
        if out.finish is not None:
            parameters.update(ending(g))
        return self._response(out.piece, parameters)

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
        parameters = ending(g)
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
        texts = texts_of(payload, self.settings.generate.text_input, self.name)
        vectors, tokens = await self._run(
            embed,
            self.loaded.model,
            self.tokenizer,
            self.device,
            self.config.options,
            self.context_length,
            texts,
        )
        return embeddings_response(self.name, vectors, tokens)
