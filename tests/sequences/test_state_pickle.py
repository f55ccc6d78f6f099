"""``runtime.sequences.state_pickle``: states and answers as bytes for a store that replicas share."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np

from runtime.sequences.state_pickle import dumps


def test_a_state_comes_back_equal_numpy_arrays_included() -> None:
    hidden = np.arange(12, dtype=np.float32).reshape(3, 4)
    back = pickle.loads(dumps({"step": 3, "hidden": hidden, "text": "abc"}))
    assert back["step"] == 3 and back["text"] == "abc"
    assert back["hidden"].dtype == np.float32 and np.array_equal(back["hidden"], hidden)


def test_a_cpu_tensor_travels_as_its_bytes_and_comes_back_a_tensor() -> None:
    """Once torch is imported, a CPU tensor is pickled through numpy (no torch.save archive)."""
    code = (
        "import pickle, torch\n"
        "from runtime.sequences.state_pickle import dumps\n"
        "t = torch.arange(6, dtype=torch.float32).reshape(2, 3)\n"
        "blob = dumps({'t': t})\n"
        "assert b'torch._utils' not in blob, 'pickled through torch.save'\n"
        "back = pickle.loads(blob)['t']\n"
        "assert isinstance(back, torch.Tensor) and torch.equal(back, t)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_torch_is_not_imported_to_pickle_a_state() -> None:
    code = (
        "import sys\n"
        "from runtime.sequences.state_pickle import dumps\n"
        "dumps({'a': [1, 2]})\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
