"""The management API's key (``runtime.core.management_key``): which headers carry it, and its file."""

from __future__ import annotations

import stat
from pathlib import Path

from runtime.core.management_key import ManagementKey


def test_only_a_bearer_header_with_the_key_is_allowed(tmp_path: Path) -> None:
    key = ManagementKey(str(tmp_path / "key.json"))
    assert key.allows(f"Bearer {key.key}") and key.allows(f"bearer {key.key} ")
    for header in (
        None,
        "",
        key.key,
        f"Basic {key.key}",
        "Bearer ",
        f"Bearer {key.key[:-1]}",
        f"Bearer {key.key}x",
    ):
        assert not key.allows(header), header


def test_without_a_path_the_file_lies_in_a_private_folder_removed_with_it() -> None:
    key = ManagementKey()
    key.write()
    folder = key.path.parent
    try:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(key.path.stat().st_mode) == 0o600
    finally:
        key.remove()
    assert not key.path.exists() and not folder.exists()
    key.remove()  # twice is harmless


def test_a_named_file_is_made_with_its_folders_and_its_folder_is_kept(tmp_path: Path) -> None:
    key = ManagementKey(str(tmp_path / "a" / "b" / "key.json"))
    key.write()
    assert key.key in key.path.read_text()
    key.remove()
    assert not key.path.exists() and key.path.parent.is_dir()
