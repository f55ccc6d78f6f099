"""No batching: each request goes straight to the model."""

from __future__ import annotations

from collections.abc import AsyncIterator

from ..types import InferenceRequest, InferenceResponse
from .base import Scheduler


class DirectScheduler(Scheduler):
    """Calls ``predict`` for each request and ``predict_stream`` for each stream, as they come."""

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        return await self.model.predict(request)

    def stream(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        return self.model.predict_stream(requests)
