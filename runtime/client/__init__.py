"""Clients of a running server, over the wire: ``mlserver-like infer`` (``batch``)."""
