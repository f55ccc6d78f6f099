"""torch stays out of the server unless a model uses the PyTorch runtime.

Checked in a fresh interpreter, since this test session imports torch for the runtime's own tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.conftest import EXAMPLES, ROOT

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys

    import numpy as np

    def torch_modules():
        return sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))

    found = {}
    import runtime, runtime.cli, runtime.server.serving
    found["import runtime"] = torch_modules()

    import runtime.torch
    from runtime.torch import TorchSettings
    TorchSettings(device="cpu")
    found["runtime.torch settings"] = torch_modules()

    from runtime.server.serving import Server
    from runtime.settings import Settings
    from runtime.types import InferenceRequest, RequestInput

    async def serve():
        server = Server(Settings(model_repository_root=sys.argv[1], http_port=0, grpc_port=0,
                                 metrics_port=0, management_port=0))
        await server.start()
        request = InferenceRequest(inputs=[RequestInput(
            name="x", shape=[1, 4], datatype="FP32", data=[1.0, 2.0, 3.0, 4.0])])
        response = await server.dataplane.infer(request, "scaler")
        assert response.outputs[0].shape == [1, 4]
        await server.stop()

    asyncio.run(serve())
    found["server with numpy models"] = torch_modules()
    print(json.dumps(found))
    """
)


def test_torch_is_not_imported_by_the_core_or_numpy_models() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(EXAMPLES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"import runtime": [], "runtime.torch settings": [], "server with numpy models": []}
