"""Build the example PyTorch models with fixed seeds and save them into their model folders.

    python3 examples/torch/build.py          # writes the artefacts into examples/torch/models/*/
    python3 examples/torch/build.py OUT      # copies the model folders to OUT and writes there
    mlserver-like start examples/torch/models

Two models, each saved three ways: a TorchScript file (``torch.jit.save``), a torch.export
program (``torch.export.save``, .pt2) and a state_dict (``torch.save(module.state_dict())``)
whose class lives beside it in the model folder. The same seed gives the same weights to all
three, so they answer a request identically. The artefacts are a few kilobytes each.
``lstm-sequence`` serves the LSTM's TorchScript file again with sequence batching: the server
keeps each sequence's hidden state (``h``, ``c``) and feeds it back as ``h0``, ``c0``.

A third model, a token decoder, is trained here (a couple of seconds, fixed seed) to count: after
the tokens ``3 4`` it generates ``5 6 ... 15`` and then ``0``, its end token. ``decoder-stream``
serves it with continuous batching (a TorchScript file): every stream is fed its own next token,
step after step, beside the others. ``decoder-chat`` serves its state_dict with continuous and
sequence batching: a sequence's next request goes on from the state its previous one left.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models"
SEED = 0
LSTM_STEPS = 5  # torch.export fixes an LSTM's number of steps; the batch stays dynamic
ARTEFACTS = ("*.pt", "*.pt2", "*.pth")


def _class(folder: str, module: str, name: str) -> type[nn.Module]:
    """A model class from its model folder (where the server finds it for the state_dict models)."""
    spec = importlib.util.spec_from_file_location(f"_examples_{module}", MODELS / folder / f"{module}.py")
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    cls: type[nn.Module] = getattr(loaded, name)
    return cls


def mlp() -> nn.Module:
    """The classifier, with the weights every MLP example serves."""
    torch.manual_seed(SEED)
    return _class("mlp-state-dict", "mlp", "MLP")(hidden=32).eval()


def lstm() -> nn.Module:
    """The recurrent model, with the weights every LSTM example serves."""
    torch.manual_seed(SEED)
    return _class("lstm-state-dict", "lstm", "LSTMModel")().eval()


def decoder() -> nn.Module:
    """The token decoder, trained to count up to 15 and then say 0 (its end token)."""
    torch.manual_seed(SEED)
    net = _class("decoder-chat", "decoder", "Decoder")()
    optimiser = torch.optim.Adam(net.parameters(), lr=0.03)
    vocabulary, hidden = net.head.out_features, net.lstm.hidden_size
    for _ in range(120):
        start = torch.randint(1, vocabulary, (64, 1))
        counts = start + torch.arange(12)
        counts = torch.where((counts >= vocabulary).cumsum(1) > 0, 0, counts)  # 0 ends, then stays
        zeros = torch.zeros(64, 1, hidden)
        logits, _, _ = net.read(counts[:, :-1], zeros, zeros)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocabulary), counts[:, 1:].reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return net.eval()


def mlp_inputs(batch: int = 2) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, 4),)


def lstm_inputs(batch: int = 2, steps: int = LSTM_STEPS) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, steps, 8), torch.zeros(batch, 1, 16), torch.zeros(batch, 1, 16))


def build(root: Path = MODELS) -> dict[str, Path]:
    """Write every artefact under ``root`` (which holds the model folders); return them by folder."""
    batch = torch.export.Dim("batch", min=1, max=65536)
    written = {
        "mlp-torchscript": root / "mlp-torchscript" / "mlp.pt",
        "mlp-export": root / "mlp-export" / "mlp.pt2",
        "mlp-state-dict": root / "mlp-state-dict" / "mlp.pth",
        "lstm-torchscript": root / "lstm-torchscript" / "lstm.pt",
        "lstm-export": root / "lstm-export" / "lstm.pt2",
        "lstm-state-dict": root / "lstm-state-dict" / "lstm.pth",
        "lstm-sequence": root / "lstm-sequence" / "lstm.pt",
        "decoder-stream": root / "decoder-stream" / "decoder.pt",
        "decoder-chat": root / "decoder-chat" / "decoder.pth",
    }
    with warnings.catch_warnings():
        # torch warns that TorchScript is deprecated (torch.export is its successor) and that
        # nn.LSTM keeps its flat weights as plain attributes while exporting; both are expected
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")
        warnings.filterwarnings("ignore", message=r"The tensor attributes self\.lstm\._flat_weights")

        torch.jit.save(torch.jit.script(mlp()), str(written["mlp-torchscript"]))
        program = torch.export.export(mlp(), mlp_inputs(), dynamic_shapes={"x": {0: batch}})
        torch.export.save(program, str(written["mlp-export"]))
        torch.save(mlp().state_dict(), written["mlp-state-dict"])

        torch.jit.save(torch.jit.script(lstm()), str(written["lstm-torchscript"]))
        torch.jit.save(
            torch.jit.script(lstm()), str(written["lstm-sequence"])
        )  # served with sequence batching
        dynamic = {"x": {0: batch}, "h0": {0: batch}, "c0": {0: batch}}
        program = torch.export.export(lstm(), lstm_inputs(), dynamic_shapes=dynamic)
        torch.export.save(program, str(written["lstm-export"]))
        torch.save(lstm().state_dict(), written["lstm-state-dict"])

        counter = decoder()
        torch.jit.save(torch.jit.script(counter), str(written["decoder-stream"]))
        torch.save(counter.state_dict(), written["decoder-chat"])
    return written


def copy_folders(out: Path) -> Path:
    """Copy the model folders (settings and classes, not artefacts) to ``out``."""
    shutil.copytree(MODELS, out, ignore=shutil.ignore_patterns(*ARTEFACTS, "__pycache__"), dirs_exist_ok=True)
    return out


def main(argv: list[str]) -> int:
    root = copy_folders(Path(argv[0])) if argv else MODELS
    for folder, path in build(root).items():
        print(f"{folder}: {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
