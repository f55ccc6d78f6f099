"""The registry's table (``runtime.core.model_table``): entries found by name and version, the
default version, readiness and the index, apart from loading."""

from __future__ import annotations

import pytest

from runtime import MLModel
from runtime.core.model_table import NOT_LOADED, ModelEntry, ModelTable
from runtime.errors import InvalidInput, ModelNotFound, ModelNotReady
from runtime.settings import ModelParameters, ModelSettings
from runtime.types import InferenceRequest, InferenceResponse, State


class Plain(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(model_name=self.name, outputs=[])


def _settings(name: str, version: str | None = None) -> ModelSettings:
    parameters = ModelParameters(version=version) if version else None
    return ModelSettings(name=name, implementation=Plain, parameters=parameters)


def _ready(table: ModelTable, name: str, version: str | None = None) -> ModelEntry:
    """An entry made ready by hand (a model instance marked ready), as a load leaves it."""
    entry = table.register(_settings(name, version))
    model = Plain(entry.settings)
    model.ready = True
    entry.model, entry.state, entry.reason, entry.on_demand = model, State.READY, "", False
    return entry


def test_register_adds_a_not_loaded_entry_and_keeps_one_already_there() -> None:
    table = ModelTable()
    entry = table.register(_settings("m"))
    assert (entry.state, entry.reason, entry.on_demand, entry.loaded) == (
        State.UNAVAILABLE,
        NOT_LOADED,
        True,
        False,
    )
    assert table.register(_settings("m")) is entry
    with pytest.raises(InvalidInput, match="needs a name"):
        table.register(ModelSettings(name="", implementation=Plain))


def test_find_names_the_missing_model_or_version() -> None:
    table = ModelTable()
    _ready(table, "m", "1")
    with pytest.raises(ModelNotFound):
        table.find("other")
    with pytest.raises(ModelNotFound):
        table.find("m", "2")
    assert table.find("m", "1").version == "1"


def test_the_default_version_is_the_highest_ready_one_in_numeric_order() -> None:
    table = ModelTable()
    for version in ("2", "10", "9"):
        _ready(table, "m", version)
    assert table.versions("m") == ["2", "9", "10"]
    assert table.default_version("m") == "10"
    table.register(_settings("m", "11"))  # not loaded: the highest ready one still serves
    assert table.default_version("m") == "10"
    table.set_default("m", "2")
    assert table.default_version("m") == "2"
    with pytest.raises(ModelNotFound):
        table.set_default("m", "3")


def test_unversioned_settings_are_the_default() -> None:
    table = ModelTable()
    _ready(table, "m", "5")
    _ready(table, "m")
    assert table.default_version("m") is None


def test_get_refuses_an_entry_that_is_not_ready_and_serving_takes_one_loaded_on_demand() -> None:
    table = ModelTable()
    entry = table.register(_settings("lazy"))
    with pytest.raises(ModelNotReady, match="not loaded"):
        table.get("lazy")
    assert table.serving("lazy") is entry  # the registry loads it when a request acquires it
    entry.on_demand = False
    with pytest.raises(ModelNotReady, match="not ready"):
        table.serving("lazy")


def test_index_readiness_and_the_resident_entries() -> None:
    table = ModelTable()
    ready = _ready(table, "a")
    table.register(_settings("b"))
    assert [(i.name, i.state) for i in table.index()] == [("a", State.READY), ("b", State.UNAVAILABLE)]
    assert [i.name for i in table.index(ready_only=True)] == ["a"]
    assert table.all_ready()  # an UNAVAILABLE entry is reported apart
    assert table.resident() == [ready]
    ready.state = State.LOADING
    assert not table.all_ready()
