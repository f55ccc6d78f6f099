"""Streams through the core: the one pipeline (``pipeline``) and client streams whose requests
each name their model (``client_streams``, gRPC ModelStreamInfer)."""
