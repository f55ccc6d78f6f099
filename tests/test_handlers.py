"""``@custom_handler`` marks a model's methods; ``get_custom_handlers`` finds them, bound."""

from __future__ import annotations

import pytest

from runtime.handlers import CustomHandler, custom_handler, get_custom_handlers
from runtime.model import MLModel
from runtime.settings import ModelSettings


class Marked(MLModel):
    @custom_handler(rest_path="/sum")
    async def total(self, payload: list[int]) -> int:
        return sum(payload)

    @custom_handler(rest_path="/hello", rest_method="get")
    def hello(self) -> str:
        return f"hello from {self.name}"


class Overridden(Marked):
    async def total(self, payload: list[int]) -> int:  # not marked: no longer a handler
        return 0


def test_marked_methods_are_found_bound_and_unchanged() -> None:
    model = Marked(ModelSettings(name="m"))
    found = dict(get_custom_handlers(model))
    assert found == {
        CustomHandler("/sum", "POST"): model.total,
        CustomHandler("/hello", "GET"): model.hello,
    }
    assert model.hello() == "hello from m"


def test_an_unmarked_override_is_not_a_handler() -> None:
    found = get_custom_handlers(Overridden(ModelSettings(name="o")))
    assert [handler.rest_path for handler, _ in found] == ["/hello"]


def test_a_path_must_be_absolute() -> None:
    with pytest.raises(ValueError, match="must start with '/'"):
        custom_handler(rest_path="relative")
