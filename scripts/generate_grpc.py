#!/usr/bin/env python3
"""Generate the Python stubs in runtime/frontends/grpc/generated/ from proto/*.proto.

    python3 scripts/generate_grpc.py            # rewrite runtime/frontends/grpc/generated/
    python3 scripts/generate_grpc.py --out DIR  # write them elsewhere (the drift test does)

Needs grpcio-tools at the exact version pinned in pyproject.toml's test extra, so that the output
is the same on every machine. protoc's output is then edited in two fixed ways:

- the gRPC module imports its messages relatively (``from . import dataplane_pb2``), since the
  stubs live in the package ``runtime.frontends.grpc.generated``;
- the messages are built in a descriptor pool of their own rather than protobuf's process-wide
  default pool. Triton's and MLServer's stubs declare the same ``inference.*`` messages, and the
  default pool refuses a second definition of a name: with a pool of its own, this server's stubs
  and tritonclient (or a model that calls a Triton server) can be imported in one process.

TorchServe's own protos (proto/torchserve/: ``inference.proto`` and ``management.proto``, packages
``org.pytorch.serve.grpc.*``) are compiled under their own file names, as TorchServe's clients
compile them, and written as ``ts_inference_pb2.py`` etc. They stay in the default pool: they
import ``google/protobuf/empty.proto`` and ``google/rpc/status.proto`` (googleapis-common-protos),
which live there, and a client's stubs made from the same files add identical definitions, which
the pool accepts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from importlib.resources import files
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
TORCHSERVE_PROTO_DIR = PROTO_DIR / "torchserve"
TORCHSERVE_PREFIX = "ts_"
OUT_DIR = ROOT / "runtime" / "frontends" / "grpc" / "generated"

_DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_OWN_POOL = "DESCRIPTOR = _descriptor_pool.DescriptorPool().AddSerializedFile("


def generate(out_dir: Path) -> list[Path]:
    """Write the stubs of every proto/*.proto and proto/torchserve/*.proto into ``out_dir``."""
    protos = sorted(PROTO_DIR.glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files in {PROTO_DIR}")
    written = _compile(PROTO_DIR, protos, out_dir, own_pool=True, prefix="")
    torchserve = sorted(TORCHSERVE_PROTO_DIR.glob("*.proto"))
    written += _compile(TORCHSERVE_PROTO_DIR, torchserve, out_dir, own_pool=False, prefix=TORCHSERVE_PREFIX)
    return written


def _compile(folder: Path, protos: list[Path], out_dir: Path, own_pool: bool, prefix: str) -> list[Path]:
    from grpc_tools import protoc

    well_known = str(files("grpc_tools") / "_proto")
    import google.rpc.status_pb2  # googleapis-common-protos: google/rpc/status.proto lies beside it

    googleapis = str(Path(google.rpc.status_pb2.__file__).parent.parent.parent)
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{folder}",
            f"-I{well_known}",
            f"-I{googleapis}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(p.name for p in protos),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for path in sorted(Path(tmp).iterdir()):
            text = _post_process(path.name, path.read_text(), [p.stem for p in protos], own_pool, prefix)
            target = out_dir / (prefix + path.name)
            target.write_text(text)
            written.append(target)
    return written


def _post_process(name: str, text: str, stems: list[str], own_pool: bool = True, prefix: str = "") -> str:
    if name.endswith("_pb2.py"):
        if own_pool:
            if text.count(_DEFAULT_POOL) != 1:
                raise SystemExit(f"{name}: protoc's output changed shape; update scripts/generate_grpc.py")
            text = text.replace(_DEFAULT_POOL, _OWN_POOL)
    elif name.endswith("_pb2_grpc.py"):
        for stem in stems:
            text = text.replace(f"\nimport {stem}_pb2 as ", f"\nfrom . import {prefix}{stem}_pb2 as ")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="folder to write the stubs into")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
