"""What can go wrong while serving, as a small tree of meanings.

The core raises these; it never speaks of HTTP or gRPC codes. Each transport maps the tree to
its own codes through one table (``runtime/frontends/rest/status.py``, ``runtime/frontends/grpc/status_codes.py``)::

    ServerError
    ├── InvalidInput          the request is malformed or does not fit the model    400 / INVALID_ARGUMENT
    │   ├── SequenceError     unknown, ended or malformed sequence                  400 / INVALID_ARGUMENT
    │   │   └── SequenceNotOpen   an id never seen (or forgotten) without START
    │   ├── PayloadTooLarge   the body is over the configured limit                 413 / RESOURCE_EXHAUSTED
    │   ├── Conflict          (management) it exists already                        409 on the management API
    │   └── Forbidden         (management) not allowed: a URL, the default version  403 on the management API
    ├── ModelNotFound         no model (or version) of that name                    404 / NOT_FOUND
    ├── Unavailable           the server cannot take this work now                  503 / UNAVAILABLE
    │   ├── ModelNotReady     the model exists but is not ready (loading, failed)
    │   ├── Overloaded        a queue or a capacity limit is full
    │   ├── RequestTimeout    the request took longer than its timeout (running or queued)
    │   │   └── QueueTimeout  it waited in a queue for longer than its timeout
    │   ├── WorkerLost        the worker process serving it died
    │   └── ShuttingDown      the server is draining
    ├── Unauthenticated       the operation needs a key the request does not carry  401 / UNAUTHENTICATED
    ├── ModelFailed           the model raised; the cause is chained                500 / INTERNAL
    └── Cancelled             the caller went away or cancelled                     499 / CANCELLED

Messages quote client-given names through ``shown``, cut to ``NAME_SHOWN`` characters, so that an
absurd name cannot make an error too big to send (gRPC's status message travels in metadata).

A model may raise ``InvalidInput`` itself to tell the client that its request was at fault.
Anything else a model raises becomes ``ModelFailed`` (``model_failed``, the one place its message
is made), sorted at one place (``runtime.streams.pipeline.sort_error``). An exception that is none
of these reaches a transport only through a bug; each reports it as ``internal_error`` says.
"""

from __future__ import annotations

NAME_SHOWN = 200
"""Most characters of a client-given name quoted in an error message."""


def shown(name: str) -> str:
    """``name`` quoted for an error message, cut to ``NAME_SHOWN`` characters."""
    if len(name) <= NAME_SHOWN:
        return repr(name)
    return f"{name[:NAME_SHOWN]!r}… ({len(name)} characters)"


class ServerError(Exception):
    """The root of every error the server reports to a client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidInput(ServerError):
    """The request is malformed, or does not fit what the model accepts."""


class SequenceError(InvalidInput):
    """A sequence request names an unknown or ended sequence, or has malformed sequence parameters."""


class SequenceNotOpen(SequenceError):
    """A request without START names a sequence that is not open and did not end recently.

    TorchServe's front ends open such a sequence (TorchServe does); the others report it."""


class PayloadTooLarge(InvalidInput):
    """The request body is larger than the server accepts."""


class Conflict(InvalidInput):
    """A management request would create what exists already (a model version registered twice)."""


class Forbidden(InvalidInput):
    """A management request that is not allowed (a URL outside ``allowed_urls``, removing the
    default version while others remain)."""


class ModelNotFound(ServerError):
    """No model of that name, or no such version of it, is in the repository."""

    def __init__(self, name: str, version: str | None = None) -> None:
        if version:
            super().__init__(f"Model {shown(name)} with version {shown(version)} not found")
        else:
            super().__init__(f"Model {shown(name)} not found")
        self.name = name
        self.version = version


class Unavailable(ServerError):
    """The server cannot take this work now; trying again later may succeed."""


class ModelNotReady(Unavailable):
    """The model is known but not ready: it is loading, unloading, or failed to load."""


class Overloaded(Unavailable):
    """A bounded queue or a capacity limit is full."""


class RequestTimeout(Unavailable):
    """The request took longer than its timeout allowed (the model's ``request_timeout`` or the
    request's own OIP ``timeout`` parameter); its work was cancelled."""


class QueueTimeout(RequestTimeout):
    """The request waited in a queue for longer than its timeout allowed."""


class WorkerLost(Unavailable):
    """The worker process serving the request died (killed, crashed, out of memory) before it
    answered; the worker is restarted, and trying again may succeed."""


class ShuttingDown(Unavailable):
    """The server is draining and takes no new work."""


class SequenceElsewhere(Unavailable):
    """Another replica holds the sequence (its lease has not expired), or this one is handing its
    sequences over: try again later, possibly on another replica."""


class SequenceStepConflict(ServerError):
    """A request's ``sequence_step`` is not the sequence's next step (it is ahead of it, or older
    than the last applied one, whose answer alone is kept)."""

    def __init__(self, message: str, expected: int) -> None:
        super().__init__(message)
        self.expected = expected


class Unauthenticated(ServerError):
    """The operation needs a key (the management key) that the request does not carry."""


class ModelFailed(ServerError):
    """The model raised while serving the request; ``__cause__`` holds what it raised."""


class Cancelled(ServerError):
    """The caller cancelled the request or went away before it finished."""


def model_failed(model: str, exc: BaseException) -> ModelFailed:
    """What the exception ``exc`` a model raised becomes: "Model 'x' failed: Type: message",
    chained to ``exc``; the one place this message is made."""
    failed = ModelFailed(f"Model {model!r} failed: {type(exc).__name__}: {exc}")
    failed.__cause__ = exc
    return failed


def internal_error(exc: BaseException) -> str:
    """The message a transport answers an unexpected exception (a bug, none of the errors above)
    with: "Internal server error: Type: message"; the one place it is made."""
    return f"Internal server error: {type(exc).__name__}: {exc}"


__all__ = [
    "Cancelled",
    "Conflict",
    "Forbidden",
    "InvalidInput",
    "ModelFailed",
    "ModelNotFound",
    "ModelNotReady",
    "Overloaded",
    "PayloadTooLarge",
    "QueueTimeout",
    "RequestTimeout",
    "SequenceElsewhere",
    "SequenceError",
    "SequenceNotOpen",
    "SequenceStepConflict",
    "ServerError",
    "ShuttingDown",
    "Unauthenticated",
    "Unavailable",
    "WorkerLost",
    "internal_error",
    "model_failed",
    "shown",
]
