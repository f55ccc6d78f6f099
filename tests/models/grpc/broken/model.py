"""Broken: fails to load, so that its state and reason show in the repository index."""

from runtime import MLModel


class Broken(MLModel):
    async def load(self) -> bool:
        raise RuntimeError("broken on purpose")
