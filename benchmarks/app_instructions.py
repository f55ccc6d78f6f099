"""Instructions per REST infer request of the app alone, in process: no socket, no HTTP parser, no
uvicorn. A finer figure than ``--instructions`` for work on the REST hot path (runtime/rest, the
DataPlane, the checks), whose changes are a few percent of the whole server's count.

    python3 benchmarks/app_instructions.py [--requests 1000] [--kind json|binary|sequence|running-sum]
        [--baseline OTHER_CHECKOUT] [--bare]

Each side runs ``--drive`` under valgrind's callgrind: it loads the echo model into a server's
DataPlane (metrics on, as served), builds the REST app as the server does, and calls it with one
ASGI scope per request on an asyncio loop. Counting starts at a call of ``os.getppid`` and stops at
one of ``os.getpgrp`` (callgrind's ``--zero-before`` and ``--dump-before``), after 300 requests of
warm-up. ``--bare`` counts benchmarks/bare.py's Starlette echo app the same way (the ceiling of the
app's share). Only the main thread is counted. ``--kind running-sum`` serves the ``sequence`` row's
load instead: 128 running-sum sequences (benchmarks/models/running-sum) at once over the same app,
ids and START in TorchServe's headers; each step counts as a request (the batches' share included).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = "/root/.pyenv/versions/3.11.7/bin/python3"  # the interpreter itself (pyenv's shim is a script)
WARM_UP = 300
SEQUENCES = 128


def _request(kind: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    import numpy as np
    import orjson

    tensor: dict[str, Any] = {"name": "x", "shape": [1, 16], "datatype": "FP32"}
    headers = [(b"host", b"127.0.0.1:8080")]
    if kind == "binary":
        raw = np.arange(16, dtype=np.float32).tobytes()
        tensor["parameters"] = {"binary_data_size": len(raw)}
        head = orjson.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}})
        headers.append((b"inference-header-content-length", str(len(head)).encode()))
        body = head + raw
    elif kind == "running-sum":
        body = orjson.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [1]}]})
    else:
        body = orjson.dumps({"inputs": [{**tensor, "data": [0.5] * 16}]})
        if kind == "sequence":
            headers.append((b"ts_request_sequence_id", b"s-1"))
    headers.append((b"content-length", str(len(body)).encode()))
    return body, headers


async def _drive(requests: int, kind: str, bare: bool) -> None:
    from runtime.repository import read_repository
    from runtime.settings import Settings

    try:
        from runtime.server.rest_app import create_app
        from runtime.server.serving import Server
    except ImportError:  # a checkout from before the server's folder (--baseline)
        from runtime.rest.asgi import create_app  # type: ignore[import-not-found,no-redef]

        from runtime.server import Server  # type: ignore[no-redef,attr-defined]

    folder = tempfile.mkdtemp()
    model = "running-sum" if kind == "running-sum" else "echo"
    source = Path.cwd() / ("benchmarks" if kind == "running-sum" else "examples") / "models" / model
    shutil.copytree(source, Path(folder) / model)  # the checkout's
    settings = Settings(model_repository_root=folder, http_port=0, grpc_port=0, metrics_port=0)
    server = Server(settings)
    await server.load_models(read_repository(folder)[0])
    app: Any = server.observability.wrap_rest(create_app(server.dataplane))
    if bare:
        from benchmarks.bare import rest_app

        app = rest_app()
    body, headers = _request(kind)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": f"/v2/models/{model}/infer",
        "raw_path": f"/v2/models/{model}/infer".encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8080),
    }
    message = {"type": "http.request", "body": body, "more_body": False}
    statuses: list[int] = []

    async def receive() -> Any:
        return message

    async def send(sent: Any) -> None:
        if sent["type"] == "http.response.start":
            statuses.append(sent["status"])

    if kind == "running-sum":
        await _sequences(app, scope, headers, receive, send, requests)
    else:
        for _ in range(WARM_UP):
            await app(dict(scope), receive, send)
        os.getppid()  # callgrind: --zero-before=getppid
        for _ in range(requests):
            await app(dict(scope), receive, send)
        os.getpgrp()  # callgrind: --dump-before=getpgrp
    shutil.rmtree(folder)
    if set(statuses) != {200}:
        raise SystemExit(f"not every request was answered 200: {sorted(set(statuses))}")


async def _sequences(
    app: Any,
    scope: dict[str, Any],
    headers: list[tuple[bytes, bytes]],
    receive: Any,
    send: Any,
    requests: int,
) -> None:
    """``SEQUENCES`` running-sum sequences at once (the ``sequence`` row's load): each client sends
    its steps one after another with its id in TorchServe's header, the first with the START one."""
    started: set[int] = set()

    def scope_of(i: int) -> dict[str, Any]:
        own = [*headers, (b"ts_request_sequence_id", b"s%d" % i)]
        if i not in started:
            started.add(i)
            own.append((b"ts_request_sequence_start", b"true"))
        return {**scope, "headers": own}

    async def loops(total: int) -> None:
        left = [total]

        async def client(i: int) -> None:
            while left[0] > 0:
                left[0] -= 1
                await app(scope_of(i), receive, send)

        await asyncio.gather(*(client(i) for i in range(SEQUENCES)))

    await loops(WARM_UP * 10)
    os.getppid()  # callgrind: --zero-before=getppid
    await loops(requests)
    os.getpgrp()  # callgrind: --dump-before=getpgrp


def count(checkout: Path, requests: int, kind: str, bare: bool) -> float:
    """Instructions per request of ``checkout``'s app (or the bare one)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        command = [
            *("valgrind", "--tool=callgrind", "--separate-threads=yes"),
            *("--zero-before=getppid", "--dump-before=getpgrp", f"--callgrind-out-file={out}"),
            *(PYTHON, str(Path(__file__).resolve()), "--drive", str(requests), "--kind", kind),
            *(["--bare"] if bare else []),
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(checkout)}
        subprocess.run(command, cwd=checkout, env=env, check=True, capture_output=True)
        dump = Path(f"{out}.1-01")  # the first dump (at getpgrp), of the main thread
        total = max(
            int(line.split()[1])
            for line in dump.read_text().splitlines()
            if line.startswith(("totals:", "summary:"))
        )
    return total / requests


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--kind", choices=("json", "binary", "sequence", "running-sum"), default="json")
    parser.add_argument("--baseline", help="another checkout of this project, counted the same way")
    parser.add_argument("--bare", action="store_true", help="also count the bare Starlette echo app")
    parser.add_argument("--drive", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare and args.kind != "json":
        parser.error("the bare app answers JSON requests only (--kind json)")
    if args.drive is not None:  # the side that runs under callgrind, in its checkout (cwd, PYTHONPATH)
        asyncio.run(_drive(args.drive, args.kind, args.bare))
        return 0
    sides = {"this checkout": (ROOT, False)}
    if args.baseline:
        sides["before"] = (Path(args.baseline).resolve(), False)
    if args.bare:
        sides["bare Starlette"] = (ROOT, True)
    for label, (checkout, bare) in sides.items():
        figure = count(checkout, args.requests, args.kind, bare)
        print(f"{label:>15}, REST app in process ({args.kind}): {figure:9.0f} instructions per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
