"""The model API for continuous batching: ``ContinuousModel.step`` advances every running stream at once.

With ``"continuous_batching": true`` in model-settings.json, the server keeps a running set of at
most ``max_batch_size`` streams (one per streaming request) and calls the model's ``step`` with
all of them, again and again: each call produces the next chunk of every stream it was given.
A stream that finishes leaves the set after its last chunk, a new one joins at the next step, and
a stream whose client went away leaves before the next step. This is how LLM servers schedule
token generation (vLLM, TGI) and what TorchServe calls continuous batching.

The model implements, all called from one task (the model never sees two calls at once):

- ``start_stream(stream)`` (optional) as a stream joins, before its first step: read the request,
  check it (raise ``InvalidInput`` to refuse it: the client gets a 400 and nothing was streamed)
  and put the stream's own state in ``stream.state``. Keep it light: heavy prompt processing
  belongs in the stream's first step (``stream.steps == 0``), where it is batched with the rest.
- ``step(streams)``: one ``StepResult`` per stream, in order: the chunk to send (an
  ``InferenceResponse``, or None for nothing this step), whether the stream is finished, or the
  error that ends this stream alone. A ``step`` written ``def`` runs on a worker thread of its own,
  off the event loop (torch and numpy release the GIL while they compute); one written
  ``async def`` is awaited on the event loop and must move heavy work off it itself.
- ``end_stream(stream, reason)`` (optional) once a started stream has left the running set, for
  whatever reason (``StreamEnd``): free what it holds.
- ``combine(stream, chunks)`` (optional) for a unary request (``/infer``, ``/generate``, gRPC
  ``ModelInfer``): it runs in the batch like a stream, and its answer is its chunks combined. The
  default answers a single chunk as it is and otherwise stacks each output along its first axis.

A character-level generator, in short (``examples/streaming/textgen`` is the full one)::

    class Generator(ContinuousModel):
        async def start_stream(self, stream):
            stream.state = Generation(prompt_ids(stream.request), max_tokens(stream.request))

        @torch.inference_mode()
        def step(self, streams):                       # runs on the step thread
            contexts = torch.stack([s.state.context() for s in streams])
            tokens = self.net(contexts).argmax(-1).tolist()
            results = []
            for stream, token in zip(streams, tokens):
                stream.state.append(token)
                done = token == EOS or len(stream.state) == stream.state.max_tokens
                results.append(StepResult(self.text_response(token), finished=done))
            return results

If ``step`` raises, the server cannot tell which stream was at fault: it runs each stream of that
step again alone, so that only the streams that fail alone end with the error and the others go
on. A step that raised must therefore have left every stream's state as it was (or report the
failure of one stream with ``StepResult(error=...)``, which never touches the others).

**With sequences** (``"sequence_batching": true`` as well): a request of a sequence runs as a
stream like any other, and ``stream.sequence`` says which sequence it belongs to, with that
request's ``start``/``end`` flags and the sequence's ``state``, which every stream of the sequence
shares (None on a START; the server keeps it between requests, in the sequence state store). A new
request of a sequence joins the running set while an earlier one of the same sequence is still
streaming, so a "cancel" or "update" request reaches the model during the stream: within a step,
the streams of one sequence come in their arrival order. ``sequence_ended`` is called once when a
sequence ends, for whatever reason, once none of its streams runs. Streams outside any sequence
(``stream.sequence`` is None) are served too; a model that wants none refuses them in
``start_stream``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from runtime.errors import ModelFailed
from runtime.model import MLModel
from runtime.sequences.sequence_model import EndReason, SequenceFlags
from runtime.tensors import output_array
from runtime.types import InferenceRequest, InferenceResponse, ResponseOutput

StreamEnd = Literal["finished", "failed", "cancelled", "unload"]
"""Why a stream left the running set:

- ``finished``: the model returned its last chunk (``StepResult(finished=True)``);
- ``failed``: its step failed (``StepResult(error=...)``, or ``step`` raised for it alone);
- ``cancelled``: its client went away or cancelled the request;
- ``unload``: the batcher was stopped by force (its task cancelled) before the stream finished;
  a normal unload or shutdown lets streams finish, or cuts them as their clients go (``cancelled``).
"""


class SequenceState:
    """The state of one sequence, shared by its running streams (the server loads and keeps it)."""

    __slots__ = ("state",)

    def __init__(self, state: Any = None) -> None:
        self.state = state


class StreamSequence(SequenceFlags):
    """The sequence a stream belongs to (``stream.sequence``), as its request said."""

    __slots__ = ("_shared", "id")

    def __init__(self, sequence_id: str, start: bool, end: bool, shared: SequenceState) -> None:
        self.id = sequence_id
        """The sequence's key: the id as text (``42`` and ``"42"`` are the same sequence)."""
        self.start = start
        """This request started the sequence (its state was None when it joined)."""
        self.end = end
        """This request ends the sequence (the client sent ``sequence_end``)."""
        self._shared = shared
        self._end = False

    @property
    def state(self) -> Any:
        """The sequence's state, shared by all its streams: read it, and assign the new one."""
        return self._shared.state

    @state.setter
    def state(self, value: Any) -> None:
        self._shared.state = value

    def __repr__(self) -> str:
        return f"StreamSequence({self.id!r}{self._flags()})"


class Stream:
    """One running stream, as the model sees it in ``start_stream``, ``step`` and ``end_stream``."""

    __slots__ = ("arrived", "id", "request", "sequence", "state", "steps")

    def __init__(self, request: InferenceRequest, stream_id: str) -> None:
        self.arrived = time.monotonic()
        """When the request was taken, before it waited to join (``time.monotonic``): a language
        model measures its time to first token from here."""
        self.request = request
        """The request that started the stream, with every input's data already a numpy array."""
        self.id = stream_id
        """The request's id (every chunk is answered with it)."""
        self.state: Any = None
        """The model's own state for this stream: set it in ``start_stream``, read and replace it in ``step``."""
        self.steps = 0
        """How many steps the stream has taken before this one (0 in its first step)."""
        self.sequence: StreamSequence | None = None
        """The sequence of the stream's request (with ``sequence_batching``), or None."""

    def __repr__(self) -> str:
        return f"Stream({self.id!r}, steps={self.steps})"


@dataclass(slots=True)
class StepResult:
    """What one step produced for one stream.

    ``StepResult(chunk)``: a chunk, and the stream goes on; ``StepResult(chunk, finished=True)``: its
    last chunk; ``StepResult(finished=True)``: it ends without another chunk; ``StepResult()``:
    nothing this step (e.g. still reading a long prompt); ``StepResult(error=exc)``: this stream
    ends with that error (``InvalidInput`` for a client error), the others go on.
    """

    response: InferenceResponse | None = None
    finished: bool = False
    error: BaseException | None = None


class ContinuousModel(MLModel):
    """Base class of models served with ``"continuous_batching": true``; see the module docstring."""

    async def start_stream(self, stream: Stream) -> None:
        """Check the stream's request and set ``stream.state`` (called as it joins, before its first step)."""

    def step(self, streams: list[Stream]) -> Sequence[StepResult]:
        """Advance every stream by one step; one ``StepResult`` per stream, in order.

        May be ``def`` (run on the model's step thread) or ``async def`` (awaited on the event loop).
        """
        raise NotImplementedError(f"{type(self).__qualname__} must implement step")

    async def end_stream(self, stream: Stream, reason: StreamEnd) -> None:
        """Called once when a started stream leaves the running set; free what it holds."""

    def combine(self, stream: Stream, chunks: list[InferenceResponse]) -> InferenceResponse:
        """The answer to a unary request, from the chunks its stream produced (see the module docstring)."""
        return stack_chunks(self.name, chunks)

    async def sequence_ended(self, sequence_id: str, reason: EndReason, state: Any) -> None:
        """With sequences: called once when a sequence ends, with the reason and its last state."""


def stack_chunks(model: str, chunks: list[InferenceResponse]) -> InferenceResponse:
    """One response whose outputs are the chunks' outputs stacked along the first axis (parameters
    of the last chunk); a single chunk is returned as it is."""
    if len(chunks) == 1:
        return chunks[0]
    if not chunks:
        raise ModelFailed(f"Model {model!r} finished a unary request without producing any chunk")
    first = chunks[0]
    outputs = []
    for index, out in enumerate(first.outputs):
        pieces = []
        for chunk in chunks:
            if len(chunk.outputs) != len(first.outputs) or chunk.outputs[index].name != out.name:
                raise ModelFailed(
                    f"Model {model!r} streamed chunks with different outputs; it must implement combine"
                )
            piece = chunk.outputs[index]
            pieces.append(output_array(piece).reshape(piece.shape or [1]))
        data = np.concatenate(pieces)
        outputs.append(
            ResponseOutput(name=out.name, shape=list(data.shape), datatype=out.datatype, data=data)
        )
    last = chunks[-1]
    return InferenceResponse(
        model_name=last.model_name,
        model_version=last.model_version,
        id=last.id,
        parameters=last.parameters,
        outputs=outputs,
    )
