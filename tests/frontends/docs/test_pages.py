"""The API pages (``runtime.frontends.docs.pages``): the routes, their 404s, the assets served by
the server itself, and Swagger UI in a real headless Chromium sending an inference request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runtime.frontends.docs.pages import ASSETS, assets_folder
from runtime.settings import ModelSettings
from tests.browser import Browser, chromium_or_skip
from tests.conftest import InProcess
from tests.models import zoo
from tests.servers import RunningServer, start_server

ECHO = ModelSettings(
    name="echo",
    implementation=zoo.Echo,
    inputs=[{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
    parameters={"version": "1"},
)


@pytest.mark.anyio
async def test_the_pages_and_documents_are_served(inprocess: InProcess) -> None:
    await inprocess.load(ECHO)
    async with inprocess.client() as client:
        page = await client.get("/v2/docs")
        model_page = await client.get("/v2/models/echo/versions/1/docs")
        document = await client.get("/v2/docs/dataplane.json")
        own = await client.get("/v2/models/echo/docs/dataplane.json")
        missing = await client.get("/v2/models/nope/docs")
        missing_json = await client.get("/v2/models/nope/docs/dataplane.json")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '"/v2/docs/dataplane.json"' in page.text and "/v2/docs/static/swagger-ui-bundle.js" in page.text
    assert '"/v2/models/echo/versions/1/docs/dataplane.json"' in model_page.text
    assert "http" not in page.text.replace("http-equiv", "")  # nothing from elsewhere: no CDN
    assert document.json()["paths"]["/v2/models/{model_name}/infer"]["post"]["operationId"] == "infer-model"
    assert "/v2/models/echo/infer" in own.json()["paths"]
    assert missing.status_code == missing_json.status_code == 404 and "nope" in missing.json()["error"]


@pytest.mark.anyio
async def test_swagger_uis_files_come_from_the_server(inprocess: InProcess) -> None:
    folder = assets_folder()
    assert folder is not None, "swagger-ui-py (a dependency) ships Swagger UI's files"
    async with inprocess.client() as client:
        for name, media in ASSETS.items():
            answer = await client.get(f"/v2/docs/static/{name}", headers={"accept-encoding": "identity"})
            assert answer.status_code == 200 and answer.headers["content-type"] == media
            assert answer.content == (folder / name).read_bytes()
        other = await client.get("/v2/docs/static/swagger-editor.js")
        escape = await client.get("/v2/docs/static/..%2F__init__.py")
    assert other.status_code == escape.status_code == 404 and "error" in other.json()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("models")
    (folder / "echo").mkdir()
    settings = {
        "implementation": "tests.models.zoo.Echo",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
    }
    (folder / "echo" / "model-settings.json").write_text(json.dumps(settings))
    running = start_server(folder)
    yield running
    running.stop()


TRY_IT_OUT = """
(async () => {
  const waitFor = (selector) => new Promise((resolve, reject) => {
    const found = () => document.querySelector(selector);
    if (found()) { resolve(found()); return; }
    const observer = new MutationObserver(() => {
      if (found()) { observer.disconnect(); resolve(found()); }
    });
    observer.observe(document.body, {childList: true, subtree: true});
    setTimeout(() => { observer.disconnect(); reject(new Error("no " + selector)); }, 60000);
  });
  const op = "#operations-inference-infer";
  (await waitFor(op + " .opblock-summary-control")).click();
  (await waitFor(op + " .try-out__btn")).click();
  const example = (await waitFor(op + " textarea.body-param__text")).value;
  (await waitFor(op + " button.execute")).click();
  const status = await waitFor(op + " .live-responses-table .response .response-col_status");
  const body = await waitFor(op + " .live-responses-table .response-col_description pre");
  return {example, status: status.textContent.trim(), body: body.textContent};
})()
"""


@pytest.mark.anyio
async def test_try_it_out_in_a_real_browser_sends_an_inference_request(
    server: RunningServer, tmp_path: Path
) -> None:
    """The model's page in headless Chromium: "Try it out", then "Execute" on the infer operation
    sends the example made from the model's metadata, and the server's answer shows on the page.
    Every request the page made went to the server (no CDN). A screenshot is kept."""
    chromium = chromium_or_skip()
    async with Browser(chromium) as browser:
        await browser.open(f"{server.http_url}/v2/models/echo/docs")
        shown = await browser.evaluate(TRY_IT_OUT)
        png = await browser.screenshot()
    (tmp_path / "swagger-ui.png").write_bytes(png)
    assert json.loads(shown["example"])["inputs"] == [
        {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [0.0, 0.0, 0.0]}
    ]
    assert shown["status"].startswith("200")
    answer = json.loads(shown["body"])
    assert answer["model_name"] == "echo" and answer["outputs"][0]["data"] == [0.0, 0.0, 0.0]
    fetched = [url for url in browser.requests if not url.startswith("data:")]  # (the style's inline images)
    assert fetched and all(url.startswith(server.http_url) for url in fetched), fetched
    assert f"{server.http_url}/v2/models/echo/infer" in browser.requests
    assert (tmp_path / "swagger-ui.png").stat().st_size > 10_000


def test_the_server_page_loads_in_a_real_browser(server: RunningServer, tmp_path: Path) -> None:
    """The server's page lists every operation of the document."""
    import asyncio

    chromium = chromium_or_skip()

    async def load() -> int:
        async with Browser(chromium) as browser:
            await browser.open(f"{server.http_url}/v2/docs")
            count: int = await browser.evaluate(
                """new Promise((resolve) => {
                  const count = () => document.querySelectorAll('.opblock').length;
                  if (count() > 0) { resolve(count()); return; }
                  new MutationObserver((_, o) => { if (count() > 0) { o.disconnect(); resolve(count()); } })
                    .observe(document.body, {childList: true, subtree: true});
                })"""
            )
            (tmp_path / "server.png").write_bytes(await browser.screenshot())
            return count

    operations = asyncio.run(load())
    document = httpx.get(f"{server.http_url}/v2/docs/dataplane.json").json()
    assert operations == sum(len(item) for item in document["paths"].values())
