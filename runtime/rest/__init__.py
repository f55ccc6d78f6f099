"""The REST transport (Starlette)."""

from runtime.server.rest_app import create_app

__all__ = ["create_app"]
