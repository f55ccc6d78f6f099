"""TorchServe's stateful example handler (sequence batching): a running sum per sequence.

The sum of each sequence lives in an LRU cache keyed by ``context.get_sequence_id(idx)``; the
request that starts a sequence (header ``ts_request_sequence_start``) starts from 0.
"""

import logging

from lru import LRU
from ts.context import Context
from ts.torch_handler.base_handler import BaseHandler

logger = logging.getLogger(__name__)


class StatefulHandler(BaseHandler):
    DEFAULT_CAPACITY = 10

    def __init__(self):
        super().__init__()
        self.cache = None

    def initialize(self, ctx: Context):
        """
        Loads the model and Initializes the necessary artifacts
        """
        # no super().initialize(ctx): the running sum needs no model file (BaseHandler's would
        # refuse an archive without --serialized-file, as the documents' archiver line makes)
        self.context = ctx
        if self.context.model_yaml_config["handler"] is not None:
            self.cache = LRU(int(self.context.model_yaml_config["handler"]["cache"]["capacity"]))
        else:
            self.cache = LRU(StatefulHandler.DEFAULT_CAPACITY)
        self.initialized = True

    def preprocess(self, data):
        """One running sum per row: the sequence's previous sum plus this request's number."""
        results = []
        for idx, row in enumerate(data):
            sequence_id = self.context.get_sequence_id(idx)
            prev = 0
            starts = self.context.get_request_header(idx, self.context.header_key_sequence_start)
            if not starts and self.cache.has_key(sequence_id):
                prev = int(self.cache[sequence_id])
            request = row.get("data") or row.get("body")
            if isinstance(request, (bytes, bytearray)):
                request = request.decode("utf-8")
            val = prev + int(request)
            self.cache[sequence_id] = val
            results.append(val)
        return results

    def inference(self, data, *args, **kwargs):
        return data

    def postprocess(self, data):
        return data
