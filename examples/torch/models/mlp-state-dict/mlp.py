"""A small classifier: 4 features -> 32 hidden units -> 3 classes, returning logits and probabilities."""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, features: int = 4, hidden: int = 32, classes: int = 3) -> None:
        super().__init__()
        self.hidden = nn.Linear(features, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.out(torch.relu(self.hidden(x)))
        return {"logits": logits, "probabilities": torch.softmax(logits, dim=-1)}
