"""``documented``: fields described by the string under them, as pydantic's
``use_attribute_docstrings`` describes them, from one parse of the module."""

from __future__ import annotations

import ast
import textwrap

from pydantic import BaseModel, ConfigDict, Field
from pydantic._internal._docs_extraction import extract_docstrings_from_cls

from runtime.field_docs import attribute_docstrings, documented
from runtime.settings import GenerateSettings, ModelParameters, ModelSettings, Settings
from runtime.torch.torch_settings import StopRule, TorchSettings

DOCUMENTED: list[type[BaseModel]] = [
    Settings,
    ModelParameters,
    GenerateSettings,
    ModelSettings,
    StopRule,
    TorchSettings,
]


def test_the_descriptions_are_pydantics_own() -> None:
    for cls in DOCUMENTED:
        expected = extract_docstrings_from_cls(cls, use_inspect=True)
        assert expected, cls.__name__
        found = {name: field.description for name, field in cls.model_fields.items() if name in expected}
        assert found == expected, cls.__name__


def test_the_json_schema_carries_the_descriptions() -> None:
    """The schema is built after the descriptions are set (``defer_build`` until then)."""
    for cls in DOCUMENTED:
        properties = cls.model_json_schema()["properties"]
        for name, field in cls.model_fields.items():
            if field.description is not None and name in properties:
                assert properties[name]["description"] == field.description, (cls.__name__, name)


def test_subclasses_inherit_use_attribute_docstrings_and_build_at_once() -> None:
    class Mine(ModelSettings):
        threshold: float = 0.5
        """Scores under this are dropped."""

    assert Mine.model_config.get("use_attribute_docstrings") is True
    assert Mine.model_config.get("defer_build") is False
    assert Mine.__pydantic_complete__
    assert Mine.model_fields["threshold"].description == "Scores under this are dropped."
    assert Mine.model_fields["name"].description == ModelSettings.model_fields["name"].description


@documented
class Described(BaseModel):
    model_config = ConfigDict(defer_build=True)

    a: int = Field(default=1, description="given")
    """ignored, as pydantic ignores it"""

    b: int = 2
    """from the docstring"""

    c: int = 3


def test_an_explicit_description_wins() -> None:
    assert Described.model_fields["a"].description == "given"
    assert Described.model_fields["b"].description == "from the docstring"
    assert Described.model_fields["c"].description is None
    assert Described.model_json_schema()["properties"]["b"]["description"] == "from the docstring"


def test_only_top_level_classes_are_read() -> None:
    """The decorator serves the settings modules' top-level classes; a class defined in a
    function is not found in its module's top level, and keeps no descriptions."""

    @documented
    class Local(BaseModel):
        model_config = ConfigDict(defer_build=True)

        b: int = 2
        """from the docstring"""

    assert Local.model_fields["b"].description is None


def test_attribute_docstrings_reads_only_strings_right_under_an_annotation() -> None:
    source = textwrap.dedent(
        '''
        class A:
            """The class's own docstring."""

            x: int = 1
            """First line.

                Indented second paragraph."""

            y = 2
            """not annotated: not a field docstring"""

            z: int
            w: int
            """w's"""

            def f(self) -> None:
                """a method's docstring"""

            v: str = "v"
            42
        '''
    )
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.ClassDef)
    assert attribute_docstrings(node) == {
        "x": "First line.\n\nIndented second paragraph.",
        "w": "w's",
    }
