"""A streaming LSTM whose hidden state per sequence is carried between requests (torch).

Speech-like sizes: 80 input features per frame (log-mel), 2 LSTM layers of 512, 32 output classes
(e.g. characters for CTC). Each request of a sequence carries the next chunk of frames,
``frames: FP32 [T, 80]``, and gets ``logits: FP32 [T, 32]`` for them; the LSTM's (h, c) after the
chunk is the sequence's state, kept by the server until the next chunk. Requests of many sequences
share one batched LSTM call (chunks of equal length are stacked; other lengths run as their own
group), in one worker thread so that the event loop keeps serving; ``torch_threads`` in the
settings' ``extra`` sets that thread's intra-op thread count. The weights are random (seeded): the
example shows the serving, not a trained model.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import nn

from runtime import SequenceModel, SequenceStep
from runtime.codecs import NumpyCodec
from runtime.errors import InvalidInput
from runtime.types import InferenceResponse


class Net(nn.Module):
    def __init__(self, features: int, hidden: int, layers: int, classes: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(
        self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        out, new_state = self.lstm(x, state)
        return self.head(out), new_state


class StreamingLSTM(SequenceModel):
    async def load(self) -> bool:
        extra: dict[str, Any] = self.settings.parameters.extra if self.settings.parameters else {}
        self.features = int(extra.get("features", 80))
        self.hidden = int(extra.get("hidden", 512))
        self.layers = int(extra.get("layers", 2))
        self.classes = int(extra.get("classes", 32))
        torch.manual_seed(int(extra.get("seed", 0)))
        self.net = Net(self.features, self.hidden, self.layers, self.classes).eval()
        # one worker thread runs every torch call, with its own intra-op thread count (a thread
        # count set elsewhere does not carry over to other threads)
        threads = int(extra.get("torch_threads", torch.get_num_threads()))
        self.executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix=f"model-{self.name}",
            initializer=torch.set_num_threads,
            initargs=(threads,),
        )
        return True

    async def unload(self) -> bool:
        await asyncio.to_thread(self.executor.shutdown, wait=True)
        return True

    async def predict_sequences(self, steps: list[SequenceStep]) -> list[InferenceResponse | BaseException]:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._run, steps)

    def _run(self, steps: list[SequenceStep]) -> list[InferenceResponse | BaseException]:
        results: list[InferenceResponse | BaseException] = [InvalidInput("unanswered")] * len(steps)
        groups: dict[int, list[int]] = defaultdict(list)
        for i, step in enumerate(steps):
            frames = step.request.inputs[0].data
            if frames.ndim != 2 or frames.shape[1] != self.features or frames.shape[0] == 0:
                results[i] = InvalidInput(
                    f"frames must be FP32 [T >= 1, {self.features}], got {list(frames.shape)}"
                )
                continue
            groups[frames.shape[0]].append(i)
        with torch.inference_mode():
            for indexes in groups.values():
                self._run_group([steps[i] for i in indexes], indexes, results)
        return results

    def _run_group(self, steps: list[SequenceStep], indexes: list[int], results: list[Any]) -> None:
        x = torch.from_numpy(
            np.stack([np.asarray(s.request.inputs[0].data, dtype=np.float32) for s in steps])
        )
        zeros = torch.zeros(self.layers, self.hidden)
        h0 = torch.stack([s.state[0] if s.state is not None else zeros for s in steps], dim=1)
        c0 = torch.stack([s.state[1] if s.state is not None else zeros for s in steps], dim=1)
        logits, (h, c) = self.net(x, (h0, c0))
        logits_np = logits.numpy()
        for j, (step, i) in enumerate(zip(steps, indexes, strict=True)):
            step.state = (h[:, j].clone(), c[:, j].clone())
            results[i] = InferenceResponse(
                model_name=self.name, outputs=[NumpyCodec.encode_output("logits", logits_np[j])]
            )
