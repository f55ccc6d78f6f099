"""Generation 0's threshold while batchers run (``runtime.scheduling.gc_threshold``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from runtime.model import MLModel
from runtime.scheduling import gc_threshold
from runtime.scheduling.adaptive import AdaptiveScheduler
from runtime.settings import ModelSettings


@pytest.fixture(autouse=True)
def thresholds() -> Iterator[None]:
    """Each test starts from CPython's default thresholds and no holder; the process's come back."""
    saved = gc.get_threshold()
    while gc_threshold.holders():
        gc_threshold.release()
    gc.set_threshold(700, 10, 10)
    yield
    while gc_threshold.holders():
        gc_threshold.release()
    gc.set_threshold(*saved)


def test_holding_raises_generation_0_only_and_the_last_release_puts_it_back() -> None:
    gc_threshold.hold()
    assert gc.get_threshold() == (gc_threshold.YOUNG, 10, 10)
    gc_threshold.hold()
    gc_threshold.release()
    assert gc.get_threshold() == (gc_threshold.YOUNG, 10, 10)  # one holder left
    gc_threshold.release()
    assert gc.get_threshold() == (700, 10, 10) and gc_threshold.holders() == 0
    gc_threshold.release()  # one release too many changes nothing
    assert gc.get_threshold() == (700, 10, 10) and gc_threshold.holders() == 0


@pytest.mark.parametrize("threshold", [(0, 10, 10), (50_000, 5, 5)])
def test_a_collector_switched_off_or_a_higher_threshold_is_kept(threshold: tuple[int, int, int]) -> None:
    gc.set_threshold(*threshold)
    gc_threshold.hold()
    assert gc.get_threshold() == threshold
    gc_threshold.release()
    assert gc.get_threshold() == threshold


def test_a_threshold_changed_by_someone_else_meanwhile_is_not_undone() -> None:
    gc_threshold.hold()
    gc.set_threshold(2_000, 10, 10)
    gc_threshold.release()
    assert gc.get_threshold() == (2_000, 10, 10)


@pytest.mark.anyio
async def test_an_adaptive_batcher_holds_from_start_to_stop() -> None:
    class Model(MLModel):
        pass

    settings = ModelSettings(name="m", max_batch_size=4, max_batch_time=0.01)
    scheduler = AdaptiveScheduler(Model(settings), settings)
    await scheduler.start()
    assert gc_threshold.holders() == 1 and gc.get_threshold()[0] == gc_threshold.YOUNG
    await scheduler.stop()
    assert gc_threshold.holders() == 0 and gc.get_threshold() == (700, 10, 10)
    await scheduler.stop()  # a second stop releases nothing more
    assert gc_threshold.holders() == 0


@pytest.mark.anyio
async def test_a_sequence_batcher_holds_from_start_to_stop() -> None:
    from runtime.scheduling.sequence_batching import SequenceScheduler
    from runtime.sequences.sequence_model import SequenceModel, SequenceStep
    from runtime.types import InferenceResponse

    class Model(SequenceModel):
        async def predict_sequences(self, steps: list[SequenceStep]) -> list[InferenceResponse]:
            return [InferenceResponse() for _ in steps]

    settings = ModelSettings(name="s", sequence_batching=True, max_batch_size=4)
    scheduler = SequenceScheduler(Model(settings), settings)
    await scheduler.start()
    assert gc_threshold.holders() == 1 and gc.get_threshold()[0] == gc_threshold.YOUNG
    await scheduler.stop()
    assert gc_threshold.holders() == 0 and gc.get_threshold() == (700, 10, 10)
