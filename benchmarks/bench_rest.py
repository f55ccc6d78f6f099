"""REST infer throughput of the echo model against a bare Starlette endpoint, start-up time and idle memory.

    python3 benchmarks/bench_rest.py [--seconds 5] [--connections 16]

Both servers run as separate processes on 127.0.0.1 with uvicorn, httptools and uvloop, and are
loaded by the same client in one run, in alternating rounds (so that a change in the machine's
load falls on both alike). The bare endpoint parses the same JSON with orjson and answers the same
JSON document. Printed: throughput over all rounds, the median of the per-round ratios, and each
server's CPU time per request (read from /proc), the steadier figure on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.loadgen import compare, echo_body, echo_options, median_ratio  # noqa: E402
from tests.servers import start_server  # noqa: E402

BARE_APP = textwrap.dedent(
    """
    import socket, sys, uuid
    import orjson, uvicorn, uvloop
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def infer(request):
        body = orjson.loads(await request.body())
        outputs = [
            {"name": i["name"], "datatype": i["datatype"], "shape": i["shape"], "data": i["data"]}
            for i in body["inputs"]
        ]
        doc = {"model_name": request.path_params["m"], "model_version": "1", "id": body.get("id") or str(uuid.uuid4()),
               "outputs": outputs}
        return Response(orjson.dumps(doc), media_type="application/json")

    app = Starlette(routes=[Route("/v2/models/{m}/infer", infer, methods=["POST"])])
    sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(2048)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_config=None, access_log=False, http="httptools", loop="uvloop", lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
    """
)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    echo_options(parser)
    args = parser.parse_args()
    body = echo_body(args.elements)
    examples = ROOT / "examples" / "models"

    starts = []
    for _ in range(3):
        began = time.perf_counter()
        probe = start_server(examples)
        starts.append(time.perf_counter() - began)
        probe.stop()
    print(f"start to ready (median of 3): {statistics.median(starts):.2f} s  (target 1 s)")

    server = start_server(examples)
    bare = subprocess.Popen([sys.executable, "-c", BARE_APP], stdout=subprocess.PIPE, text=True)
    try:
        assert bare.stdout is not None
        bare_port = int(bare.stdout.readline())
        port = int(server.http_address.rsplit(":", 1)[1])
        idle = rss_mib(server.process.pid)
        print(f"idle resident memory: {idle:.1f} MiB  (target 80 MiB)")
        compared = compare(
            {"mlserver-like": (port, server.process.pid), "bare starlette": (bare_port, bare.pid)}, body, args
        )
        ours, theirs = compared["mlserver-like"], compared["bare starlette"]
        print(
            f"ratio mlserver-like / bare: throughput {ours.throughput / theirs.throughput:.2f} over all rounds, "
            f"{median_ratio(ours, theirs):.2f} median of rounds; CPU per request {theirs.cpu / ours.cpu:.2f}"
            "  (target >= 0.6)"
        )
    finally:
        server.stop()
        os.kill(bare.pid, signal.SIGTERM)
        bare.wait()


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
