from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from runtime.core.dataplane import DataPlane
from runtime.core.registry import Registry
from runtime.server.rest_app import create_app
from runtime.settings import ModelSettings, Settings
from tests import fast_loop
from tests.servers import RunningServer, start_server

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "models"
STREAMING_EXAMPLES = ROOT / "examples" / "streaming"
TEST_MODELS = Path(__file__).resolve().parent / "models"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
async def one_event_loop(anyio_backend: str) -> AsyncIterator[None]:
    """Hold anyio's test runner for the whole session, so every async test runs on one event loop.

    grpc.aio binds its completion queue to each loop it meets and delivers a late event of an
    earlier loop's call through whichever loop is alive: with a fresh loop per test, such an event
    lands on a closed loop and fails an unrelated later test ("Event loop is closed"). A server
    process has one loop; so do the tests.
    """
    yield


class InProcess:
    """A DataPlane and its REST app in this process, for fast tests through httpx's ASGI transport."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.registry = Registry()
        self.dataplane = DataPlane(self.settings, self.registry)
        self.dataplane.started = True
        self.app = create_app(self.dataplane)

    async def load(self, *models: ModelSettings) -> None:
        for model in models:
            await self.registry.load(model)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://test")


@pytest.fixture
async def inprocess() -> AsyncIterator[InProcess]:
    server = InProcess()
    yield server
    await server.registry.unload_all()


@pytest.fixture(scope="session")
def example_server() -> Iterator[RunningServer]:
    """The bundled examples served by a real server process, shared by the session's tests."""
    server = start_server(EXAMPLES)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def streaming_server() -> Iterator[RunningServer]:
    """The streaming test models (tests/models/streaming) served by a real server process."""
    server = start_server(TEST_MODELS / "streaming")
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="session")
def textgen_server() -> Iterator[RunningServer]:
    """The streaming text-generation example (torch) served by a real server process."""
    server = start_server(STREAMING_EXAMPLES)
    yield server
    server.stop()


# session fixtures of the gRPC tests (a server on a copy of tests/models/grpc)
from tests.grpc_support import grpc_models, grpc_server  # noqa: E402

__all__ = ["grpc_models", "grpc_server"]


@pytest.fixture(scope="session")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder written by save_pretrained: a tiny Llama-style model and its tokenizer, made now
    (``tests/huggingface/tiny_llm.py``); skips where the llm extra is not installed."""
    pytest.importorskip("transformers", reason="the Hugging Face runtime needs the llm extra (transformers)")
    pytest.importorskip("tokenizers", reason="the Hugging Face runtime needs the llm extra (tokenizers)")
    from tests.huggingface.tiny_llm import build

    return build(tmp_path_factory.mktemp("tiny-llm"))


@pytest.fixture(scope="session")
def mlflow_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """MLflow models saved once for the session with real mlflow (``tests.mlflow.saved_models``):
    (their folder, the fitted estimators by name). Skips, saying why, without mlflow."""
    from tests.mlflow.saved_models import save_models

    root = tmp_path_factory.mktemp("mlflow-models")
    return root, save_models(root)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that start a process or a real server (``-m "not server"`` is the fast loop)."""
    fast_loop.mark(items)
