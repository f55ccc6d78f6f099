"""Twelve models of 40 MiB each served by one server with room for three, through a real server
process: loaded on demand by 16 clients calling them in random order, the least recently used
idle one unloaded to make room."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx
import pytest

from tests.many_models import MIB, answer, body, metric, write_model
from tests.servers import start_server

MODELS = 12
CLIENTS = 16
CALLS = 4  # per client


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.mark.parametrize(
    ("flags", "room"),
    [
        (("--max-loaded-models", "3"), 3 * 40 * MIB),
        (("--models-memory-limit", str(150 * MIB)), 150 * MIB),
    ],
    ids=["max_loaded_models_3", "memory_limit_150MiB"],
)
def test_twelve_models_of_40_mib_in_the_room_of_three(
    tmp_path: Path, flags: tuple[str, str], room: int
) -> None:
    if not Path("/proc/self/status").exists():
        pytest.skip("resident memory is read from /proc, which this system lacks")
    for i in range(MODELS):
        write_model(tmp_path, f"m{i}", k=100 * i)
    server = start_server(tmp_path, "--no-load-models-at-startup", *flags)
    try:
        pid = server.process.pid
        with httpx.Client(base_url=server.http_url, timeout=60) as client:
            index = client.post("/v2/repository/index").json()
            assert sorted(item["name"] for item in index) == sorted(f"m{i}" for i in range(MODELS))
            assert {(item["state"], item.get("reason")) for item in index} == {("UNAVAILABLE", "not loaded")}
            assert client.get("/v2/health/ready").status_code == 200  # nothing to load at start
            own = _status_kib(pid, "VmRSS") * 1024  # the server's own, no model loaded

        async def one_client(seed: int, http: httpx.AsyncClient) -> int:
            rng = random.Random(seed)
            right = 0
            for _ in range(CALLS):
                i = rng.randrange(MODELS)
                x = rng.randrange(100)
                got = answer(await http.post(f"/v2/models/m{i}/infer", json=body(x)))
                assert got == x + 100 * i, f"model m{i} answered {got} to {x}"
                right += 1
            return right

        async def run() -> list[int]:
            async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as http:
                return await asyncio.gather(*(one_client(seed, http) for seed in range(CLIENTS)))

        assert sum(asyncio.run(run())) == CLIENTS * CALLS
        resident = _status_kib(pid, "VmRSS") * 1024
        peak = _status_kib(pid, "VmHWM") * 1024
        slack = 40 * MIB  # what serving 16 clients adds (buffers, allocator arenas), not models
        assert resident <= own + room + slack, (resident - own) / MIB
        # loads run one at a time: memory passes the limit by at most the model being loaded
        assert peak <= own + room + 40 * MIB + slack, (peak - own) / MIB
        scrape = httpx.get(server.metrics_url).text
        evicted = metric(scrape, "model_unloads_total", reason="evicted")
        loads = metric(scrape, "model_loads_total")
        loaded = metric(scrape, "models_loaded")
        assert evicted > 0
        assert loaded <= 3
        assert loads == evicted + loaded  # every load but the resident ones was evicted
        assert metric(scrape, "models_memory_bytes") <= room + 40 * MIB
    finally:
        assert server.stop() == 0
