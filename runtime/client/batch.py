"""``mlserver-like infer``: a file of V2 request bodies (one JSON document per line) sent to a
server, its answers written to another file, one line each, in input order.

- ``workers`` requests are in flight at once; with ``batch_size`` > 1, up to that many consecutive
  lines that can merge (:mod:`runtime.client.merge`) go as one request, and its answer is split
  back per line.
- A request the server cannot take now (503, UNAVAILABLE) or that does not reach it is retried up
  to ``retries`` times, after the server's ``Retry-After`` or, when it gave none, a doubling pause.
- Answers are written as soon as the answers of every line before them are: line ``n`` of the
  output answers line ``n`` of the input, and the file is flushed after each write, so a killed
  run loses only what was in flight. A line that is not a JSON object, or whose request failed, is
  answered in its place by ``{"error": "...", "parameters": {"batch_index": n}}``; an answer
  carries ``batch_index`` in its parameters as MLServer's does.
- ``resume`` keeps the complete lines of an existing output file (a line cut by a kill is dropped)
  and skips as many input lines.
- A progress bar on stderr when it is a terminal, and a summary at the end (sent, failed, req/s).

A client: it talks to the server over the wire and imports nothing of the server's core.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from runtime.client.merge import Body, merge, mergeable, split
from runtime.client.transport import GrpcTransport, Refused, RestTransport, Transport, TryLater
from runtime.field_docs import documented

FIRST_PAUSE = 0.1
"""Seconds before the first retry when the server gave no Retry-After (doubling, up to ``LONGEST_PAUSE``)."""
LONGEST_PAUSE = 10.0
"""The longest pause between two tries, whatever the server's Retry-After."""


@documented
class InferOptions(BaseModel):
    """The flags of ``mlserver-like infer`` (MLServer's names, and more)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    url: str = "localhost:8080"
    """The server: ``host:port`` (REST: its HTTP port; gRPC: its gRPC port), or an http:// URL."""

    model_name: str
    """The model the requests go to."""

    model_version: str | None = None
    """The model's version; unset: the server's default version."""

    input_data_path: str
    """The file of V2 inference request bodies, one JSON object per line."""

    output_data_path: str
    """Where the answers go, one JSON object per line, line n answering input line n."""

    workers: int = Field(default=10, ge=1)
    """Requests in flight at once."""

    retries: int = Field(default=3, ge=0)
    """Times a request is tried again after a 503 / UNAVAILABLE answer or a connection failure."""

    batch_size: int = Field(default=1, ge=1)
    """Consecutive lines merged into one request (along the first dimension of their inputs, when
    their inputs agree) and answered line by line."""

    transport: Literal["rest", "grpc"] = "rest"
    """Send over REST or gRPC."""

    timeout: float = Field(default=60.0, gt=0)
    """Seconds one request may take."""

    request_headers: list[str] = []
    """Headers (REST) or metadata (gRPC) sent with every request, as ``Name: value``."""

    resume: bool = False
    """Keep the answers already in the output file and send only the lines after them."""

    progress: bool | None = None
    """Show a progress bar on stderr; unset: when stderr is a terminal."""


@dataclass
class Summary:
    """What a run did."""

    lines: int = 0
    """Lines answered by this run (successes and failures)."""
    failed: int = 0
    """Lines answered by an error."""
    requests: int = 0
    """Requests sent (merged requests count once; retries do not count)."""
    retried: int = 0
    """Tries again after 503 / UNAVAILABLE or a connection failure."""
    skipped: int = 0
    """Lines already answered in the output file (``resume``)."""
    seconds: float = 0.0

    def line(self) -> str:
        rate = self.requests / self.seconds if self.seconds > 0 else 0.0
        lines_rate = self.lines / self.seconds if self.seconds > 0 else 0.0
        skipped = f", {self.skipped} already answered" if self.skipped else ""
        return (
            f"sent {self.lines} lines in {self.requests} requests ({self.retried} retried), "
            f"{self.lines - self.failed} answered, {self.failed} failed{skipped}, in {self.seconds:.2f} s: "
            f"{rate:.1f} req/s, {lines_rate:.1f} lines/s"
        )


@dataclass
class _Job:
    """Consecutive lines sent as one request (or answered at once: a line that does not parse)."""

    first: int
    bodies: list[Body] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)
    """Line index -> why it cannot be sent (it is then the only line of its job)."""


def answered_lines(path: Path) -> int:
    """The complete lines of an output file, after cutting an incomplete last one (a killed run's)."""
    if not path.exists():
        return 0
    with path.open("rb+") as file:
        data = file.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            file.truncate(end)
    return data.count(b"\n", 0, end)


def _headers(items: list[str]) -> dict[str, str]:
    headers = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"header {item!r} is not 'Name: value'")
        headers[name.strip()] = value.strip()
    return headers


def _jobs(lines: Iterator[bytes], first: int, batch_size: int) -> Iterator[_Job]:
    """The jobs of the input's lines from index ``first`` on."""
    job: _Job | None = None
    for index, raw in enumerate(lines, start=first):
        try:
            body = orjson.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("the line is not a JSON object")
        except ValueError as exc:
            if job is not None:
                yield job
                job = None
            yield _Job(index, errors={index: f"line {index + 1} is not a V2 request: {exc}"})
            continue
        if job is not None and len(job.bodies) < batch_size and mergeable(job.bodies[0], body):
            job.bodies.append(body)
            continue
        if job is not None:
            yield job
        job = _Job(index, [body])
    if job is not None:
        yield job


def _error(index: int, message: str) -> bytes:
    return orjson.dumps({"error": message, "parameters": {"batch_index": index}})


def _answer(index: int, answer: Body) -> bytes:
    parameters = answer.get("parameters")
    answer["parameters"] = {**(parameters if isinstance(parameters, dict) else {}), "batch_index": index}
    return orjson.dumps(answer)


class _Progress:
    """A one-line progress bar on a terminal."""

    def __init__(self, stream: IO[str], total: int | None, enabled: bool) -> None:
        self.stream, self.total, self.enabled = stream, total, enabled
        self._shown = 0.0

    def show(self, summary: Summary, started: float, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._shown < 0.2):
            return
        self._shown = now
        done = summary.lines
        rate = done / (now - started) if now > started else 0.0
        if self.total:
            width = 30
            filled = min(width, width * done // self.total)
            bar = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total}"
        else:
            bar = f"{done} lines"
        self.stream.write(f"\r{bar} {rate:.0f} lines/s, {summary.failed} failed ")
        self.stream.flush()

    def end(self) -> None:
        if self.enabled:
            self.stream.write("\n")


class BatchRun:
    """One run of ``mlserver-like infer`` (see the module docstring)."""

    def __init__(self, options: InferOptions, transport: Transport | None = None) -> None:
        self.options = options
        self.summary = Summary()
        self.transport = transport
        """Made in ``run``, in its event loop (a grpc.aio channel belongs to the loop it was made in)."""
        self._done: dict[int, tuple[bytes, bool]] = {}
        """Answers not written yet: line index -> (the line, whether it is an error)."""
        self._next = 0
        """The next line to write."""
        self._finished = False
        """Every job has been answered."""
        self._written = asyncio.Condition()

    async def run(
        self,
        inputs: IO[bytes],
        output: IO[bytes],
        skip: int = 0,
        total: int | None = None,
        stderr: IO[str] = sys.stderr,
    ) -> Summary:
        """Answer the lines of ``inputs`` after the first ``skip`` (already answered), appending to
        ``output``; ``total``: the input's lines, for the progress bar."""
        options = self.options
        transport = self.transport = self.transport or _transport(options)
        self.summary.skipped = skip
        shown = options.progress if options.progress is not None else stderr.isatty()
        progress = _Progress(stderr, total - skip if total is not None else None, shown)
        started = time.monotonic()
        self._next = skip
        queue: asyncio.Queue[_Job | None] = asyncio.Queue(maxsize=options.workers)
        # at most this many lines read past the last one written: a slow line holds the others' answers
        window = max(4 * options.workers * options.batch_size, 64)
        workers = [asyncio.create_task(self._work(queue)) for _ in range(options.workers)]
        writer = asyncio.create_task(self._write(output, progress, started))
        try:
            for job in _jobs(_lines(inputs, skip), skip, options.batch_size):
                await self._room(job.first, window)
                await queue.put(job)
            for _ in workers:
                await queue.put(None)
            await asyncio.gather(*workers)
            async with self._written:
                self._finished = True
                self._written.notify_all()
            await writer
        finally:
            for task in (*workers, writer):
                task.cancel()
            await transport.close()
        self.summary.seconds = time.monotonic() - started
        progress.show(self.summary, started, force=True)
        progress.end()
        return self.summary

    async def _room(self, first: int, window: int) -> None:
        """Wait until line ``first`` is within ``window`` lines of the next one to write."""
        async with self._written:
            await self._written.wait_for(lambda: first - self._next < window)

    async def _work(self, queue: asyncio.Queue[_Job | None]) -> None:
        while (job := await queue.get()) is not None:
            answers = await self._answer(job)
            async with self._written:
                self._done.update(answers)
                self._written.notify_all()

    async def _answer(self, job: _Job) -> dict[int, tuple[bytes, bool]]:
        if job.errors:
            return {i: (_error(i, message), True) for i, message in job.errors.items()}
        indexes = range(job.first, job.first + len(job.bodies))
        try:
            answer = await self._send(merge(job.bodies))
            return {
                i: (_answer(i, own), False) for i, own in zip(indexes, split(answer, job.bodies), strict=True)
            }
        except (Refused, ValueError) as exc:
            if len(job.bodies) == 1:
                return {job.first: (_error(job.first, str(exc)), True)}
            # a line spoils the merged request, or its answer cannot be split (a model whose outputs
            # do not keep the rows): each line alone then, so that only a bad one fails
            answers: dict[int, tuple[bytes, bool]] = {}
            for i, body in zip(indexes, job.bodies, strict=True):
                answers.update(await self._answer(_Job(i, [body])))
            return answers
        except TryLater as exc:
            return {i: (_error(i, str(exc)), True) for i in indexes}
        except Exception as exc:  # an answer that cannot be split, a client failure: in its place too
            return {i: (_error(i, f"{type(exc).__name__}: {exc}"), True) for i in indexes}

    async def _send(self, body: Body) -> Body:
        assert self.transport is not None  # made by run
        self.summary.requests += 1
        pause = FIRST_PAUSE
        for attempt in range(self.options.retries + 1):
            try:
                return await self.transport.infer(body)
            except TryLater as exc:
                if attempt == self.options.retries:
                    raise TryLater(f"{exc} (after {attempt + 1} tries)") from None
                self.summary.retried += 1
                wait = exc.retry_after if exc.retry_after is not None else pause
                await asyncio.sleep(min(wait, LONGEST_PAUSE))
                pause = min(pause * 2, LONGEST_PAUSE)
        raise AssertionError("unreachable")

    async def _write(self, output: IO[bytes], progress: _Progress, started: float) -> None:
        """Write answers in input order as soon as the ones before them are in; flush each time."""
        while True:
            async with self._written:
                await self._written.wait_for(lambda: self._next in self._done or self._finished)
                ready: list[bytes] = []
                failed = 0
                while self._next in self._done:
                    line, error = self._done.pop(self._next)
                    ready.append(line)
                    failed += error
                    self._next += 1
                last = self._finished and not self._done
                self._written.notify_all()  # the reader waits for room
            if ready:
                output.write(b"\n".join(ready) + b"\n")
                output.flush()
                self.summary.lines += len(ready)
                self.summary.failed += failed
                progress.show(self.summary, started)
            if last:
                return


def _transport(options: InferOptions) -> Transport:
    headers = _headers(options.request_headers)
    if options.transport == "grpc":
        return GrpcTransport(
            options.url, options.model_name, options.model_version, options.timeout, headers, 2**31 - 1
        )
    return RestTransport(
        options.url, options.model_name, options.model_version, options.workers, options.timeout, headers
    )


def _lines(file: IO[bytes], skip: int) -> Iterator[bytes]:
    """The input's lines after the first ``skip`` (a last line without a newline counts)."""
    for index, line in enumerate(file):
        if index >= skip:
            yield line.rstrip(b"\r\n")


def _count_lines(path: Path) -> int | None:
    """The lines of a regular file (for the progress bar), or None."""
    if not path.is_file():
        return None
    count, last = 0, b"\n"
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def run(arguments: dict[str, Any], stderr: IO[str] = sys.stderr) -> int:
    """Run ``mlserver-like infer`` with these options; the exit status: 0 when every line was
    answered, 1 when some were answered by an error, 2 for a bad option."""
    try:
        options = InferOptions(**{k: v for k, v in arguments.items() if v is not None})
        _headers(options.request_headers)
    except ValueError as exc:
        stderr.write(f"mlserver-like infer: {exc}\n")
        return 2
    if not Path(options.input_data_path).is_file():
        stderr.write(f"mlserver-like infer: input file {options.input_data_path} not found\n")
        return 2
    source, target = Path(options.input_data_path), Path(options.output_data_path)
    skip = answered_lines(target) if options.resume else 0
    with source.open("rb") as inputs, target.open("ab" if options.resume else "wb") as output:
        summary = asyncio.run(BatchRun(options).run(inputs, output, skip, _count_lines(source), stderr))
    stderr.write(summary.line() + "\n")
    return 1 if summary.failed else 0
