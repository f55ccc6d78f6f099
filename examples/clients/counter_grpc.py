"""Run several sequences of the stateful counter at once over gRPC, with tritonclient.

    mlserver-like start examples/models            # in another shell (gRPC on 127.0.0.1:8081)
    python3 examples/clients/counter_grpc.py [127.0.0.1:8081]

tritonclient's own sequence arguments (``sequence_id``, ``sequence_start``, ``sequence_end``) become
the OIP request parameters the server reads (``int64_param`` for an integer id, ``string_param``
for a string one, ``bool_param`` for the flags); every answer echoes the id in the same kind.
Each sequence sends a few integers and then 0, which ends it (TorchServe's stateful example).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

ADDRESS = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8081"


def run(client: grpcclient.InferenceServerClient, sequence: int | str, values: list[int]) -> str:
    sums = []
    for i, value in enumerate(values):
        x = grpcclient.InferInput("input", [1], "INT64")
        x.set_data_from_numpy(np.array([value], np.int64))
        result = client.infer("counter", [x], sequence_id=sequence, sequence_start=i == 0)
        sums.append(int(result.as_numpy("total")[0]))
    ended = result.get_response().parameters["sequence_end"].bool_param
    try:
        client.infer("counter", [x], sequence_id=sequence)
        after = "accepted?!"
    except InferenceServerException as exc:
        after = f"{exc.status()}: {exc.message()}"
    return f"{sequence!r}: {values} -> {sums} ended={ended}; afterwards: {after}"


def main() -> None:
    plans: dict[int | str, list[int]] = {
        1: [1, 2, 3, 0],
        2: [10, 20, 0],
        "three": [5, 5, 5, 5, 0],
        "four": [7, 0],
    }
    client = grpcclient.InferenceServerClient(ADDRESS)
    try:
        with ThreadPoolExecutor(len(plans)) as pool:
            lines = pool.map(lambda item: run(client, *item), plans.items())
            print("\n".join(lines))
    finally:
        client.close()


if __name__ == "__main__":
    main()
