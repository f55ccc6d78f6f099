"""A TorchServe function handler: answers each request with what it got, as JSON."""

import json
from typing import Any


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[str] | None:
    if data is None:  # TorchServe calls handle(None, ctx) once at load
        return None
    answers = []
    for idx, row in enumerate(data):
        seen: dict[str, Any] = {}
        for key, value in row.items():
            if isinstance(value, (bytes, bytearray)):
                seen[key] = {"bytes": value.decode("utf-8", "replace")}
            else:
                seen[key] = value
        status = context.get_request_header(idx, "x-status")
        if status:
            context.set_response_status(int(status), "Custom", idx)
            context.set_response_header(idx, "x-handler", "echo")
        context.set_response_content_type(idx, "application/json")
        answers.append(
            json.dumps(
                {
                    "data": seen,
                    "request_id": context.get_request_id(idx),
                    "batch": len(data),
                    "headers": {
                        k: v for k, v in context.get_all_request_header(idx).items() if k.startswith("x-")
                    },
                    "yaml": context.model_yaml_config,
                    "model_dir_set": bool(context.system_properties.get("model_dir")),
                    "manifest_handler": context.manifest["model"]["handler"],
                    "url_path": context.get_request_header(idx, "url_path"),
                }
            )
        )
    return answers
