"""The model API for stateful sequences: ``SequenceModel.predict_sequences`` and ``sequence_ended``.

With ``"sequence_batching": true`` in model-settings.json the server calls ``predict_sequences``
with a batch of steps, at most one per sequence, each carrying its request, its sequence id, its
start/end flags and its state. The model reads ``step.state`` (None on a START), answers each step
and puts the sequence's new state in ``step.state``; the server keeps it until the next request of
that sequence. When a sequence ends, for whatever reason, the server calls ``sequence_ended`` once
with the last state, so the model can free what it holds for it.

A minimal running sum (TorchServe's stateful example)::

    class Counter(SequenceModel):
        async def predict_sequences(self, steps):
            responses = []
            for step in steps:
                x = int(step.request.inputs[0].data.reshape(-1)[0])
                step.state = (step.state or 0) + x
                if x == 0:
                    step.end_sequence()          # 0 ends the sequence, as in TorchServe's example
                responses.append(self.encode_response(np.array([step.state])))
            return responses
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from runtime.errors import InvalidInput
from runtime.model import MLModel
from runtime.types import InferenceRequest, InferenceResponse

EndReason = Literal["end", "idle", "timeout", "cancel", "eviction", "unload", "restart", "worker_lost"]
"""Why a sequence ended:

- ``end``: a request with ``sequence_end`` was served, or the model called ``step.end_sequence()``;
- ``idle``: nothing came for ``max_sequence_idle_ms``;
- ``timeout``: the sequence outlived ``sequence_timeout_ms`` (accepted requests were served first);
- ``cancel``: a caller gave up on one of its requests (its queued requests are cancelled too);
- ``eviction``: the state store dropped its state to make room for another;
- ``unload``: the model is being unloaded (or the server stops);
- ``restart``: a new START with the same id replaced it (after its queued requests ran);
- ``worker_lost``: the worker process holding its state died (``workers`` >= 1); its next
  request is refused, saying so.
"""

END_REASONS: tuple[EndReason, ...] = (
    "end",
    "idle",
    "timeout",
    "cancel",
    "eviction",
    "unload",
    "restart",
    "worker_lost",
)


class SequenceFlags:
    """A request's place in its sequence, as a model sees it: whether it starts or ends the sequence,
    and the model's own way to end it (``end_sequence``). A sequence batcher's ``SequenceStep`` and a
    continuous batcher's ``StreamSequence`` are both this view; each sets ``start``, ``end`` and
    ``_end`` (False) in its own ``__init__``."""

    __slots__ = ("_end", "end", "start")

    start: bool
    """True on the request that started the sequence (its state was None)."""
    end: bool
    """True on the request that ends the sequence (the client sent ``sequence_end``)."""
    _end: bool

    def end_sequence(self) -> None:
        """End the sequence with this request (after its step, or once its stream has finished), as if
        the request had ``sequence_end``."""
        self._end = True

    @property
    def ends(self) -> bool:
        """Whether the sequence ends with this request (the client's flag or the model's call)."""
        return self.end or self._end

    def _flags(self) -> str:
        flags = "".join(flag for flag, on in (("S", self.start), ("E", self.ends)) if on)
        return " " + flags if flags else ""


class SequenceStep(SequenceFlags):
    """One request of one sequence, as the model sees it in a batch."""

    __slots__ = ("request", "sequence_id", "state")

    def __init__(
        self, request: InferenceRequest, sequence_id: str, start: bool, end: bool, state: Any
    ) -> None:
        self.request = request
        """The request, with every input's data already a numpy array."""
        self.sequence_id = sequence_id
        """The sequence's key: the id as text (``42`` and ``"42"`` are the same sequence)."""
        self.start = start
        """True on the first request of the sequence (its state is None)."""
        self.end = end
        """True on the last request of the sequence (the client sent ``sequence_end``)."""
        self.state = state
        """The sequence's state: read it, and assign the new one. None on a START."""
        self._end = False

    def __repr__(self) -> str:
        return f"SequenceStep({self.sequence_id!r}{self._flags()})"


class SequenceModel(MLModel):
    """Base class of stateful models served with ``"sequence_batching": true``.

    ``predict`` is optional: a model that implements it also answers requests that belong to no
    sequence; one that does not answers them 400.
    """

    async def predict_sequences(
        self, steps: list[SequenceStep]
    ) -> Sequence[InferenceResponse | BaseException]:
        """Answer one step per sequence; return one response (or exception) per step, in order.

        Set ``step.state`` to the sequence's new state. Returning an exception for a step fails only
        that request, and its state is not kept (the previous one stays). Raising fails the whole
        batch. CPU-heavy work belongs in a thread (``asyncio.to_thread``), off the event loop.
        """
        raise NotImplementedError(f"{type(self).__qualname__} must implement predict_sequences")

    async def sequence_ended(self, sequence_id: str, reason: EndReason, state: Any) -> None:
        """Called once when a sequence the model has seen ends, with the reason and its last state."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        raise InvalidInput(
            f"Model {self.name!r} serves only sequences: send sequence_start=true (and a sequence_id) "
            "to start one, or the sequence_id of an open one"
        )


def serves_stateless(model: MLModel) -> bool:
    """Whether a sequence model also answers requests outside any sequence (it implements predict)."""
    return type(model).predict is not SequenceModel.predict
