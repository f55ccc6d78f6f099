"""A small recurrent model: an LSTM over a window of steps and a linear head on every step.

Every tensor has the batch on its first dimension, the hidden state included (``h0``, ``c0``:
[batch, layers, hidden]), so that requests can be merged along it and the state returned by
one call (``h``, ``c``) can be fed to the next.
"""

import torch
from torch import nn


class LSTMModel(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 16, outputs: int = 4, layers: int = 1) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, outputs)

    def forward(
        self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        state = (h0.transpose(0, 1).contiguous(), c0.transpose(0, 1).contiguous())
        y, (h, c) = self.lstm(x, state)
        return self.head(y), h.transpose(0, 1), c.transpose(0, 1)
