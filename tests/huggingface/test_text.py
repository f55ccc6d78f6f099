"""Tokens to text, piece by piece, and stop strings (OpenAI's semantics, streamed too)."""

from __future__ import annotations

from typing import Any

from runtime.huggingface.text import TextStream


class Bytes:
    """A decoder whose tokens are bytes (255: a special token), like a byte-level tokenizer's."""

    def decode(self, token_ids: Any, skip_special_tokens: bool = True, **kwargs: Any) -> str:
        return bytes(t for t in token_ids if t != 255).decode("utf-8", errors="replace")


def feed(stream: TextStream, text: str) -> list[str]:
    pieces = []
    for token in text.encode():
        stream.add(token)
        pieces.append(stream.take())
    return pieces


def test_pieces_spell_the_text_and_wait_for_whole_characters() -> None:
    stream = TextStream(Bytes())
    pieces = feed(stream, "héllo wörld")
    assert "".join(pieces) == "héllo wörld"
    assert "\ufffd" not in "".join(pieces)
    assert pieces[1] == "" and pieces[2] == "é"  # the first byte of é waits for the second
    stream.add(255)  # a special token adds no text
    assert stream.take() == "" and stream.text == "héllo wörld"


def test_a_stop_string_ends_the_text_before_it_and_is_never_sent() -> None:
    stream = TextStream(Bytes(), stop=["STOP", "xyz"])
    sent = ""
    for token in b"go on STOP and more":
        stream.add(token)
        sent += stream.take()
        assert "S" not in sent  # text that may begin a stop string is held back
    assert stream.stopped and stream.text == "go on " and sent + stream.flush() == "go on "


def test_held_text_is_released_when_it_turns_out_not_to_be_a_stop() -> None:
    stream = TextStream(Bytes(), stop=["abc"])
    assert feed(stream, "xab") == ["x", "", ""]
    assert feed(stream, "d") == ["abd"]
    assert feed(stream, "ab") == ["", ""]
    assert stream.flush() == "ab" and not stream.stopped  # the end: whatever was held goes


def test_a_stop_string_spread_over_tokens_and_found_late() -> None:
    stream = TextStream(Bytes(), stop=["lo w"])
    feed(stream, "hello world")
    assert stream.stopped and stream.text == "hel"
    stream.add(ord("z"))  # nothing is added after the stop
    assert stream.text == "hel"


def test_context_tokens_are_not_text() -> None:
    stream = TextStream(Bytes(), context=list(b"prompt "))
    assert "".join(feed(stream, "answer")) == "answer"
    stream.add(ord("!"), text=False)
    assert stream.take() == "" and stream.text == "answer"
