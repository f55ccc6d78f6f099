"""A TorchServe class handler that streams: three intermediate answers, then the last one."""

from typing import Any

from ts.handler_utils.utils import send_intermediate_predict_response
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import PredictionException


class StreamHandler(BaseHandler):  # type: ignore[misc]
    def initialize(self, context: Any) -> None:
        self.context = context
        self.initialized = True

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[str]:
        text = data[0].get("body") or data[0].get("data")
        if isinstance(text, (bytes, bytearray)):
            text = text.decode()
        if text == "fail":
            raise RuntimeError("the handler failed")
        if text == "teapot":
            raise PredictionException("I am a teapot", 418)
        for i in range(3):
            send_intermediate_predict_response(
                [f"{text}-{i} "], context.request_ids, "Intermediate", 200, context
            )
        return [f"{text}-done"]
