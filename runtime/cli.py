"""The command line: ``mlserver-like start FOLDER`` and ``mlserver-like infer``. Their flags are
derived from ``Settings`` and from the client's ``InferOptions``."""

from __future__ import annotations

import argparse
import gc
import sys
import types
import typing
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.version import __version__

if TYPE_CHECKING:
    from pydantic import BaseModel

    from runtime.settings import Settings

_SKIPPED = {"model_repository_root", "extensions", "logging_settings"}


def _flag_kwargs(annotation: Any) -> dict[str, Any] | None:
    """argparse options for a settings field, or None for fields only settings.json sets."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            return None
        annotation = args[0]
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if annotation in (int, float, str):
        return {"type": annotation}
    if typing.get_origin(annotation) is typing.Literal:
        return {"choices": list(typing.get_args(annotation))}
    if typing.get_origin(annotation) is list and typing.get_args(annotation) == (str,):
        return {"action": "append"}
    return None


def _size(text: str) -> int:
    """A size flag's bytes (``--models-memory-limit 150MiB``); argparse reports a bad one."""
    from runtime.settings_files import parse_size

    return parse_size(text)


_size.__name__ = "size"  # argparse's message: "invalid size value"


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    from runtime.settings import Settings

    add_model_flags(parser, Settings, skipped=_SKIPPED)


_INFER_SHORT = {
    "url": "-u",
    "model_name": "-m",
    "input_data_path": "-i",
    "output_data_path": "-o",
    "workers": "-w",
    "retries": "-r",
    "batch_size": "-s",
    "transport": "-t",
    "request_headers": "-H",
}
"""MLServer's short flags of ``mlserver infer``."""


def add_model_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    skipped: Collection[str] = (),
    short: Mapping[str, str] | None = None,
) -> None:
    """A flag per field of ``model`` that a flag can set (``--field-name``, and ``short``'s)."""
    from runtime.settings_files import SIZE_FIELDS

    for name, field in model.model_fields.items():
        if name in skipped:
            continue
        kwargs = {"type": _size} if name in SIZE_FIELDS else _flag_kwargs(field.annotation)
        if kwargs is None:
            continue
        help_text = (field.description or "").replace("%", "%%")
        if field.is_required():
            help_text += " [required]"
        else:
            help_text += f" [default: {field.default}]"
        flags = [f"--{name.replace('_', '-')}", *([short[name]] if short and name in short else [])]
        parser.add_argument(*flags, dest=name, default=None, help=help_text, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlserver-like",
        description="Serve the models of a folder over the Open Inference Protocol (REST and gRPC).",
    )
    parser.add_argument("--version", action="version", version=f"mlserver-like {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    start = commands.add_parser(
        "start",
        help="start the server on a folder of model-settings.json files",
        description=(
            "Start the server on FOLDER: every model-settings.json under it (recursively) is a model. "
            "Settings come from the flags, then FOLDER/settings.json (or --settings), then "
            "MLSERVER_* environment variables, then defaults."
        ),
    )
    start.add_argument("folder", metavar="FOLDER", help="the model repository")
    start.add_argument(
        "--settings", metavar="FILE", help="a settings.json to read instead of FOLDER/settings.json"
    )
    add_settings_flags(start)
    start.add_argument(
        "--disable-token-auth",
        dest="management_token_auth",
        action="store_const",
        const=False,
        help="TorchServe's spelling of --no-management-token-auth",
    )
    infer = commands.add_parser(
        "infer",
        help="send a file of V2 requests (one JSON per line) to a server, answers in input order",
        description=(
            "Send every line of the input file (a V2 inference request body) to MODEL on a running "
            'server and write the answers to the output file, line n answering line n ({"error": ...} '
            "for a line that failed). As MLServer's `mlserver infer`, with --resume, --model-version, "
            "--timeout and a progress bar."
        ),
    )
    from runtime.client.batch import InferOptions

    add_model_flags(infer, InferOptions, short=_INFER_SHORT)
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    from runtime.settings import SETTINGS_FILENAME, Settings

    folder = Path(args.folder)
    path = Path(args.settings) if args.settings else folder / SETTINGS_FILENAME
    if args.settings and not path.is_file():
        raise SystemExit(f"mlserver-like: settings file {path} not found")
    overrides = {
        name: getattr(args, name) for name in Settings.model_fields if getattr(args, name, None) is not None
    }
    overrides["model_repository_root"] = str(folder)
    return Settings.load(path, **overrides)


def main(argv: list[str] | None = None) -> int:
    # Start-up is mostly imports, whose objects live until exit: the cyclic collector stays off
    # while they run (its collections of the growing heap took about an eighth of the import time),
    # and what they made is moved out of its reach before serving (``gc.freeze``), so that the
    # collection at the end of start-up walks only what loading the models made.
    collecting = gc.isenabled()
    gc.disable()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command == "infer":
            from runtime.client.batch import InferOptions, run

            return run({name: getattr(args, name) for name in InferOptions.model_fields})
        if args.command != "start":
            parser.print_help()
            return 2
        if not Path(args.folder).is_dir():
            parser.error(f"model folder {args.folder!r} does not exist")
        try:
            settings = settings_from_args(args)
        except ValueError as exc:
            parser.error(str(exc))
        from runtime.logs import configure_logging
        from runtime.server.serving import serve

        gc.freeze()
    finally:
        if collecting:
            gc.enable()
    configure_logging(settings)
    _run(serve(settings))
    return 0


def _run(coro: Any) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it exists
        import asyncio

        asyncio.run(coro)
    else:
        uvloop.run(coro)


if __name__ == "__main__":
    sys.exit(main())
