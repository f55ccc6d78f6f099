"""Run torch-model-archiver as its command does, in this process, safely beside other tests.

``torch-model-archiver ARGS`` parses its arguments and packages the model
(``model_archiver.model_packaging``); the same two steps run here, without starting a Python
process for each archive. The archiver stages each model in ``$TMPDIR/<model name>`` and deletes
that folder when it is done, so two processes archiving a model of the same name at once (the
suite runs on several) would take each other's staging folder away: each run here gets a staging
folder of its own.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import threading
import warnings

with warnings.catch_warnings():
    # the archiver's package reads its version.txt without closing it (a ResourceWarning)
    warnings.simplefilter("ignore", ResourceWarning)
    from model_archiver.arg_parser import ArgParser
    from model_archiver.model_archiver_error import ModelArchiverError
    from model_archiver.model_packaging import package_model
    from model_archiver.model_packaging_utils import ModelExportUtils

_one_at_a_time = threading.Lock()  # the arguments and the staging folder are process-wide


def run_model_archiver(*args: str) -> None:
    """``torch-model-archiver *args``; raises with the archiver's message if it fails."""
    errors = io.StringIO()
    with _one_at_a_time, tempfile.TemporaryDirectory(prefix="archiver-") as staging:
        argv, tempdir = sys.argv, tempfile.tempdir
        sys.argv, tempfile.tempdir = ["torch-model-archiver", *args], staging
        try:
            with contextlib.redirect_stderr(errors):
                config = ArgParser.export_model_args_parser()  # parses sys.argv, as the command
            package_model(config, manifest=ModelExportUtils.generate_manifest_json(config))
        except SystemExit as exc:  # argparse refused the arguments (its message is on stderr)
            raise RuntimeError(f"torch-model-archiver failed ({exc.code}):\n{errors.getvalue()}") from None
        except ModelArchiverError as exc:
            raise RuntimeError(f"torch-model-archiver failed: {exc}") from exc
        finally:
            sys.argv, tempfile.tempdir = argv, tempdir
