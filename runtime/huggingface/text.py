"""Generated tokens become text, piece by piece, and stop strings end it (OpenAI's semantics).

:class:`TextStream` turns one stream's tokens into text as they come. A token's text is known
only once the tokens after it cannot change it (a character spread over several byte tokens,
a word whose leading space depends on what precedes it), so each new token's text is the
difference between the decoding of a short window of recent tokens with and without it, as
Hugging Face's text-generation-inference does: the cost of each token stays constant, however
long the text.

Stop strings: the text ends just before the first stop string that appears in it, and the stop
string is not part of it. Streamed, text that could be the beginning of a stop string is held
back until the next tokens tell: a client never receives text that a stop string later takes
back. This module imports neither torch nor transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Decoder(Protocol):
    """What a tokenizer offers (``PreTrainedTokenizerBase.decode``)."""

    def decode(self, token_ids: Any, skip_special_tokens: bool = ..., **kwargs: Any) -> Any: ...


class TextStream:
    """One stream's text: feed it tokens, take the text that may be sent."""

    __slots__ = ("_prefix", "_read", "_sent", "decoder", "ids", "stop", "stopped", "text")

    def __init__(self, decoder: Decoder, stop: Sequence[str] = (), context: Sequence[int] = ()) -> None:
        self.decoder = decoder
        self.stop = tuple(stop)
        self.ids: list[int] = list(context)
        """The prompt's last tokens (a little context, so the first word decodes as it will read),
        then every generated token."""
        self._prefix = 0
        self._read = len(self.ids)
        self.text = ""
        """The text so far (stop string excluded once found)."""
        self._sent = 0
        self.stopped = False
        """A stop string was found: the text is complete."""

    def add(self, token: int, text: bool = True) -> None:
        """One more generated token (``text=False``: it counts but adds no text, e.g. a stop token)."""
        if self.stopped:
            return
        if not text:
            return
        self.ids.append(token)
        before = str(self.decoder.decode(self.ids[self._prefix : self._read], skip_special_tokens=True))
        after = str(self.decoder.decode(self.ids[self._prefix :], skip_special_tokens=True))
        if len(after) > len(before) and not after.endswith("\ufffd"):
            piece = after[len(before) :]
            self._prefix, self._read = self._read, len(self.ids)
            self._append(piece)

    def _append(self, piece: str) -> None:
        start = max(0, len(self.text) - self._longest_stop() + 1)
        self.text += piece
        if not self.stop:
            return
        found = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if found:
            self.text = self.text[: min(found)]
            self.stopped = True

    def _longest_stop(self) -> int:
        return max((len(s) for s in self.stop), default=1)

    def flush(self) -> str:
        """All the text not yet taken: at the end of the stream, whatever a stop string might have become."""
        piece = self.text[self._sent :]
        self._sent = len(self.text)
        return piece

    def take(self) -> str:
        """The text not yet taken that no stop string can take back."""
        if self.stopped:
            return self.flush()
        end = len(self.text) - self._held()
        piece = self.text[self._sent : end]
        self._sent = max(self._sent, end)
        return piece

    def _held(self) -> int:
        """Length of the longest end of the text that begins some stop string."""
        held = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(self.text)), held, -1):
                if self.text.endswith(stop[:size]):
                    held = size
                    break
        return held
