"""The model API: subclass ``MLModel`` and implement ``load`` and ``predict`` (and/or ``predict_stream``).

It follows MLServer's ``MLModel`` so that a model written for MLServer runs here once its
``mlserver`` imports read ``runtime``. The server never replaces or patches these methods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

from runtime.codecs import (
    InputCodec,
    RequestCodec,
    decode_inference_request,
    find_input_codec,
    find_request_codec,
    input_codec,
)
from runtime.errors import InvalidInput
from runtime.settings import ModelSettings
from runtime.types import (
    InferenceRequest,
    InferenceResponse,
    MetadataModelResponse,
    MetadataTensor,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
)


class MLModel:
    """Base class of every model the server serves."""

    default_outputs_all: ClassVar[bool] = True
    """Whether a request that names no outputs is answered with every output the model has. The
    adaptive batcher then merges it with requests that name some; a model whose default is fewer
    outputs (scikit-learn's is ``predict`` alone) sets False, and such requests batch apart."""

    def __init__(self, settings: ModelSettings) -> None:
        self._settings = settings
        self._inputs_index = {tensor.name: tensor for tensor in settings.inputs}
        self.ready = False

    # ------------------------------------------------------------------ identity

    @property
    def name(self) -> str:
        return self._settings.name

    @property
    def version(self) -> str | None:
        return self._settings.version

    @property
    def settings(self) -> ModelSettings:
        return self._settings

    @property
    def inputs(self) -> list[MetadataTensor]:
        return self._settings.inputs

    @inputs.setter
    def inputs(self, value: list[MetadataTensor]) -> None:
        self._settings.inputs = value
        self._inputs_index = {tensor.name: tensor for tensor in value}

    @property
    def outputs(self) -> list[MetadataTensor]:
        return self._settings.outputs

    @outputs.setter
    def outputs(self, value: list[MetadataTensor]) -> None:
        self._settings.outputs = value

    # ------------------------------------------------------------------ lifecycle

    async def load(self) -> bool:
        """Load the model's artefacts. Return False (or raise) if it cannot serve."""
        return True

    async def unload(self) -> bool:
        """Free what ``load`` took. Called once when the model is unloaded or the server stops."""
        return True

    async def metadata(self) -> MetadataModelResponse:
        parameters = None
        if self._settings.parameters and self._settings.parameters.content_type:
            parameters = Parameters(content_type=self._settings.parameters.content_type)
        return MetadataModelResponse(
            name=self.name,
            versions=list(self._settings.versions),
            platform=self._settings.platform,
            inputs=list(self._settings.inputs),
            outputs=list(self._settings.outputs),
            parameters=parameters,
        )

    # ------------------------------------------------------------------ inference

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        """Answer one request (unary). Models that only stream need not implement it."""
        raise InvalidInput(f"Model {self.name!r} does not implement predict; use its streaming endpoints")

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        """Answer a stream of requests with a stream of responses.

        The default answers each request with ``predict``, in order, so a unary model also
        serves streaming endpoints. Override it to stream (unary→stream, stream→stream).
        """
        async for payload in payloads:
            yield await self.predict(payload)

    # ------------------------------------------------------------------ codec helpers

    def decode(self, request_input: RequestInput, default_codec: type[InputCodec] | None = None) -> Any:
        """Decode one input by its content type (its own, the model's metadata, or ``default_codec``)."""
        codec = self._input_codec(request_input, default_codec)
        return codec.decode_input(request_input) if codec else request_input

    def decode_request(
        self, inference_request: InferenceRequest, default_codec: type[RequestCodec] | None = None
    ) -> Any:
        """Decode a whole request by its content type, the model's, or ``default_codec``; each
        input keeps its own content type (``runtime.codecs.content_types`` has the rules)."""
        model_content_type = self._settings.parameters.content_type if self._settings.parameters else None
        return decode_inference_request(
            inference_request, model_content_type, self._inputs_index, default_codec
        )

    def encode_response(
        self, payload: Any, default_codec: type[RequestCodec] | None = None
    ) -> InferenceResponse:
        """Encode a Python value as a whole response (e.g. a numpy array as one output)."""
        codec = default_codec or find_request_codec(payload=payload)
        if codec is None:
            raise TypeError(f"No request codec can encode a {type(payload).__name__}")
        return codec.encode_response(self.name, payload, self.version)

    def encode(
        self,
        payload: Any,
        request_output: RequestOutput,
        default_codec: type[InputCodec] | None = None,
    ) -> ResponseOutput:
        """Encode a Python value as the output that ``request_output`` asked for."""
        content_type = request_output.parameters.content_type if request_output.parameters else None
        codec = find_input_codec(content_type=content_type) if content_type else None
        codec = codec or default_codec or find_input_codec(payload=payload)
        if codec is None:
            raise TypeError(f"No codec can encode a {type(payload).__name__}")
        return codec.encode_output(request_output.name, payload)

    def _input_codec(
        self, request_input: RequestInput, default_codec: type[InputCodec] | None
    ) -> type[InputCodec] | None:
        return input_codec(request_input, self._inputs_index, default_codec)
