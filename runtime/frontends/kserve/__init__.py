"""KServe V1 (``/v1/models/{name}:predict``) on the main REST port: a translator onto the DataPlane."""
