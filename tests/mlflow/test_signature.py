"""An MLflow signature read from the MLmodel file without mlflow (``runtime.mlflow.signature``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.mlflow.signature import SignatureError, model_folder, read_signature
from runtime.types import Datatype


def _mlmodel(folder: Path, signature: dict[str, object] | None) -> Path:
    lines = ["flavors:", "  python_function: {loader_module: mlflow.sklearn}"]
    if signature is not None:
        lines.append("signature:")
        lines += [f"  {key}: '{json.dumps(value)}'" for key, value in signature.items()]
    (folder / "MLmodel").write_text("\n".join(lines) + "\n")
    return folder


def test_a_column_signature_is_one_input_per_column_and_pd(tmp_path: Path) -> None:
    columns = [
        {"type": "double", "name": "a"},
        {"type": "string", "name": "s", "required": False},
        {"type": "binary", "name": "b"},
        {"type": "datetime", "name": "t"},
        {"type": "array", "items": {"type": "long"}, "name": "arr"},
        {"type": "long"},
    ]
    signature = read_signature(
        _mlmodel(
            tmp_path,
            {
                "inputs": columns,
                "outputs": [{"type": "long"}],
                "params": [{"name": "k", "type": "double", "default": 1.5}],
            },
        )
    )
    assert signature.columns and signature.content_type == "pd"
    assert [(s.name, s.datatype, s.content_type, s.shape) for s in signature.inputs] == [
        ("a", Datatype.FP64, "np", [-1, 1]),
        ("s", Datatype.BYTES, "str", [-1, 1]),
        ("b", Datatype.BYTES, "base64", [-1, 1]),
        ("t", Datatype.BYTES, "datetime", [-1, 1]),
        ("arr", Datatype.BYTES, "pd_json", [-1, 1]),
        ("input-5", Datatype.INT64, "np", [-1, 1]),
    ]
    assert not signature.inputs[1].required
    assert [o.name for o in signature.outputs] == ["output-1"]
    assert [(p.name, p.mlflow_type, p.default) for p in signature.params] == [("k", "double", 1.5)]


def test_tensor_signatures_are_np_or_dict(tmp_path: Path) -> None:
    one = {"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, 4]}}
    signature = read_signature(_mlmodel(tmp_path, {"inputs": [one], "outputs": [one, {**one, "name": "z"}]}))
    assert signature.content_type == "np" and signature.inputs[0].name == "input-0"
    assert signature.inputs[0].metadata().shape == [-1, 4]
    assert [o.name for o in signature.outputs] == ["output-0", "z"]
    named = read_signature(_mlmodel(tmp_path, {"inputs": [{**one, "name": "x"}, {**one, "name": "y"}]}))
    assert named.content_type == "dict"


def test_no_signature_is_an_empty_one(tmp_path: Path) -> None:
    signature = read_signature(_mlmodel(tmp_path, None))
    assert signature.inputs == [] and signature.content_type is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "no MLmodel file"),
        ("- a list\n", "is not an MLflow model description"),
        ('signature:\n  inputs: \'[{"name": "a"}]\'\n', "has no type"),
        ("signature:\n  inputs: '{nope'\n", "not JSON"),
        (
            'signature:\n  inputs: \'[{"type": "tensor", "tensor-spec": {"dtype": "complex64"}}]\'\n',
            "complex64",
        ),
        (": : :\n", "cannot be read"),
    ],
)
def test_an_unreadable_mlmodel_says_why(tmp_path: Path, text: str | None, message: str) -> None:
    if text is not None:
        (tmp_path / "MLmodel").write_text(text)
    with pytest.raises(SignatureError, match=message):
        read_signature(tmp_path)


def test_the_folder_is_the_uri_relative_to_the_models_folder(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "MLmodel").write_text("{}")
    assert model_folder("m", str(tmp_path)) == tmp_path / "m"
    assert model_folder("m/MLmodel", str(tmp_path)) == tmp_path / "m"
    assert model_folder(None, str(tmp_path)) == tmp_path
    assert model_folder(str(tmp_path / "m"), "/elsewhere") == tmp_path / "m"
