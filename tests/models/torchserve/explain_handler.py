"""A TorchServe handler on ``BaseHandler`` with explanations: each row is a list of numbers
(``data[i]["data"]``, ``data[i]["body"]``, or the row itself under TorchServe's KServe envelope);
the prediction is their sum, the explanation each number's share of it (``get_insights``)."""

import json
from typing import Any

from ts.torch_handler.base_handler import BaseHandler


class SumHandler(BaseHandler):  # type: ignore[misc]
    def initialize(self, context: Any) -> None:
        # no serialized model to load: BaseHandler.initialize would want one
        self.context = context
        self.manifest = context.manifest
        self.initialized = True

    def preprocess(self, data: list[Any]) -> list[list[float]]:
        rows = []
        for row in data:
            value = (row.get("data") or row.get("body")) if isinstance(row, dict) else row
            if isinstance(value, bytes | bytearray | str):
                value = json.loads(value)
            rows.append([float(v) for v in value or ()])
        return rows

    def inference(self, data: list[list[float]], *args: Any, **kwargs: Any) -> list[float]:
        return [sum(row) for row in data]

    def postprocess(self, data: list[float]) -> list[dict[str, Any]]:
        return [{"sum": total, "batch": len(data)} for total in data]

    def get_insights(self, tensor_data: list[list[float]], raw_input: Any, target: Any) -> list[list[float]]:
        return [[v / sum(row) for v in row] for row in tensor_data]
