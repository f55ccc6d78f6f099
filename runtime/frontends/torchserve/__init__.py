"""TorchServe's inference and management APIs (REST and gRPC) over the DataPlane; its archives and handlers are model-side, in ``runtime.torchserve``."""
