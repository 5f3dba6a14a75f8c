"""`znni view OUTPUT [--input INPUT]`: a neuroglancer link showing a job's input and output.

Neuroglancer reads s3://, gs:// and http(s):// sources itself. Local volumes are served
read-only on 127.0.0.1 by `--serve` while the command runs (GET and HEAD of files under
the named volumes only; the CORS header only for the neuroglancer origin), each under
/input or /output; without --serve the link names the same URLs and one line says how to
serve them.
"""

from __future__ import annotations

import argparse
import sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from znni.engine.location import Location

DEFAULT_PORT = 9017
ORIGIN = "https://neuroglancer-demo.appspot.com"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("view", help="print a neuroglancer link showing an output (and input)")
    p.add_argument("output", help="the output: a Zarr array, OME-Zarr image or precomputed:// "
                   "volume (local, s3://, gs:// or https://)")
    p.add_argument("--input", help="the input to show under it, as an image layer")
    p.add_argument("--level", "--mip", type=int, help="the input's level or scale shown")
    p.add_argument("--serve", action="store_true", help="serve local volumes read-only on "
                   "127.0.0.1 while this runs (Ctrl-C stops)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"--serve's port (default {DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="s3:// and gs:// URLs: as for znni segment")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from znni.engine.io.stores import context_for, parse_storage_options
    from znni.engine.location import Location
    from znni.engine.output.viewer import view_state, viewable, viewer_url

    source = Location.parse(args.input, "input") if args.input is not None else None
    output = Location.parse(args.output, "output")
    paths = [p for p in (source, output) if p is not None]
    ctx = context_for(paths, parse_storage_options(args.storage_option))
    input_path = source if args.level is None or source is None \
        else _level(source, args.level, ctx)
    local = {role: p for role, p in (("input", input_path), ("output", output))
             if p is not None and not viewable(p)}
    server = _server(local, args.port) if args.serve and local else None
    port = server.server_address[1] if server is not None else args.port
    served = {p: f"http://127.0.0.1:{port}/{role}" for role, p in local.items()}
    try:
        state = view_state(output, input_path, ctx=ctx, served=served)
    except BaseException:
        if server is not None:
            server.server_close()
        raise
    print(viewer_url(state), flush=True)
    if local and server is None:
        shown = ", ".join(map(str, local.values()))
        print(f"local volumes ({shown}): rerun with --serve to serve them "
              f"on 127.0.0.1:{port} while neuroglancer reads them", file=sys.stderr)
    if server is not None:
        shown = ", ".join(map(str, local.values()))
        print(f"serving {shown} read-only on 127.0.0.1:{port}; Ctrl-C stops",
              file=sys.stderr, flush=True)
        import signal

        # Ctrl-C and SIGTERM end the serving, also where SIGINT came ignored (a child of a
        # process that ignores it, e.g. a test runner's worker: Python then installs none)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.default_int_handler)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0


def _level(path: Location, level: int, ctx: Any) -> Location:
    from znni.engine.io.ome import level_path

    return level_path(path, level, ctx=ctx)


def _server(roots: dict[str, Location], port: int) -> ThreadingHTTPServer:
    """A read-only file server on 127.0.0.1 for the volumes in `roots` (by URL prefix)."""
    dirs = {role: Path(p.bare().url).resolve() for role, p in roots.items()}
    for role, d in dirs.items():
        if not d.is_dir():
            raise ValueError(f"{role} {roots[role]} is not a local directory to serve")

    class Handler(VolumeHandler):
        volumes = dirs

    try:
        return ThreadingHTTPServer(("127.0.0.1", port), Handler)
    except OSError as e:
        raise ValueError(f"--port {port}: cannot serve on 127.0.0.1 ({e.strerror or e}); "
                         "choose another port, or 0 for any free one") from e


class VolumeHandler(SimpleHTTPRequestHandler):
    """GET and HEAD of files under the served volumes; nothing else, no listings."""

    volumes: dict[str, Path] = {}

    def translate_path(self, path: str) -> str:
        """/ROLE/rest -> the file under that volume, or '' (404) outside every volume."""
        from urllib.parse import unquote, urlsplit

        parts = [p for p in unquote(urlsplit(path).path).split("/") if p]
        if not parts or parts[0] not in self.volumes or ".." in parts:
            return ""
        root = self.volumes[parts[0]]
        target = root.joinpath(*parts[1:]).resolve()
        return str(target) if target.is_relative_to(root) and target.is_file() else ""

    def send_head(self) -> Any:
        if not self.translate_path(self.path):
            self.send_error(404, "not a file of a served volume")
            return None
        return super().send_head()

    def end_headers(self) -> None:
        if self.headers.get("Origin") == ORIGIN:  # only neuroglancer's pages may read these
            self.send_header("Access-Control-Allow-Origin", ORIGIN)
            self.send_header("Vary", "Origin")
        super().end_headers()

    def do_OPTIONS(self) -> None:  # noqa: N802 - the CORS preflight of a Range request
        self.send_response(204)
        if self.headers.get("Origin") == ORIGIN:
            self.send_header("Access-Control-Allow-Methods", "GET, HEAD")
            self.send_header("Access-Control-Allow-Headers", "Range")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass
