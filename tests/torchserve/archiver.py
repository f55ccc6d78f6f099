"""Run torch-model-archiver as a user would, safely beside other test processes.

The archiver stages each model in ``$TMPDIR/<model name>`` and deletes that folder when it is done, so two
processes archiving a model of the same name at once (the suite runs on several) would take each other's
staging folder away. Each run here gets a staging folder of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile


def run_model_archiver(*args: str) -> None:
    """``python -m model_archiver.model_packaging *args``; raises with the archiver's stderr if it fails."""
    with tempfile.TemporaryDirectory(prefix="archiver-") as staging:
        done = subprocess.run(
            [sys.executable, "-m", "model_archiver.model_packaging", *args],
            env={**os.environ, "TMPDIR": staging},
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise RuntimeError(f"torch-model-archiver failed ({done.returncode}):\n{done.stderr}")
