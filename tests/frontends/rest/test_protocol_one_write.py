"""A response's head goes out with its first body part: one write (``_HeadWithBody``)."""

from __future__ import annotations

from typing import Any

from runtime.frontends.rest.protocol import _HeadWithBody


class Transport:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def writelines(self, parts: list[bytes]) -> None:
        self.calls.append(("writelines", list(parts)))

    def close(self) -> None:
        self.calls.append(("close", None))

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


class Cycle:
    response_started = False


def test_head_and_body_go_out_in_one_write() -> None:
    transport, cycle = Transport(), Cycle()
    wrapped = _HeadWithBody(transport, cycle)  # type: ignore[arg-type]
    wrapped.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # before the response starts: at once
    cycle.response_started = True
    wrapped.write(b"HEAD")
    assert transport.calls == [("write", b"HTTP/1.1 100 Continue\r\n\r\n")]
    wrapped.write(b"BODY")
    wrapped.write(b"MORE")  # later parts (a stream's) go out as they come
    assert transport.calls[1:] == [("writelines", [b"HEAD", b"BODY"]), ("write", b"MORE")]
    assert wrapped.get_extra_info("peername") == "info:peername"


def test_a_held_head_goes_out_before_the_connection_closes() -> None:
    transport, cycle = Transport(), Cycle()
    wrapped = _HeadWithBody(transport, cycle)  # type: ignore[arg-type]
    cycle.response_started = True
    wrapped.write(b"HEAD")
    wrapped.close()
    assert transport.calls == [("write", b"HEAD"), ("close", None)]


def test_the_held_head_lets_go_of_the_cycle() -> None:
    """The cycle refers to its transport (this wrapper): once the head is held the wrapper drops
    the cycle, so the two are freed by reference counting, not left to the cyclic collector."""
    import gc
    import weakref

    class Owner(Cycle):
        pass

    transport, cycle = Transport(), Owner()
    wrapped = _HeadWithBody(transport, cycle)  # type: ignore[arg-type]
    cycle.transport = wrapped  # type: ignore[attr-defined]
    cycle.response_started = True
    wrapped.write(b"HEAD")
    wrapped.write(b"BODY")
    assert transport.calls == [("writelines", [b"HEAD", b"BODY"])]
    gone = weakref.ref(cycle)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del cycle, wrapped
        assert gone() is None
    finally:
        if enabled:
            gc.enable()
