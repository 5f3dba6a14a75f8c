"""Confining user-given paths to the data root (after resolving symlinks)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath


def confine(root: Path, user_path: str, what: str, *, must_exist: bool = False) -> Path:
    """Resolve `user_path` (relative to `root`) and refuse anything that leaves `root`.

    Refused: empty paths, absolute paths, home-relative paths, any '..' component,
    NUL bytes, and paths that a symlink leads outside the (already resolved) root.
    """
    if not isinstance(user_path, str) or not user_path.strip():
        raise ValueError(f"{what} path must be a non-empty path relative to the data root")
    if "\x00" in user_path:
        raise ValueError(f"{what} path {user_path!r} contains a NUL byte")
    pure = PurePosixPath(user_path)
    drive = bool(pure.parts) and ":" in pure.parts[0]  # C:/x on a client that meant Windows
    if pure.is_absolute() or user_path.startswith(("~", "\\")) or drive:
        raise ValueError(
            f"{what} path {user_path!r} is absolute; give a path relative to the data root"
        )
    if ".." in pure.parts:
        raise ValueError(
            f"{what} path {user_path!r} contains '..'; paths may not leave the data root"
        )
    resolved = (root / pure).resolve(strict=False)
    if resolved != root and not resolved.is_relative_to(root):
        raise ValueError(f"{what} path {user_path!r} leads outside the data root (via a symlink)")
    if resolved == root:
        raise ValueError(f"{what} path {user_path!r} is the data root itself, not an array in it")
    if must_exist and not resolved.exists():
        raise ValueError(f"{what} path {user_path!r} does not exist under the data root")
    return resolved


def relative_to_root(root: Path, text: str) -> str:
    """Hide the server's absolute data root in messages shown to clients."""
    prefix = str(root).rstrip("/") + "/"
    return text.replace(prefix, "")
