"""Google's credential checks, which the GCS emulator lacks, in front of it.

fake-gcs-server accepts any credentials, so refused ones cannot be tested against it
alone. `TokenGate(emulator.endpoint).start()` listens on 127.0.0.1 and plays both of
Google's parts a service account meets:
- the OAuth token endpoint (`POST /token`, named as `token_uri` in the service account's
  key file, `service_account_file`): a JWT assertion from the account `ACCOUNT` gets an
  access token; any other account gets OAuth's 400 `invalid_grant`, as a deleted account
  or key does (the assertion's signature is not checked);
- the JSON API's bearer check: a request whose `Authorization` is not `Bearer` and a token
  the endpoint handed out (while `accepting`) gets GCS's 401 "Invalid Credentials" (as a
  revoked token does); every other request goes to the emulator unchanged and its answer
  comes back.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import httpx

ACCOUNT = "znni-test@znni-test.iam.gserviceaccount.com"

# hop-by-hop headers, and those httpx has already applied to the body it hands back
DROPPED = {"connection", "keep-alive", "transfer-encoding", "content-encoding",
           "content-length", "host"}
INVALID = {"error": {"code": 401, "message": "Invalid Credentials", "errors": [
    {"message": "Invalid Credentials", "domain": "global", "reason": "authError",
     "locationType": "header", "location": "Authorization"}]}}


class TokenGate:
    """The token endpoint and bearer check on 127.0.0.1, the emulator behind them."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.token = uuid.uuid4().hex  # the access token the endpoint hands out
        self.accepting = True  # False: the token is refused, as a revoked one
        self.refused = 0  # requests answered 401 or 400
        self.forwarded = 0  # requests with the token, passed to the emulator
        self.server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> TokenGate:
        gate, client = self, httpx.Client(timeout=30.0)

        class Handler(BaseHTTPRequestHandler):
            def relay(self) -> None:
                if self.command == "POST" and self.path == "/token":
                    self.grant()
                    return
                if not gate.accepting or \
                        self.headers.get("Authorization") != f"Bearer {gate.token}":
                    gate.refused += 1
                    self.answer(401, {"Content-Type": "application/json",
                                      "WWW-Authenticate": 'Bearer realm="https://accounts.google.com/"'},
                                json.dumps(INVALID).encode())
                    return
                gate.forwarded += 1
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() not in DROPPED}
                r = client.request(self.command, gate.upstream + self.path, headers=headers,
                                   content=body)
                self.answer(r.status_code, {k: v for k, v in r.headers.items()
                                            if k.lower() not in DROPPED}, r.content)

            def grant(self) -> None:
                """OAuth's token endpoint for a JWT bearer grant (RFC 7523)."""
                form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
                claims = form.get("assertion", ["..."])[0].split(".")[1]
                issuer = json.loads(base64.urlsafe_b64decode(claims + "==")).get("iss")
                if issuer != ACCOUNT:
                    gate.refused += 1
                    self.answer(400, {"Content-Type": "application/json"}, json.dumps(
                        {"error": "invalid_grant", "error_description": "Invalid grant: "
                         "account not found"}).encode())
                    return
                self.answer(200, {"Content-Type": "application/json"}, json.dumps(
                    {"access_token": gate.token, "expires_in": 3600,
                     "token_type": "Bearer"}).encode())

            def answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = relay

            def log_message(self, *args: object) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def service_account_file(path: Path, token_uri: str, account: str = ACCOUNT) -> Path:
    """A service account's key file (Google's JSON format) with a fresh RSA key, whose
    tokens come from `token_uri`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "znni-test", "private_key_id": "1",
        "private_key": pem, "client_email": account, "client_id": "1",
        "token_uri": token_uri,
    }))
    return path
