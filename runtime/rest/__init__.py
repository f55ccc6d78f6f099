"""The REST transport (Starlette)."""

from .app import create_app

__all__ = ["create_app"]
