"""The management API: list, describe, register, scale, set-default and unregister models.

``operations`` holds the transport-free operations on the registry; ``app`` is the REST front
end in TorchServe's shape, on its own port; ``auth`` the key that guards it.
"""

from .api import create_management_app
from .auth import ManagementKey
from .operations import Management

__all__ = ["Management", "ManagementKey", "create_management_app"]
