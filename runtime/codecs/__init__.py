"""Codecs: tensors and requests to Python values and back (MLServer's codec API)."""

from runtime.codecs.decorator import decode_args
from runtime.codecs.interfaces import InputCodec, RequestCodec
from runtime.codecs.lookup import INPUT_CODECS, REQUEST_CODECS, find_input_codec, find_request_codec
from runtime.codecs.numpy import NumpyCodec, NumpyRequestCodec
from runtime.codecs.string import Base64Codec, StringCodec, StringRequestCodec

__all__ = [
    "INPUT_CODECS",
    "REQUEST_CODECS",
    "Base64Codec",
    "InputCodec",
    "NumpyCodec",
    "NumpyRequestCodec",
    "RequestCodec",
    "StringCodec",
    "StringRequestCodec",
    "decode_args",
    "find_input_codec",
    "find_request_codec",
]
