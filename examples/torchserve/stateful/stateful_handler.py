"""TorchServe's stateful example handler (sequence continuous batching), run here unchanged.

A running sum per sequence, kept in an LRU cache keyed by the sequence id:
- an even number adds to the sum and answers it (one answer);
- an odd number adds to the sum and streams it: the request stays in the batch and answers the sum
  again at every iteration (about once a second) until it has streamed ``STREAM_STEPS`` more times,
  or until a ``-1`` of the same sequence cancels it;
- ``-1`` cancels the sequence's running streams (answers -1);
- ``0`` ends the sequence: answers the sum with the response header ``ts_request_sequence_end``.
A JSON body ``{"input": n}`` is the number n.
"""

import logging
import time

from lru import LRU
from ts.context import Context
from ts.torch_handler.base_handler import BaseHandler

logger = logging.getLogger(__name__)


class StatefulHandler(BaseHandler):
    DEFAULT_CAPACITY = 10
    STREAM_STEPS = 10

    def __init__(self):
        super().__init__()
        self.cache = None

    def initialize(self, ctx: Context):
        """
        Loads the model and Initializes the necessary artifacts
        """
        ctx.cache = {}
        if ctx.model_yaml_config["handler"] is not None:
            self.cache = LRU(
                int(
                    ctx.model_yaml_config["handler"]
                    .get("cache", {})
                    .get("capacity", StatefulHandler.DEFAULT_CAPACITY)
                )
            )
        self.initialized = True

    def preprocess(self, data):
        """
        Preprocess function to convert the request input to a tensor(Torchserve supported format).
        The user needs to override to customize the pre-processing
        Args :
            data (list): List of the data from the request input.
        Returns:
            tensor: Returns the tensor data of the input
        """
        results = []
        for idx, row in enumerate(data):
            sequence_id = self.context.get_sequence_id(idx)
            # SageMaker sticky router relies on response header to identify the sessions
            # The sequence_id from request headers must be set in response headers
            self.context.set_response_header(idx, self.context.header_key_sequence_id, sequence_id)
            # check if sequence_id exists
            if self.context.get_request_header(idx, self.context.header_key_sequence_start):
                prev = 0
                self.context.cache[sequence_id] = {
                    "start": True,
                    "cancel": False,
                    "end": False,
                    "num_requests": 0,
                }
            elif self.cache.has_key(sequence_id):
                prev = int(self.cache[sequence_id])
            else:
                prev = None
                logger.error(f"Not received sequence_start request for sequence_id:{sequence_id} before")
            req_id = self.context.get_request_id(idx)
            # process a new request
            if req_id not in self.context.cache:
                logger.info(f"received a new request sequence_id={sequence_id}, request_id={req_id}")
                request = row.get("data") or row.get("body")
                if isinstance(request, (bytes, bytearray)):
                    request = request.decode("utf-8")
                self.context.cache[req_id] = {
                    "stopping_criteria": self._create_stopping_criteria(req_id=req_id, seq_id=sequence_id),
                    "stream": True,
                }
                self.context.cache[sequence_id]["num_requests"] += 1
                if type(request) is dict and "input" in request:
                    request = request.get("input")
                # -1: cancel
                if int(request) == -1:
                    self.context.cache[sequence_id]["cancel"] = True
                    self.context.cache[req_id]["stream"] = False
                    results.append(int(request))
                elif prev is None:
                    logger.info(f"Close the sequence:{sequence_id} without open session request")
                    self.context.cache[sequence_id]["end"] = True
                    self.context.cache[req_id]["stream"] = False
                    self.context.set_response_header(idx, self.context.header_key_sequence_end, sequence_id)
                    results.append(int(request))
                else:
                    val = prev + int(request)
                    self.cache[sequence_id] = val
                    # 0: end
                    if int(request) == 0:
                        self.context.cache[sequence_id]["end"] = True
                        self.context.cache[req_id]["stream"] = False
                        self.context.set_response_header(
                            idx, self.context.header_key_sequence_end, sequence_id
                        )
                    # non stream input:
                    elif int(request) % 2 == 0:
                        self.context.cache[req_id]["stream"] = False
                    results.append(val)
            else:
                # continue processing stream
                logger.info(f"received continuous request sequence_id={sequence_id}, request_id={req_id}")
                time.sleep(1)
                results.append(prev)
        return results

    def inference(self, data, *args, **kwargs):
        """The running sums are the answers: nothing to compute."""
        return data

    def postprocess(self, data):
        """The answers as they are; each request's stopping criteria tell TorchServe whether it
        streams on (False), sends its last chunk (True) or is a plain answer (None)."""
        self.context.stopping_criteria = [
            self.context.cache[req_id]["stopping_criteria"] for req_id in self.context.request_ids.values()
        ]
        return data

    def _forget(self, seq_id, req_id, end_sequence):
        """Drop the request's entry, and the sequence's once it ended and nothing of it runs."""
        self.context.cache.pop(req_id, None)
        sequence = self.context.cache.get(seq_id)
        if sequence is None:
            return
        sequence["num_requests"] -= 1
        if end_sequence and sequence["num_requests"] <= 0:
            del self.context.cache[seq_id]
            self.cache.pop(seq_id, None)

    def _create_stopping_criteria(self, req_id, seq_id):
        handler = self
        steps_left = [self.STREAM_STEPS]

        def stopping_criteria(res):
            sequence = handler.context.cache[seq_id]
            request = handler.context.cache[req_id]
            if sequence["end"]:
                handler._forget(seq_id, req_id, True)
                return True if request["stream"] else None
            if sequence["cancel"]:
                if not request["stream"]:  # the cancel request itself: the cancel is done
                    sequence["cancel"] = False
                    handler._forget(seq_id, req_id, False)
                    return None
                handler._forget(seq_id, req_id, False)
                return True
            if not request["stream"]:
                handler._forget(seq_id, req_id, False)
                return None
            if steps_left[0] == 0:
                handler._forget(seq_id, req_id, False)
                return True
            steps_left[0] -= 1
            return False

        return stopping_criteria
