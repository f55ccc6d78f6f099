"""A small character-level text generator that streams its tokens (one character each).

At load it trains a tiny torch language model on ``corpus.txt`` (beside this file): the last
``context`` characters, embedded, through one hidden layer, predict the next character or the end
of a paragraph (the end-of-sequence token). Training runs a few hundred steps with a fixed seed, so
nothing is downloaded and every load makes the same model; it takes a second or two on a CPU.

It is served with continuous batching (``"continuous_batching": true`` in its settings, at most
``max_batch_size`` streams at a time): every running stream advances by one character per step, all
of them in one forward pass (``start_stream``, ``step``, ``combine``: the ``runtime.ContinuousModel``
API). Every response carries ``batch_size``, the number of streams that shared its step. Without
``continuous_batching`` the same class streams each request alone, with the same code on a batch of
one: ``predict`` answers with the whole text at once (``/infer``, ``/generate``), ``predict_stream``
with one response per character (``/infer_stream``, ``/generate_stream``, gRPC ``ModelStreamInfer``).

Input ``text_input`` (BYTES, one prompt), output ``text_output`` (BYTES). Request parameters, as in
the generate extension: ``max_tokens`` (default from ``parameters.extra.max_tokens``),
``temperature`` (0 = greedy; default 1), ``top_p`` (default 1), ``stop`` (strings that end the
text; the stop string is part of the output), ``seed`` (sampling seed; default 0, so the same request
always gets the same text), ``details`` (per-token details) and ``ignore_eos`` (go on after the
end-of-sequence token until ``max_tokens``, for benchmarks). The last response carries the
``finish_reason`` parameter: ``length``, ``eos_token`` or ``stop_sequence``.

The network's size is set by ``parameters.extra``: ``hidden`` (width, default 256) and ``layers``
(hidden layers, default 1); the benchmark builds a larger one. Every forward pass runs on the
model's own worker thread, off the event loop. A client that goes away stops its stream between
two steps: the step under way finishes and nothing more is computed for it.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from runtime import ContinuousModel, StepResult, Stream
from runtime.errors import InvalidInput
from runtime.types import InferenceRequest, InferenceResponse, Parameters, ResponseOutput

MAX_TOKENS_LIMIT = 1024


class CharMLP(nn.Module):
    """Next-character model: embeddings of the last ``context`` characters -> tanh layers -> logits."""

    def __init__(
        self, vocabulary: int, context: int, embedding: int = 24, hidden: int = 256, layers: int = 1
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, embedding)
        widths = [context * embedding] + [hidden] * layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.out = nn.Linear(hidden, vocabulary)

    def forward(self, contexts: torch.Tensor) -> torch.Tensor:
        x = self.embed(contexts).flatten(1)
        for layer in self.hidden:
            x = torch.tanh(layer(x))
        return self.out(x)


@dataclass
class Options:
    """The generation parameters of one request, checked."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int = 0
    details: bool = False
    ignore_eos: bool = False


@dataclass
class Token:
    id: int
    text: str
    logprob: float
    special: bool


@dataclass
class Generation:
    """One request's generation: its options, the characters so far and its sampling generator."""

    options: Options
    history: list[int]
    generator: torch.Generator
    text: str = ""
    count: int = 0
    tokens: list[Token] = field(default_factory=list)
    """Every token, kept only when details are asked for (a unary answer lists them)."""


class TextGenerator(ContinuousModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        folder = self.settings.folder or Path(__file__).parent
        text = (folder / extra.get("corpus", "corpus.txt")).read_text(encoding="utf-8")
        self.context = int(extra.get("context", 12))
        self.default_max_tokens = int(extra.get("max_tokens", 64))
        steps, seed = int(extra.get("steps", 300)), int(extra.get("seed", 0))
        self.shape = int(extra.get("hidden", 256)), int(extra.get("layers", 1))
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
        hidden, layers = self.shape
        self.net = CharMLP(self.eos + 1, self.context, hidden=hidden, layers=layers)
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
                ignore_eos=bool(given.get("ignore_eos", False)),
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

    def _generation(self, payload: InferenceRequest) -> Generation:
        """A request's generation, ready for its first step (raises InvalidInput for a bad request)."""
        options = self._options(payload)
        space = self.index.get(" ", 0)
        prompt = " ".join(self._prompt(payload).split())
        history = [self.eos] * self.context + [self.index.get(c, space) for c in prompt]
        return Generation(options, history, torch.Generator().manual_seed(options.seed))

    @torch.inference_mode()
    def _decode(self, generations: list[Generation]) -> list[Token]:
        """The next character of every generation, in one forward pass: runs on the worker thread."""
        contexts = torch.tensor([g.history[-self.context :] for g in generations])
        logits = self.net(contexts)
        logprobs = torch.log_softmax(logits, dim=-1)
        greedy = torch.argmax(logprobs, dim=-1).tolist()
        choices = []
        for row, g in enumerate(generations):
            options = g.options
            if options.temperature == 0:
                choices.append(greedy[row])
                continue
            probs = torch.softmax(logits[row] / options.temperature, dim=-1)
            if options.top_p < 1:
                ordered, order = torch.sort(probs, descending=True)
                keep = torch.cumsum(ordered, 0) - ordered < options.top_p
                probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
            choices.append(int(torch.multinomial(probs, 1, generator=g.generator)))
        chosen = logprobs[torch.arange(len(choices)), torch.tensor(choices)].tolist()
        tokens = []
        for g, choice, logprob in zip(generations, choices, chosen, strict=True):
            g.history.append(choice)
            special = choice == self.eos
            tokens.append(
                Token(id=choice, text="" if special else self.chars[choice], logprob=logprob, special=special)
            )
        return tokens

    @staticmethod
    def _advance(g: Generation, token: Token) -> str | None:
        """Add a token to its generation; why it stops now (``finish_reason``), or None."""
        g.count += 1
        g.text += token.text
        if g.options.details:
            g.tokens.append(token)
        if token.special and not g.options.ignore_eos:
            return "eos_token"
        if any(g.text.endswith(stop) for stop in g.options.stop):
            return "stop_sequence"
        return "length" if g.count >= g.options.max_tokens else None

    def _chunk(self, g: Generation, token: Token, finish: str | None) -> InferenceResponse:
        parameters: dict[str, Any] = {}
        if finish is not None:
            parameters["finish_reason"] = finish
        if g.options.details:
            parameters["details"] = {"token": _token_details(token)}
        return self._response(token.text, parameters)

    def _answer(self, g: Generation, finish: str | None) -> InferenceResponse:
        """The whole text at once (a unary request)."""
        parameters: dict[str, Any] = {"finish_reason": finish}
        if g.options.details:
            parameters["details"] = {
                "finish_reason": finish,
                "logprobs": [_token_details(t) for t in g.tokens],
            }
        return self._response(g.text, parameters)

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

    # ------------------------------------------------------------------ continuous batching

    async def start_stream(self, stream: Stream) -> None:
        stream.state = self._generation(stream.request)

    async def step(self, streams: list[Stream]) -> list[StepResult]:
        generations = [stream.state for stream in streams]
        loop = asyncio.get_running_loop()
        tokens = await loop.run_in_executor(self.executor, self._decode, generations)
        results = []
        for g, token in zip(generations, tokens, strict=True):
            finish = self._advance(g, token)
            results.append(StepResult(self._chunk(g, token, finish), finished=finish is not None))
        return results

    def combine(self, stream: Stream, chunks: list[InferenceResponse]) -> InferenceResponse:
        g: Generation = stream.state
        last = chunks[-1].parameters.model_extra if chunks and chunks[-1].parameters else None
        return self._answer(g, (last or {}).get("finish_reason"))

    # ------------------------------------------------------------------ each request alone

    async def _alone(self, payload: InferenceRequest) -> AsyncIterator[tuple[Generation, Token, str | None]]:
        """Each token of one request, computed alone (a batch of one), with why it stopped on the last."""
        g = self._generation(payload)
        loop = asyncio.get_running_loop()
        while True:
            (token,) = await loop.run_in_executor(self.executor, self._decode, [g])
            finish = self._advance(g, token)
            yield g, token, finish
            if finish is not None:
                return

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        async for g, _, finish in self._alone(payload):
            if finish is not None:
                return self._answer(g, finish)
        raise AssertionError("a generation always ends with a finish reason")

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for payload in payloads:
            async for g, token, finish in self._alone(payload):
                yield self._chunk(g, token, finish)


def _token_details(token: Token) -> dict[str, Any]:
    logprob = token.logprob if math.isfinite(token.logprob) else -1e9
    return {"id": token.id, "text": token.text, "logprob": logprob, "special": token.special}
