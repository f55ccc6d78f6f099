"""A small token decoder for generation: an embedding, an LSTM and a linear head.

``forward`` reads tokens ``[batch, steps]`` from the state ``h0``, ``c0`` ([batch, layers,
hidden]) and returns the most likely next token of each row ``[batch, 1]``, its logits, and the
state after the last token read. Fed its own ``next_token`` step after step, it generates; a whole
prompt can be read in one call. ``examples/torch/build.py`` trains it (a few hundred steps, fixed
seed) to count: after the prompt ``3 4`` it goes on ``5 6 ... 15`` and then ``0``, its end token.
"""

import torch
from torch import nn


class Decoder(nn.Module):
    def __init__(self, vocabulary: int = 16, embedding: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, embedding)
        self.lstm = nn.LSTM(embedding, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocabulary)

    def read(
        self, tokens: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The logits after every token, and the state after the last one."""
        state = (h0.transpose(0, 1).contiguous(), c0.transpose(0, 1).contiguous())
        y, (h, c) = self.lstm(self.embed(tokens), state)
        return self.head(y), h.transpose(0, 1), c.transpose(0, 1)

    def forward(
        self, tokens: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        logits, h, c = self.read(tokens, h0, c0)
        last = logits[:, -1]
        return last.argmax(-1, keepdim=True), last, h, c
