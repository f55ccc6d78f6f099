"""Run several sequences of the stateful counter at once over REST (TorchServe's stateful example).

    mlserver-like start examples/models            # in another shell
    python3 examples/clients/counter_client.py [http://127.0.0.1:8080]

Each sequence sends a few integers and then 0, which ends it; the server answers every request with
the running sum of its own sequence. One sequence uses TorchServe's headers
(``ts_request_sequence_id`` / ``ts_request_sequence_start``) instead of the OIP parameters.
"""

from __future__ import annotations

import asyncio
import sys

import httpx

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"
PATH = "/v2/models/counter/infer"


def tensor(value: int) -> dict:
    return {"inputs": [{"name": "input", "shape": [1], "datatype": "INT64", "data": [value]}]}


async def run(client: httpx.AsyncClient, name: str, values: list[int], headers: bool) -> str:
    sums = []
    for i, value in enumerate(values):
        body = tensor(value)
        if headers:
            extra = {"ts_request_sequence_id": name}
            if i == 0:
                extra["ts_request_sequence_start"] = "true"
            response = await client.post(PATH, json=body, headers=extra)
        else:
            body["parameters"] = {"sequence_id": name, "sequence_start": i == 0}
            response = await client.post(PATH, json=body)
        response.raise_for_status()
        document = response.json()
        sums.append(document["outputs"][0]["data"][0])
        ended = document["parameters"].get("sequence_end", False)
    after = await client.post(PATH, json={**tensor(1), "parameters": {"sequence_id": name}})
    return (
        f"{name}: {values} -> {sums} ended={ended}; afterwards: {after.status_code} {after.json()['error']}"
    )


async def main() -> None:
    plans = {"alpha": [1, 2, 3, 0], "beta": [10, 20, 0], "gamma": [5, 5, 5, 5, 0], "delta": [7, 0]}
    async with httpx.AsyncClient(base_url=URL, timeout=30) as client:
        lines = await asyncio.gather(
            *(run(client, name, values, headers=name == "delta") for name, values in plans.items())
        )
    print("\n".join(lines))


if __name__ == "__main__":
    asyncio.run(main())
