"""A small character-level text generator that streams its tokens (one character each).

At load it trains a tiny torch language model on ``corpus.txt`` (beside this file): the last
``context`` characters, embedded, through one hidden layer, predict the next character or the end
of a paragraph (the end-of-sequence token). Training runs a few hundred steps with a fixed seed, so
nothing is downloaded and every load makes the same model; it takes a second or two on a CPU.

- ``predict`` answers a request with the whole text at once (``/infer``, ``/generate``);
- ``predict_stream`` answers with one response per character (``/infer_stream``,
  ``/generate_stream``, gRPC ``ModelStreamInfer``).

Input ``text_input`` (BYTES, one prompt), output ``text_output`` (BYTES). Request parameters, as in
the generate extension: ``max_tokens`` (default from ``parameters.extra.max_tokens``),
``temperature`` (0 = greedy; default 1), ``top_p`` (default 1), ``stop`` (strings that end the
text; the stop string is part of the output), ``seed`` (sampling seed; default 0, so the same request
always gets the same text) and ``details`` (per-token details). The last response carries the
``finish_reason`` parameter: ``length``, ``eos_token`` or ``stop_sequence``.

Each step runs on the model's own worker thread, off the event loop. A client that goes away
stops the generator between two steps: the step under way (a fraction of a millisecond) finishes
and nothing more is computed.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from runtime import MLModel
from runtime.errors import InvalidInput
from runtime.types import InferenceRequest, InferenceResponse, Parameters, ResponseOutput

MAX_TOKENS_LIMIT = 1024


class CharMLP(nn.Module):
    """Next-character model: embeddings of the last ``context`` characters -> tanh layer -> logits."""

    def __init__(self, vocabulary: int, context: int, embedding: int = 24, hidden: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, embedding)
        self.hidden = nn.Linear(context * embedding, hidden)
        self.out = nn.Linear(hidden, vocabulary)

    def forward(self, contexts: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(self.embed(contexts).flatten(1))))


@dataclass
class Options:
    """The generation parameters of one request, checked."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int = 0
    details: bool = False


@dataclass
class Token:
    id: int
    text: str
    logprob: float
    special: bool


class TextGenerator(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        folder = self.settings.folder or Path(__file__).parent
        text = (folder / extra.get("corpus", "corpus.txt")).read_text(encoding="utf-8")
        self.context = int(extra.get("context", 12))
        self.default_max_tokens = int(extra.get("max_tokens", 64))
        steps, seed = int(extra.get("steps", 300)), int(extra.get("seed", 0))
        # one worker thread runs every torch call of this model, with its own intra-op thread count:
        # a model this small is slower with more threads, above all on a busy machine
        process_default = torch.get_num_threads()
        self.executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix=f"model-{self.name}",
            initializer=torch.set_num_threads,
            initargs=(int(extra.get("threads", 1)),),
        )
        await asyncio.get_running_loop().run_in_executor(self.executor, self._train, text, steps, seed)
        torch.set_num_threads(process_default)  # it also set the default of threads started later
        return True

    async def unload(self) -> bool:
        await asyncio.to_thread(self.executor.shutdown, wait=True)
        return True

    # ------------------------------------------------------------------ training (at load)

    def _train(self, text: str, steps: int, seed: int) -> None:
        paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
        self.chars = sorted(set("".join(paragraphs)))
        self.eos = len(self.chars)
        self.index = {c: i for i, c in enumerate(self.chars)}
        ids: list[int] = []
        for paragraph in paragraphs:
            ids += [self.index[c] for c in paragraph] + [self.eos]
        targets = torch.tensor(ids)
        padded = torch.cat([torch.full((self.context,), self.eos), targets])
        contexts = padded.unfold(0, self.context, 1)[: len(targets)]  # the characters before each target

        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        self.net = CharMLP(self.eos + 1, self.context)
        optimiser = torch.optim.Adam(self.net.parameters(), lr=3e-3)
        for _ in range(steps):
            batch = torch.randint(0, len(targets), (128,), generator=generator)
            loss = nn.functional.cross_entropy(self.net(contexts[batch]), targets[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        self.net.eval()
        self.final_loss = loss.item()

    # ------------------------------------------------------------------ generation

    def _options(self, payload: InferenceRequest) -> Options:
        given: dict[str, Any] = dict(payload.parameters.model_extra or {}) if payload.parameters else {}
        try:
            options = Options(
                max_tokens=int(given.get("max_tokens", self.default_max_tokens)),
                temperature=float(given.get("temperature", 1.0)),
                top_p=float(given.get("top_p", 1.0)),
                stop=[given["stop"]] if isinstance(given.get("stop"), str) else list(given.get("stop") or []),
                seed=int(given.get("seed", 0)),
                details=bool(given.get("details", False)),
            )
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"Bad generation parameter: {exc}") from None
        if not 1 <= options.max_tokens <= MAX_TOKENS_LIMIT:
            raise InvalidInput(f"max_tokens must be between 1 and {MAX_TOKENS_LIMIT}")
        if options.temperature < 0 or not 0 < options.top_p <= 1:
            raise InvalidInput("temperature must be >= 0 and top_p in (0, 1]")
        if not all(isinstance(s, str) and s for s in options.stop):
            raise InvalidInput("stop must be a list of non-empty strings")
        return options

    def _prompt(self, payload: InferenceRequest) -> str:
        inp = next((inp for inp in payload.inputs if inp.name == "text_input"), None)
        if inp is None:
            raise InvalidInput("The request needs a BYTES input named text_input")
        items = np.asarray(inp.data, dtype=object).reshape(-1)
        if items.size != 1:
            raise InvalidInput(f"text_input must hold one prompt, got {items.size}")
        item = items[0]
        return item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)

    def _start(self, prompt: str) -> list[int]:
        space = self.index.get(" ", 0)
        return [self.eos] * self.context + [self.index.get(c, space) for c in " ".join(prompt.split())]

    @torch.inference_mode()
    def _step(self, history: list[int], options: Options, generator: torch.Generator) -> Token:
        """One character: runs on the worker thread."""
        logits = self.net(torch.tensor([history[-self.context :]]))[0]
        logprobs = torch.log_softmax(logits, dim=-1)
        if options.temperature == 0:
            choice = int(torch.argmax(logprobs))
        else:
            probs = torch.softmax(logits / options.temperature, dim=-1)
            if options.top_p < 1:
                ordered, order = torch.sort(probs, descending=True)
                keep = torch.cumsum(ordered, 0) - ordered < options.top_p
                probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
            choice = int(torch.multinomial(probs, 1, generator=generator))
        history.append(choice)
        special = choice == self.eos
        text = "" if special else self.chars[choice]
        return Token(id=choice, text=text, logprob=float(logprobs[choice]), special=special)

    async def _tokens(self, payload: InferenceRequest) -> AsyncIterator[tuple[Token, str | None]]:
        """Each token with, on the last one, why generation stopped."""
        options = self._options(payload)
        history = self._start(self._prompt(payload))
        generator = torch.Generator().manual_seed(options.seed)
        loop = asyncio.get_running_loop()
        text = ""
        for count in range(1, options.max_tokens + 1):
            token = await loop.run_in_executor(self.executor, self._step, history, options, generator)
            text += token.text
            if token.special:
                yield token, "eos_token"
                return
            if any(text.endswith(stop) for stop in options.stop):
                yield token, "stop_sequence"
                return
            yield token, "length" if count == options.max_tokens else None

    def _response(self, text: str, parameters: dict[str, Any]) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            parameters=Parameters(**parameters) if parameters else None,
            outputs=[
                ResponseOutput(
                    name="text_output",
                    shape=[1],
                    datatype="BYTES",
                    data=np.array([text.encode("utf-8")], dtype=object),
                )
            ],
        )

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        wants_details = self._options(payload).details
        pieces, tokens, finish = [], [], None
        async for token, reason in self._tokens(payload):
            pieces.append(token.text)
            tokens.append(_token_details(token))
            finish = reason
        parameters: dict[str, Any] = {"finish_reason": finish}
        if wants_details:
            parameters["details"] = {"finish_reason": finish, "logprobs": tokens}
        return self._response("".join(pieces), parameters)

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for payload in payloads:
            wants_details = self._options(payload).details
            async for token, finish in self._tokens(payload):
                parameters: dict[str, Any] = {}
                if finish is not None:
                    parameters["finish_reason"] = finish
                if wants_details:
                    parameters["details"] = {"token": _token_details(token)}
                yield self._response(token.text, parameters)


def _token_details(token: Token) -> dict[str, Any]:
    logprob = token.logprob if math.isfinite(token.logprob) else -1e9
    return {"id": token.id, "text": token.text, "logprob": logprob, "special": token.special}
