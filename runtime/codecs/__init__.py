"""Codecs: tensors and requests to Python values and back (MLServer's codec API)."""

from .content_types import decode_inference_request, input_codec
from .datetime import DatetimeCodec
from .decorator import decode_args
from .interfaces import InputCodec, RequestCodec
from .lookup import INPUT_CODECS, REQUEST_CODECS, find_input_codec, find_request_codec
from .numpy import NumpyCodec, NumpyRequestCodec
from .pandas import PandasCodec
from .string import Base64Codec, StringCodec, StringRequestCodec

__all__ = [
    "INPUT_CODECS",
    "REQUEST_CODECS",
    "Base64Codec",
    "DatetimeCodec",
    "InputCodec",
    "NumpyCodec",
    "NumpyRequestCodec",
    "PandasCodec",
    "RequestCodec",
    "StringCodec",
    "StringRequestCodec",
    "decode_args",
    "decode_inference_request",
    "find_input_codec",
    "find_request_codec",
    "input_codec",
]
