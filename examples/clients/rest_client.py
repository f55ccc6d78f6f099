"""Call the bundled example models over REST with httpx (start the server first:
``mlserver-like start examples/models``)."""

from __future__ import annotations

import sys

import httpx
import numpy as np

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"


def main() -> None:
    with httpx.Client(base_url=URL) as client:
        print("ready:", client.get("/v2/health/ready").status_code == 200)
        print("server:", client.get("/v2").json())

        x = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]], dtype=np.float32)
        request = {
            "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]
        }
        response = client.post("/v2/models/scaler/infer", json=request)
        response.raise_for_status()
        out = response.json()["outputs"][0]
        print("scaled:", np.asarray(out["data"], dtype=np.float32).reshape(out["shape"]))

        echo = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["hello", "world"]}]}
        print("echo:", client.post("/v2/models/echo/infer", json=echo).json()["outputs"])


if __name__ == "__main__":
    main()
