"""``decode_args``: write ``predict`` with typed arguments instead of an InferenceRequest."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from functools import wraps
from typing import Any, get_type_hints

from runtime.codecs.lookup import find_input_codec
from runtime.errors import InvalidInput
from runtime.types import InferenceRequest, InferenceResponse, ResponseOutput


def decode_args(
    predict: Callable[..., Any],
) -> Callable[[Any, InferenceRequest], Coroutine[Any, Any, InferenceResponse]]:
    """Decode each input into the argument of the same name, by its type hint, and encode the result.

    ``np.ndarray`` arguments use NumpyCodec, ``list[str]`` StringCodec, ``list[bytes]`` Base64Codec.
    The return value (or each item of a returned tuple) is encoded by its type hint or its value;
    outputs are named after the request's requested outputs, else ``output-0``, ``output-1``…
    """
    hints = get_type_hints(predict)
    signature = inspect.signature(predict)
    params = [p for p in signature.parameters.values() if p.name != "self"]
    arg_codecs = {}
    for param in params:
        codec = find_input_codec(type_hint=hints.get(param.name))
        if codec is None:
            raise TypeError(
                f"decode_args: no codec for argument {param.name!r} of type {hints.get(param.name)!r}"
            )
        arg_codecs[param.name] = codec
    return_hint = hints.get("return")

    @wraps(predict)
    async def _predict(self: Any, payload: InferenceRequest) -> InferenceResponse:
        by_name = {inp.name: inp for inp in payload.inputs}
        kwargs: dict[str, Any] = {}
        for param in params:
            inp = by_name.get(param.name)
            if inp is None:
                if param.default is inspect.Parameter.empty:
                    raise InvalidInput(f"Missing input {param.name!r} (the model expects {list(arg_codecs)})")
                continue
            kwargs[param.name] = arg_codecs[param.name].decode_input(inp)
        result = predict(self, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        values = result if isinstance(result, tuple) else (result,)
        names = [out.name for out in payload.outputs or []]
        outputs: list[ResponseOutput] = []
        for idx, value in enumerate(values):
            name = names[idx] if idx < len(names) else f"output-{idx}"
            codec = find_input_codec(type_hint=return_hint) if not isinstance(result, tuple) else None
            codec = codec or find_input_codec(payload=value)
            if codec is None:
                raise TypeError(f"decode_args: no codec can encode a {type(value).__name__}")
            outputs.append(codec.encode_output(name, value))
        return InferenceResponse(model_name=self.name, model_version=self.version, outputs=outputs)

    return _predict
