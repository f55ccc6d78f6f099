"""The management REST API in TorchServe's shape (its own port, guarded by the management key): list, describe,
register, scale, set-default and unregister models, translated onto the core's management operations."""
