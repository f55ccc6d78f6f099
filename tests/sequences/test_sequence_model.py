"""The model API for stateful sequences (``runtime.sequences.sequence_model``)."""

from __future__ import annotations

from typing import get_args

import pytest

from runtime.errors import InvalidInput
from runtime.sequences.sequence_model import (
    END_REASONS,
    EndReason,
    SequenceModel,
    SequenceStep,
    serves_stateless,
)
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse

pytestmark = pytest.mark.anyio


def test_a_step_ends_by_the_clients_flag_or_the_models_call() -> None:
    step = SequenceStep(InferenceRequest(inputs=[]), "7", start=True, end=False, state=None)
    assert not step.ends and repr(step) == "SequenceStep('7' S)"
    step.end_sequence()
    assert step.ends and step.end is False and repr(step) == "SequenceStep('7' SE)"
    flagged = SequenceStep(InferenceRequest(inputs=[]), "8", start=False, end=True, state=1)
    assert flagged.ends and repr(flagged) == "SequenceStep('8' E)"
    assert (
        repr(SequenceStep(InferenceRequest(inputs=[]), "9", start=False, end=False, state=1))
        == "SequenceStep('9')"
    )


def test_every_end_reason_is_listed_once() -> None:
    assert sorted(END_REASONS) == sorted(get_args(EndReason)) and len(set(END_REASONS)) == len(END_REASONS)


class OnlySequences(SequenceModel):
    pass


class AlsoStateless(SequenceModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(model_name=self.name)


async def test_a_model_without_predict_refuses_requests_outside_a_sequence() -> None:
    only = OnlySequences(ModelSettings(name="seq", implementation=OnlySequences))
    assert not serves_stateless(only)
    with pytest.raises(InvalidInput, match="serves only sequences: send sequence_start=true"):
        await only.predict(InferenceRequest(inputs=[]))
    with pytest.raises(NotImplementedError, match="OnlySequences must implement predict_sequences"):
        await only.predict_sequences([])
    assert serves_stateless(AlsoStateless(ModelSettings(name="both", implementation=AlsoStateless)))
