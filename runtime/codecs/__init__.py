"""Codecs: tensors and requests to Python values and back (MLServer's codec API)."""

from runtime.codecs.content_types import decode_inference_request, input_codec
from runtime.codecs.datetime import DatetimeCodec
from runtime.codecs.decorator import decode_args
from runtime.codecs.interfaces import InputCodec, RequestCodec
from runtime.codecs.lookup import INPUT_CODECS, REQUEST_CODECS, find_input_codec, find_request_codec
from runtime.codecs.numpy import NumpyCodec, NumpyRequestCodec
from runtime.codecs.pandas import PandasCodec
from runtime.codecs.string import Base64Codec, StringCodec, StringRequestCodec

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
