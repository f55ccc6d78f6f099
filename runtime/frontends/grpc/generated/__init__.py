"""Stubs generated from proto/dataplane.proto by scripts/generate_grpc.py. Do not edit by hand."""
