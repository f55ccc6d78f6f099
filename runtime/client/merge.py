"""Several V2 request bodies merged into one request along their first dimension, and its answer
split back per body, as MLServer's ``mlserver infer --batch-size`` does (``BatchedRequests``).

Bodies merge when they have the same inputs (names, datatypes, and shapes past the first
dimension), the same request parameters and the same requested outputs; their ``data`` are
concatenated (flattened, row-major, as the protocol lays tensors out). Each output of the answer
must then have as many rows as the merged inputs: rows are handed back to the bodies in order,
each body's answer keeping its own ``id``. Plain JSON values throughout: this module knows the
protocol's JSON, not the server.
"""

from __future__ import annotations

from collections.abc import Iterator
from math import prod
from typing import Any

Body = dict[str, Any]


def flat(data: Any) -> list[Any]:
    """A tensor's ``data`` flattened row-major (the protocol allows nested or flat lists)."""
    if not isinstance(data, list):
        return [data]
    if not any(isinstance(item, list) for item in data):
        return data
    out: list[Any] = []
    for item in data:
        out.extend(flat(item))
    return out


def _signature(body: Body) -> Any:
    """What must be equal for bodies to merge (None: this body cannot merge with another)."""
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        return None
    heads = []
    for tensor in inputs:
        shape = tensor.get("shape") if isinstance(tensor, dict) else None
        if not isinstance(shape, list) or not shape or "data" not in tensor or tensor.get("parameters"):
            return None
        heads.append((tensor.get("name"), tensor.get("datatype"), tuple(shape[1:])))
    return (tuple(heads), repr(body.get("parameters")), repr(body.get("outputs")))


def mergeable(first: Body, other: Body) -> bool:
    """Whether ``other`` can join a merged request that ``first`` started."""
    signature = _signature(first)
    return signature is not None and signature == _signature(other)


def merge(bodies: list[Body]) -> Body:
    """One request of ``bodies`` (``mergeable`` with the first, each), their rows concatenated."""
    if len(bodies) == 1:
        return bodies[0]
    first = bodies[0]
    inputs = []
    for i, tensor in enumerate(first["inputs"]):
        rows = sum(int(body["inputs"][i]["shape"][0]) for body in bodies)
        data: list[Any] = []
        for body in bodies:
            data.extend(flat(body["inputs"][i]["data"]))
        inputs.append({**tensor, "shape": [rows, *tensor["shape"][1:]], "data": data})
    merged: Body = {"inputs": inputs}
    for key in ("parameters", "outputs"):
        if key in first:
            merged[key] = first[key]
    return merged


def rows_of(body: Body) -> int:
    """The rows (first dimension) of a mergeable body's inputs."""
    return int(body["inputs"][0]["shape"][0])


def split(answer: Body, bodies: list[Body]) -> Iterator[Body]:
    """The answer of each of ``bodies`` out of the ``answer`` to their merged request. Raises
    ValueError when an output does not have one row per merged row."""
    if len(bodies) == 1:
        yield answer
        return
    counts = [rows_of(body) for body in bodies]
    total = sum(counts)
    outputs = answer.get("outputs") or []
    cut: list[tuple[dict[str, Any], list[Any], int]] = []
    for output in outputs:
        shape = output.get("shape") or []
        if not shape or shape[0] != total:
            raise ValueError(
                f"output {output.get('name')!r} of shape {shape} does not have one row per merged row "
                f"({total}): it cannot be split back per line"
            )
        cut.append((output, flat(output.get("data", [])), prod(shape[1:])))
    start = 0
    for body, count in zip(bodies, counts, strict=True):
        own: Body = {k: v for k, v in answer.items() if k not in ("outputs", "id")}
        if "id" in body:
            own["id"] = body["id"]
        own["outputs"] = [
            {
                **output,
                "shape": [count, *output["shape"][1:]],
                "data": data[start * size : (start + count) * size],
            }
            for output, data, size in cut
        ]
        start += count
        yield own
