"""The REST transport (Starlette)."""

from .asgi import create_app

__all__ = ["create_app"]
