"""The Open Inference Protocol over gRPC (grpc.aio), translating to and from the DataPlane only."""
