"""The management API: list, describe, register, scale, set-default and unregister models.

``operations`` holds the transport-free operations on the registry; ``app`` is the REST front
end in TorchServe's shape, on its own port; ``auth`` the key that guards it.
"""

from runtime.frontends.management.api import create_management_app
from runtime.core.management_key import ManagementKey
from runtime.core.management import Management

__all__ = ["Management", "ManagementKey", "create_management_app"]
