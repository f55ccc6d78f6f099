"""The connection between the server and a worker (``runtime.workers.connection``): messages read
back whatever sizes the socket hands them in, big tensors read straight into their own memory,
and requests and responses rebuilt equal, between messages of every other kind."""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.types import Datatype, InferenceRequest, InferenceResponse, Parameters, RequestInput
from runtime.workers.connection import decode
from runtime.workers.wire import encode


def test_the_wire_format_round_trips_arrays_in_any_chunking() -> None:
    """Messages read back whatever sizes the socket hands them in (the parser's staging buffer,
    big buffers read straight into their own memory, heads split across reads)."""
    from runtime.workers.connection import Connection

    arrays: list[Any] = [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.zeros(0, dtype=np.int64),
        np.arange(10_000, dtype=np.float64),  # out of band (80 KB), read straight into its memory
        np.arange(10)[::2],  # not contiguous
        np.array([b"ab", b"c"], dtype=object),
        np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]),
    ]
    wire = b"".join(bytes(piece) for i, a in enumerate(arrays) for piece in encode(("x", i, a)))
    for chunk in (1, 7, 4096, 1 << 20):
        got: list[Any] = []
        connection = Connection(got.append, lambda: None)
        at = 0
        while at < len(wire):
            buffer = connection.get_buffer(-1)
            n = min(len(buffer), chunk, len(wire) - at)
            buffer[:n] = wire[at : at + n]
            connection.buffer_updated(n)
            at += n
        assert [m[1] for m in got] == list(range(len(arrays)))
        for (_, _, back), sent in zip(got, arrays, strict=True):
            assert isinstance(back, np.ndarray)
            assert back.dtype == sent.dtype and back.shape == sent.shape and back.flags.writeable
            assert np.array_equal(back, sent)


def test_requests_and_responses_with_big_tensors_and_other_messages_cross_in_one_stream() -> None:
    """A request or response whose tensor travels out of band is rebuilt whole, between messages
    of every other kind (a list of requests, as sequence steps travel, and plain values)."""
    from runtime.types import ResponseOutput

    big = np.arange(20_000, dtype=np.float32)  # 80 KB: out of band
    req = InferenceRequest(id="a", inputs=[RequestInput(name="x", shape=[20_000], datatype="FP32", data=big)])
    resp = InferenceResponse(
        model_name="m", outputs=[ResponseOutput(name="y", shape=[2], datatype="FP32", data=big[:2].copy())]
    )
    sent: list[Any] = [
        ("call", 1, req),
        ("ok", 2, resp),
        ("seq", 3, [("s", True, False, req)]),
        ("ack", 4, 16),
        ("ok", 5, InferenceResponse(model_name="m", outputs=[])),
    ]
    back = decode(b"".join(bytes(piece) for message in sent for piece in encode(message)))
    assert [(kind, ident) for kind, ident, _ in back] == [(kind, ident) for kind, ident, _ in sent]
    assert type(back[0][2]) is InferenceRequest and np.array_equal(back[0][2].inputs[0].data, big)
    assert type(back[1][2]) is InferenceResponse and back[1][2].outputs[0].data.tolist() == [0.0, 1.0]
    step = back[2][2][0]
    assert step[:3] == ("s", True, False) and np.array_equal(step[3].inputs[0].data, big)
    assert back[3][2] == 16 and back[4][2] == InferenceResponse(model_name="m", outputs=[])


class CustomRequest(InferenceRequest):
    """A subclass: pickled as pydantic pickles it."""


def test_requests_and_responses_cross_as_flat_fields_and_come_back_equal() -> None:
    """Requests and responses travel as their fields (no pydantic pickles): every field, the
    parameters' extra keys, list and object data, requested outputs and subclasses come back."""
    from runtime.types import RequestOutput, ResponseOutput

    request_ = InferenceRequest(
        id="r1",
        parameters=Parameters(content_type="np", headers={"h": "1"}, sequence_id="s", n=3),
        inputs=[
            RequestInput(name="a", shape=[2, 2], datatype="FP32", data=np.ones((2, 2), np.float32)),
            RequestInput(name="b", shape=[2], datatype="BYTES", data=np.array([b"x", b"yz"], dtype=object)),
            RequestInput(name="c", shape=[3], datatype="INT64", data=[1, 2, 3], parameters=Parameters(k=1)),
        ],
        outputs=[RequestOutput(name="a", parameters=Parameters(binary_data=True))],
    )
    response = InferenceResponse(
        model_name="m",
        model_version="2",
        id="r1",
        parameters=Parameters(sequence_end=True),
        outputs=[ResponseOutput(name="a", shape=[0], datatype="FP64", data=np.zeros(0))],
    )
    for message in (request_, response, CustomRequest(inputs=[])):
        pieces = encode(("x", 1, message))
        assert len(pieces) == 1
        assert (b"pydantic" in bytes(pieces[0])) == (type(message) is CustomRequest)
        back = decode(bytes(pieces[0]))[0][2]
        assert type(back) is type(message)
        assert back.model_dump(exclude={"inputs", "outputs"}) == message.model_dump(
            exclude={"inputs", "outputs"}
        )
    back = decode(bytes(encode(("x", 1, request_))[0]))[0][2]
    assert back.parameters.model_extra == {"sequence_id": "s", "n": 3}
    assert back.parameters.headers == {"h": "1"} and back.inputs[0].datatype is Datatype.FP32
    assert back.inputs[0].data.shape == (2, 2) and back.inputs[0].data.flags.writeable
    assert list(back.inputs[1].data) == [b"x", b"yz"] and back.inputs[2].data == [1, 2, 3]
    assert back.inputs[2].parameters.model_extra == {"k": 1}
    assert back.outputs is not None and back.outputs[0].parameters.model_extra == {"binary_data": True}
    # a set field can still be set (the rebuilt models keep pydantic's bookkeeping)
    back.id = "other"
    assert back.id == "other" and "id" in back.model_fields_set
