#!/usr/bin/env bash
# Stream tokens from the textgen example with curl (start the server first:
#   mlserver-like start examples/streaming).
# -N turns off curl's buffering so that each event prints as it arrives.
set -euo pipefail
URL=${URL:-http://127.0.0.1:8080}

# the generate extension, streamed: one {"text_output": ...} per data: event
curl -sN -X POST "$URL/v2/models/textgen/generate_stream" \
  -H 'Content-Type: application/json' \
  -d '{"text_input": "In the morning", "parameters": {"max_tokens": 60, "temperature": 0}}'

# the same, in one answer
curl -s -X POST "$URL/v2/models/textgen/generate" \
  -H 'Content-Type: application/json' \
  -d '{"text_input": "In the morning", "parameters": {"max_tokens": 60, "temperature": 0}}'
echo

# a tensor request streamed back as InferenceResponses (MLServer's infer_stream)
curl -sN -X POST "$URL/v2/models/textgen/infer_stream" \
  -H 'Content-Type: application/json' \
  -d '{"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["The keeper"]}],
       "parameters": {"max_tokens": 20, "temperature": 0}}'
