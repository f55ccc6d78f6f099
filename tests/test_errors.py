"""The core's errors (``runtime.errors``): their messages and how client-given names are quoted."""

from __future__ import annotations

from runtime import errors
from runtime.errors import NAME_SHOWN, ModelNotFound, SequenceStepConflict, shown


def test_shown_quotes_a_name_and_cuts_an_absurd_one() -> None:
    assert shown("resnet") == "'resnet'"
    exact = "n" * NAME_SHOWN
    assert shown(exact) == repr(exact)
    long = "n" * (NAME_SHOWN * 50)
    assert shown(long) == f"{'n' * NAME_SHOWN!r}… ({NAME_SHOWN * 50} characters)"


def test_an_error_is_its_message() -> None:
    error = errors.Overloaded("queue full")
    assert str(error) == error.message == "queue full" and error.args == ("queue full",)


def test_model_not_found_names_the_model_and_version_quoted() -> None:
    plain = ModelNotFound("m")
    assert (plain.message, plain.name, plain.version) == ("Model 'm' not found", "m", None)
    versioned = ModelNotFound("m", "2")
    assert versioned.message == "Model 'm' with version '2' not found" and versioned.version == "2"
    assert len(ModelNotFound("x" * 100_000).message) < 2 * NAME_SHOWN


def test_a_step_conflict_carries_the_expected_step() -> None:
    error = SequenceStepConflict("step 5 is not the next one", expected=3)
    assert error.expected == 3 and str(error) == "step 5 is not the next one"


def test_the_tree_groups_errors_by_meaning() -> None:
    assert issubclass(errors.SequenceNotOpen, errors.InvalidInput)
    assert issubclass(errors.QueueTimeout, errors.RequestTimeout)
    for cls in (errors.ModelNotReady, errors.Overloaded, errors.WorkerLost, errors.ShuttingDown):
        assert issubclass(cls, errors.Unavailable)
    assert not issubclass(errors.SequenceStepConflict, errors.InvalidInput)
    classes = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.ServerError)
    }
    assert set(errors.__all__) == classes | {"shown", "model_failed", "internal_error"}


def test_a_model_failure_is_built_in_one_place_and_chained_to_its_cause() -> None:
    cause = RuntimeError("broke after 2 words")
    failed = errors.model_failed("words", cause)
    assert isinstance(failed, errors.ModelFailed)
    assert failed.message == "Model 'words' failed: RuntimeError: broke after 2 words"
    assert failed.__cause__ is cause


def test_an_unexpected_exception_reads_as_an_internal_server_error() -> None:
    assert errors.internal_error(KeyError("x")) == "Internal server error: KeyError: 'x'"
