"""The transport-free core: the DataPlane, the registry of models, request checks, management operations."""
