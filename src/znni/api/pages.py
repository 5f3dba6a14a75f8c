"""The dashboard's files: `GET /` (index.html) and `GET /static/NAME`, from `static/` in the
package. No job data is ever in them: the page's script reads everything from /v1 with
the bearer token the user gives it, so these routes need none.

Every answer carries a strict Content-Security-Policy: scripts and styles only from this
server's own files (no inline code, no eval), images from here or blobs the script made
(the preview PNG, fetched with the token), requests only to this server, no plugins, no
framing, no <base> and no form posts (the token form is handled by the script).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, HTTPException, status
from fastapi import Path as PathParam
from fastapi.responses import Response

STATIC = Path(__file__).parent / "static"
CONTENT_TYPES = {
    "html": "text/html; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "svg": "image/svg+xml",
    "png": "image/png",
}
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}\.(html|js|css|svg|png)")
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",  # revalidated, so an upgraded server's files are used
}

router = APIRouter(include_in_schema=False)


def static_file(name: str) -> Response:
    """A file of `static/` by its plain name (no directories), with the dashboard headers."""
    match = NAME.fullmatch(name)
    path = STATIC / name
    if match is None or not path.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no dashboard file {name!r}",
                            headers=HEADERS)
    return Response(path.read_bytes(), media_type=CONTENT_TYPES[match[1]], headers=HEADERS)


@router.get("/")
def dashboard() -> Response:
    """The dashboard: a page without data; its script fetches /v1 (with the token)."""
    return static_file("index.html")


@router.get("/static/{name}")
def static(name: Annotated[str, PathParam(max_length=80)]) -> Response:
    return static_file(name)
