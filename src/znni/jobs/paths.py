"""Confining user-given paths to the data root (after resolving symlinks), and URLs to the
prefixes the operator allows (`znni serve --allow-url`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

URL_RE = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*)://([^/?#\s]+)(/[^?#\s]*)?")
URL_SCHEMES = ("s3", "gs", "gcs", "http", "https")


def looks_like_url(user_path: str) -> bool:
    return isinstance(user_path, str) and "://" in user_path


def check_url_prefix(prefix: str) -> str:
    """An operator's --allow-url prefix, checked and without a trailing slash."""
    m = URL_RE.fullmatch(prefix.strip())
    if m is None or m.group(1).lower() not in URL_SCHEMES:
        raise ValueError(
            f"allowed URL prefix {prefix!r} is not an s3://, gs:// or http(s):// URL "
            "(e.g. s3://bucket/prefix)"
        )
    parts = (m.group(3) or "").split("/")
    if ".." in parts or "." in parts:
        raise ValueError(f"allowed URL prefix {prefix!r} contains '.' or '..'")
    return prefix.strip().rstrip("/")


def confine_url(allowed: Sequence[str], user_url: str, what: str) -> str:
    """`user_url` when it lies under one of the `allowed` prefixes (whole path segments);
    else ValueError. Refused: queries, fragments, '.' or '..' segments, empty segments."""
    m = URL_RE.fullmatch(user_url)
    if "\x00" in user_url or m is None or m.group(1).lower() not in URL_SCHEMES:
        raise ValueError(
            f"{what} {user_url!r} is not a path under the data root nor an s3://, gs:// or "
            "http(s):// URL"
        )
    segments = (m.group(3) or "/").split("/")[1:]
    if any(s in ("", ".", "..") for s in segments[:-1]) or segments[-1] in (".", ".."):
        raise ValueError(f"{what} URL {user_url!r} has an empty, '.' or '..' path segment")
    url = user_url.rstrip("/")
    for prefix in allowed:
        if url == prefix or url.startswith(prefix + "/"):
            if url == prefix:
                break  # the prefix itself is a location, not an array in it
            return url
    raise ValueError(
        f"{what} URL {user_url!r} is outside the URL prefixes this server allows"
        + ("" if allowed else " (it allows none; see znni serve --allow-url)")
    )


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
