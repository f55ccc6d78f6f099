"""Streams through the core: the one pipeline (``pipeline``), client streams whose requests
each name their model (``client_streams``, gRPC ModelStreamInfer) and the count of streams
running, with the end of the server's grace period for them (``stream_counter``)."""
