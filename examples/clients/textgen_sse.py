"""Stream tokens from the textgen example with httpx-sse.

    mlserver-like start examples/streaming      # in another terminal
    python3 examples/clients/textgen_sse.py "The keeper" --max-tokens 80

Each Server-Sent Event carries one generate answer ({"text_output": ..., "model_name": ...});
an ``event: error`` ends the stream with {"error": ...}. Errors found before the stream starts
(unknown model, bad parameters) come back as an ordinary JSON error with a 4xx/5xx status.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

import httpx
from httpx_sse import connect_sse


class GenerateError(Exception):
    pass


def stream_text(url: str, prompt: str, model: str = "textgen", **parameters: Any) -> Iterator[str]:
    """The pieces of text the model streams for ``prompt``, as they arrive."""
    body = {"text_input": prompt, "parameters": parameters}
    with httpx.Client(base_url=url, timeout=httpx.Timeout(10.0, read=None)) as client:
        with connect_sse(client, "POST", f"/v2/models/{model}/generate_stream", json=body) as source:
            if source.response.status_code != 200:
                source.response.read()
                raise GenerateError(source.response.json()["error"])
            for event in source.iter_sse():
                if event.event == "error":
                    raise GenerateError(json.loads(event.data)["error"])
                yield event.json()["text_output"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("prompt")
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--max-tokens", type=int, default=80)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    sys.stdout.write(args.prompt)
    for piece in stream_text(args.url, args.prompt, max_tokens=args.max_tokens, temperature=args.temperature):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
