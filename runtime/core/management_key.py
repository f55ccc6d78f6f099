"""Token authorization of the management API (TorchServe 0.11's answer to CVE-2023-43654).

At start the server generates a random key and writes it to a key file that only its own user
can read (mode 0600, in a private folder unless ``management_key_file`` names one); every
management request must carry ``Authorization: Bearer <key>``. The file is removed at stop.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import string
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

_KEY_ALPHABET = string.ascii_letters + string.digits

AUTH_FAILED = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"
"""TorchServe's answer to a request without the management key (REST and gRPC)."""


class ManagementKey:
    """The management key and its file."""

    def __init__(self, path: str = "") -> None:
        # letters and digits only (190 bits): a key that began with "-" would read as an option
        # when passed on a command line (`--auth-token KEY`)
        self.key = "".join(secrets.choice(_KEY_ALPHABET) for _ in range(32))
        if path:
            self.path = Path(path)
            self._folder: Path | None = None
        else:
            self._folder = Path(tempfile.mkdtemp(prefix="mlserver-like-"))  # mode 0700
            self.path = self._folder / "key_file.json"

    def write(self) -> None:
        """Write the key file, readable and writable by this user only."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)
            json.dump({"management": {"key": self.key}}, f)
        logger.info("Management API key written to %s", self.path)

    def remove(self) -> None:
        try:
            self.path.unlink()
            if self._folder is not None:
                self._folder.rmdir()
        except OSError:
            pass

    def allows(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header carries the key (compared in constant time)."""
        if not authorization:
            return False
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(token.strip().encode(), self.key.encode())
