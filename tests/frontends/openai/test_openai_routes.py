"""The OpenAI API on a real server, driven by the official ``openai`` client, over a tiny Llama-style
model made at test time: every route, streamed and not; greedy answers token for token against
``model.generate`` alone, at 1 and 16 concurrent requests; errors in OpenAI's shape."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from runtime.server.serving import Server
from runtime.settings import ModelSettings
from tests.huggingface.tiny_llm import reference, sentences, tokenize
from tests.servers import serving

openai = pytest.importorskip("openai", reason="the OpenAI front end's tests drive the official openai client")

pytestmark = pytest.mark.anyio

MLSERVER = "mlserver_huggingface.HuggingFaceRuntime"


def llm(name: str, folder: Path, **settings: Any) -> ModelSettings:
    extra = {"task": "text-generation", "pretrained_model": str(folder)}
    return ModelSettings(name=name, implementation=MLSERVER, parameters={"extra": extra}, **settings)


@pytest.fixture(scope="module")
async def server(tiny_llm: Path) -> AsyncIterator[Server]:
    embedder = ModelSettings(
        name="embedder",
        implementation=MLSERVER,
        parameters={"uri": str(tiny_llm), "extra": {"task": "feature-extraction"}},
    )
    async with serving(llm("tiny", tiny_llm), llm("narrow", tiny_llm, max_batch_size=4), embedder) as running:
        yield running


@pytest.fixture
async def api(server: Server) -> AsyncIterator[Any]:
    """The official client, on ``/v1``."""
    async with openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{server.http_port}/v1", api_key="unused", max_retries=0
    ) as client:
        yield client


@pytest.fixture
async def kserve_api(server: Server) -> AsyncIterator[Any]:
    """The official client, on KServe's ``/openai/v1``."""
    async with openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{server.http_port}/openai/v1", api_key="unused", max_retries=0
    ) as client:
        yield client


async def greedy(api: Any, model: str, prompt: str, tokens: int, stream: bool) -> tuple[list[int], str, str]:
    """The tokens, text and finish reason of a greedy completion (streamed or not)."""
    extra = {"return_token_ids": True}
    if not stream:
        answer = await api.completions.create(
            model=model, prompt=prompt, max_tokens=tokens, temperature=0, extra_body=extra
        )
        choice = answer.choices[0]
        return choice.model_extra["token_ids"], choice.text, choice.finish_reason
    text, ids, reason = "", [], ""
    async with await api.completions.create(
        model=model, prompt=prompt, max_tokens=tokens, temperature=0, stream=True, extra_body=extra
    ) as chunks:
        async for chunk in chunks:
            choice = chunk.choices[0]
            text += choice.text
            if choice.finish_reason is not None:
                ids, reason = choice.model_extra["token_ids"], choice.finish_reason
    return ids, text, reason


async def test_one_greedy_completion_is_what_generate_gives(server: Server, tiny_llm: Path, api: Any) -> None:
    prompt = "the quick fox runs over"
    for stream in (False, True):
        ids, text, reason = await greedy(api, "tiny", prompt, 24, stream)
        assert ids == reference(tiny_llm, prompt, 24)
        assert reason in ("length", "stop") and (reason == "length") == (len(ids) == 24)
        assert text  # the same text streamed and not, checked below against the decoder


@pytest.mark.parametrize("model", ["tiny", "narrow"])
async def test_sixteen_concurrent_greedy_completions_are_each_what_generate_gives_alone(
    server: Server, tiny_llm: Path, model: str, api: Any
) -> None:
    """16 requests of different prompt lengths and lengths, half of them streamed, share the steps
    (``narrow``: 4 at a time, the rest waiting and joining as others leave); each one's tokens are
    those of ``generate`` on its prompt alone."""
    prompts = sentences(16, seed=7)
    lengths = [8 + 3 * i for i in range(16)]
    got = await asyncio.gather(
        *(
            greedy(api, model, p, n, stream=i % 2 == 1)
            for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
        )
    )
    for prompt, length, (ids, _, _) in zip(prompts, lengths, got, strict=True):
        assert ids == reference(tiny_llm, prompt, length)
    running = server.registry.entries()[0].scheduler
    assert running is not None


async def test_streamed_text_is_the_unary_text(server: Server, api: Any) -> None:
    prompt = "blue river sings"
    _, unary, _ = await greedy(api, "tiny", prompt, 30, stream=False)
    _, streamed, _ = await greedy(api, "tiny", prompt, 30, stream=True)
    assert streamed == unary


async def test_chat_completion_uses_the_chat_template(
    server: Server, tiny_llm: Path, kserve_api: Any
) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat"}]
    answer = await kserve_api.chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, temperature=0, extra_body={"return_token_ids": True}
    )
    rendered = "<s>system: be brief</s><s>user: the cat</s><s>assistant:"
    prompt = tokenize(tiny_llm, rendered)
    choice = answer.choices[0]
    assert choice.model_extra["token_ids"] == reference(tiny_llm, prompt, 12)
    assert choice.message.role == "assistant"
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.usage.completion_tokens == len(choice.model_extra["token_ids"])
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens

    pieces, roles, reasons, usage = [], [], [], []
    stream = await kserve_api.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        usage.append(chunk.usage)
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            roles.append(c.delta.role)
            reasons.append(c.finish_reason)
    assert "".join(pieces) == choice.message.content
    assert roles[0] == "assistant" and set(roles[1:]) <= {None}
    assert reasons[-1] == choice.finish_reason and set(reasons[:-1]) <= {None}
    assert usage[:-1] == [None] * (len(usage) - 1)
    assert usage[-1].prompt_tokens == len(prompt)
    assert usage[-1].completion_tokens == answer.usage.completion_tokens


async def test_sse_chunks_end_with_done(server: Server) -> None:
    url = f"http://127.0.0.1:{server.http_port}/v1/completions"
    body = {"model": "tiny", "prompt": "a dog", "max_tokens": 3, "stream": True}
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(url, json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [block for block in response.text.replace("\r\n", "\n").split("\n\n") if block.strip()]
    data = [
        line[len("data: ") :] for block in events for line in block.split("\n") if line.startswith("data: ")
    ]
    assert data[-1] == "[DONE]"
    assert len(data) >= 2


async def test_sampling_is_repeatable_with_a_seed_and_n_choices_differ(server: Server, api: Any) -> None:
    ask = {
        "model": "tiny",
        "prompt": "the lazy dog",
        "max_tokens": 16,
        "temperature": 1.0,
        "top_p": 0.9,
        "seed": 3,
    }
    first = await api.completions.create(n=3, **ask)
    again = await api.completions.create(n=3, **ask)
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in again.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert len(set(texts)) > 1
    top_k = await api.completions.create(n=2, extra_body={"top_k": 1}, **ask)
    assert top_k.choices[0].text == top_k.choices[1].text  # top_k 1 is greedy whatever the seed


async def test_stop_strings_end_the_text_before_them_streamed_too(server: Server, api: Any) -> None:
    for prompt in sentences(20, seed=11):  # one whose greedy text is long enough to cut
        _, text, _ = await greedy(api, "tiny", prompt, 40, stream=False)
        if len(text) >= 12:
            break
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = text[: text.index(stop)]
    ask = {"model": "tiny", "prompt": prompt, "max_tokens": 40, "temperature": 0}
    answer = await api.completions.create(stop=[stop, "never said"], **ask)
    assert answer.choices[0].text == cut and answer.choices[0].finish_reason == "stop"
    streamed = ""
    async for chunk in await api.completions.create(stop=stop, stream=True, **ask):
        streamed += chunk.choices[0].text
        assert stop not in streamed
    assert streamed == cut


async def test_min_tokens_ignore_eos_and_stop_token_ids(server: Server, tiny_llm: Path, api: Any) -> None:
    prompt = "the cat sings"
    expected = reference(tiny_llm, prompt, 20)
    stop_id = expected[3]
    answer = await api.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=20,
        temperature=0,
        extra_body={"stop_token_ids": [stop_id], "return_token_ids": True},
    )
    ids = answer.choices[0].model_extra["token_ids"]
    assert ids == expected[: expected.index(stop_id) + 1] and answer.choices[0].finish_reason == "stop"
    long = await api.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=30,
        temperature=0,
        extra_body={
            "ignore_eos": True,
            "min_tokens": 30,
            "stop_token_ids": [stop_id],
            "return_token_ids": True,
        },
    )
    ids = long.choices[0].model_extra["token_ids"]
    assert len(ids) == 30 and long.choices[0].finish_reason == "length"
    assert stop_id not in ids and long.usage.completion_tokens == 30


async def test_logprobs_are_the_raw_log_softmax(server: Server, api: Any) -> None:
    answer = await api.completions.create(
        model="tiny", prompt="a fox", max_tokens=5, temperature=0, logprobs=3
    )
    logprobs = answer.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        # greedy: the most likely (tokens that decode alike share one key of the dict)
        assert chosen <= 0 and chosen >= max(top.values()) - 1e-6
    assert logprobs.text_offset[0] == 0
    chat = await api.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 2 for c in content)
    assert all(c.logprob == pytest.approx(c.top_logprobs[0].logprob) for c in content)
    assert all(np.exp([t.logprob for t in c.top_logprobs]).sum() <= 1.0 + 1e-6 for c in content)


async def test_embeddings_float_and_base64(server: Server, api: Any) -> None:
    floats = await api.embeddings.create(
        model="embedder", input=["a cat", "the lazy dog runs"], encoding_format="float"
    )
    assert [d.index for d in floats.data] == [0, 1]
    assert len(floats.data[0].embedding) == 64
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0
    default = await api.embeddings.create(model="embedder", input="a cat")  # the client asks for base64
    # alone, or padded beside a longer text: the same vector up to float rounding
    assert default.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-5)
    url = f"http://127.0.0.1:{server.http_port}/openai/v1/embeddings"
    async with httpx.AsyncClient(timeout=30) as http:
        raw = (
            await http.post(url, json={"model": "embedder", "input": "a cat", "encoding_format": "base64"})
        ).json()
    vector = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert vector.tolist() == pytest.approx(default.data[0].embedding, rel=1e-6)  # the same bytes


async def test_models_serve_openai_and_kserve_clients(server: Server, api: Any, kserve_api: Any) -> None:
    listed = await api.models.list()
    assert sorted(m.id for m in listed.data) == ["embedder", "narrow", "tiny"]
    assert (await api.models.retrieve("tiny")).id == "tiny"
    assert (await kserve_api.models.retrieve("tiny")).id == "tiny"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as http:
        kserve = (await http.get("/v1/models")).json()
        assert kserve["models"] == ["embedder", "narrow", "tiny"]
        one = (await http.get("/v1/models/tiny")).json()
        assert one["name"] == "tiny" and one["ready"] is True and one["id"] == "tiny"
        missing = await http.get("/openai/v1/models/nope")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


async def test_errors_have_openai_shape_and_status(server: Server, api: Any) -> None:
    with pytest.raises(openai.NotFoundError) as unknown:
        await api.completions.create(model="nope", prompt="x")
    assert unknown.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        await api.completions.create(model="tiny", prompt="the cat", max_tokens=1000)
    message = too_long.value.body["message"]
    assert "256" in message and "1000" in message
    assert too_long.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as bad:
        await api.completions.create(model="tiny", prompt="x", temperature=5)
    assert bad.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        await api.chat.completions.create(model="tiny", messages=[], max_tokens=2)
    async with httpx.AsyncClient(timeout=30) as http:
        broken = await http.post(f"http://127.0.0.1:{server.http_port}/v1/chat/completions", content=b"{nope")
    assert broken.status_code == 400 and set(broken.json()["error"]) == {"message", "type", "param", "code"}


async def test_a_client_that_goes_away_frees_its_slot(server: Server, api: Any) -> None:
    """A streamed completion whose client closes the connection after its first chunk leaves the
    running set (its cache freed) before the next step: the race is between the disconnect
    reaching the scheduler and the stream's next step."""
    entry = next(e for e in server.registry.entries() if e.name == "tiny")
    scheduler: Any = entry.scheduler
    stream = await api.completions.create(
        model="tiny",
        prompt="the cat",
        max_tokens=200,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    async for _ in stream:
        break
    await stream.close()
    model: Any = entry.model
    for _ in range(2000):  # it leaves the running set, then its cache is freed on the model's thread
        if scheduler.running == 0 and not model.cache.rows:
            break
        await asyncio.sleep(0.005)
    assert scheduler.running == 0
    assert model.cache.rows == [] and model.cache.tokens == 0


def _scrape(text: str, family: str, model: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(family + "{") and f'model_name="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_vllm_metrics_count_what_the_answers_report(server: Server, api: Any) -> None:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    async with httpx.AsyncClient(timeout=30) as http:
        before = (await http.get(url)).text
        answers = await asyncio.gather(
            *(
                api.completions.create(model="tiny", prompt=p, max_tokens=6 + i)
                for i, p in enumerate(sentences(5))
            )
        )
        chat = await api.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = [chunk.usage async for chunk in chat if chunk.usage is not None]
        after = (await http.get(url)).text
    prompt = sum(a.usage.prompt_tokens for a in answers) + usage[0].prompt_tokens
    generated = sum(a.usage.completion_tokens for a in answers) + usage[0].completion_tokens
    for family, expected in (
        ("vllm:prompt_tokens_total", prompt),
        ("vllm:generation_tokens_total", generated),
    ):
        assert _scrape(after, family, "tiny") - _scrape(before, family, "tiny") == expected
    ttft = "vllm:time_to_first_token_seconds_count"
    assert _scrape(after, ttft, "tiny") - _scrape(before, ttft, "tiny") == 6
    for family in ("vllm:inter_token_latency_seconds_count", "vllm:e2e_request_latency_seconds_count"):
        assert _scrape(after, family, "tiny") > _scrape(before, family, "tiny")
    assert 'vllm:num_requests_running{model_name="tiny",model_version=""} 0.0' in after
    assert 'vllm:num_requests_waiting{model_name="tiny",model_version=""} 0.0' in after
    assert 'vllm:prompt_tokens_total{model_name="embedder"' not in after  # language models only


async def test_streamed_choices_of_several_prompts_interleave_tagged_by_index(api: Any) -> None:
    ask = {"model": "tiny", "prompt": ["the cat", "a dog runs"], "n": 2, "max_tokens": 10, "seed": 9}
    whole = await api.completions.create(temperature=0.8, **ask)
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    async for chunk in await api.completions.create(temperature=0.8, stream=True, **ask):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason is not None:
                reasons[choice.index] = choice.finish_reason
    assert sorted(texts) == [0, 1, 2, 3] and sorted(reasons) == [0, 1, 2, 3]
    assert [texts[i] for i in range(4)] == [c.text for c in whole.choices]  # seeded: the same draws


async def test_langchains_openai_clients_as_the_docs_show_them(server: Server, api: Any) -> None:
    """docs/llm.md's LangChain snippet: ``ChatOpenAI`` (answered and streamed) and
    ``OpenAIEmbeddings`` (``check_embedding_ctx_length=False``) against this server."""
    langchain_openai = pytest.importorskip(
        "langchain_openai", reason="the docs' LangChain snippet is run with LangChain's own OpenAI client"
    )
    base = f"http://127.0.0.1:{server.http_port}/v1"
    messages = [{"role": "user", "content": "the cat"}]
    expected = await api.chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, temperature=0
    )
    floats = await api.embeddings.create(
        model="embedder", input=["a cat", "the lazy dog runs"], encoding_format="float"
    )
    async with httpx.AsyncClient(timeout=60) as http:  # closed here (LangChain's own would be left open)
        chat = langchain_openai.ChatOpenAI(
            base_url=base,
            api_key="unused",
            model="tiny",
            max_tokens=12,
            temperature=0,
            max_retries=0,
            http_async_client=http,
        )
        answered = await chat.ainvoke("the cat")
        streamed = [chunk.content async for chunk in chat.astream("the cat")]
        embeddings = langchain_openai.OpenAIEmbeddings(
            base_url=base,
            api_key="unused",
            model="embedder",
            check_embedding_ctx_length=False,
            http_async_client=http,
        )
        vectors = await embeddings.aembed_documents(["a cat", "the lazy dog runs"])
    assert answered.content == expected.choices[0].message.content
    assert answered.response_metadata["finish_reason"] == expected.choices[0].finish_reason
    assert answered.usage_metadata["input_tokens"] == expected.usage.prompt_tokens
    assert len(streamed) > 1 and "".join(streamed) == expected.choices[0].message.content
    assert [len(v) for v in vectors] == [64, 64]
    for vector, data in zip(vectors, floats.data, strict=True):
        assert vector == pytest.approx(data.embedding, abs=1e-5)
