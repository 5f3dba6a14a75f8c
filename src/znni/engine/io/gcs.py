"""What gs:// needs beyond fsspec's defaults (gcsfs), kept apart from `stores.py`.

- At a GCS emulator (STORAGE_EMULATOR_HOST, or an `endpoint_url` outside googleapis.com)
  znni opens gcsfs's plain JSON-API `gcsfs.core.GCSFileSystem`. Since 2025 `gcsfs` exports
  `ExtendedGcsFileSystem` by default, which first asks the endpoint over gRPC for each
  bucket's layout (zonal or hierarchical); an emulator speaks only the JSON API, so every
  lookup would wait out a 60 s gRPC retry and ask again on the next call.
- At an emulator the credentials default to anonymous (`token="anon"`), as Google's own
  client libraries do there: gcsfs's default search would otherwise ask the GCE metadata
  server, which an emulator's machine does not have. `--storage-option token=...` wins.
- A client's access token is fetched when the client is made (`refresh_credentials`):
  gcsfs would fetch it at its first request and retry a refused one there for about 33 s,
  as it retries every 401 (a token may have expired). Then one request with that fresh
  token, without retries (`check_token`): a 401 to a token fetched a moment ago means the
  store does not take it (revoked, or meant for another audience), not that it expired.
- gcsfs tries each request 6 times (about 31 s of backoff), a count it fixes when its class
  is defined; ZNNI_GCS_REQUEST_TRIES sets it per client (`set_request_tries`), e.g. for a
  test that waits for a dead endpoint to be given up on. Unset: gcsfs's own count.
"""

from __future__ import annotations

import os
import types
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from znni.engine.location import Location

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
REQUEST_TRIES_ENV = "ZNNI_GCS_REQUEST_TRIES"


def endpoint(options: Mapping[str, Any]) -> str | None:
    """The GCS endpoint the options (or the environment) name; None for Google's default."""
    value = options.get("endpoint_url") or os.environ.get(EMULATOR_ENV)
    return None if value in (None, "", "default") else str(value)


def is_emulator(options: Mapping[str, Any]) -> bool:
    """Whether gs:// requests go to an endpoint outside googleapis.com (an emulator)."""
    url = endpoint(options)
    if url is None:
        return False
    host = urlsplit(url if "://" in url else f"http://{url}").hostname or ""
    return not (host == "googleapis.com" or host.endswith(".googleapis.com"))


def gcs_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """gs:// options with anonymous credentials by default at an emulator."""
    return {"token": "anon", **options} if is_emulator(options) else dict(options)


def filesystem_class(options: Mapping[str, Any]) -> type[Any] | None:
    """gcsfs's JSON-API filesystem at an emulator; None: the class fsspec registers."""
    if not is_emulator(options):
        return None
    from gcsfs.core import GCSFileSystem

    return GCSFileSystem


def request_tries() -> int | None:
    """ZNNI_GCS_REQUEST_TRIES (at least 1); None where unset or not a number: gcsfs's own."""
    try:
        return max(1, int(os.environ[REQUEST_TRIES_ENV]))
    except (KeyError, ValueError):
        return None


def set_request_tries(fs: Any) -> None:
    """gcsfs's tries of each request of the client `fs`, from ZNNI_GCS_REQUEST_TRIES: its
    `_request`, unwrapped from gcsfs's `retry_request` and wrapped again with that count.
    Nothing where the variable is unset, or where gcsfs's request is not wrapped so."""
    n = request_tries()
    inner = getattr(getattr(type(fs), "_request", None), "__wrapped__", None)
    if inner is None or vars(fs).get("_znni_request_tries") == n:  # fsspec reuses fs
        return
    if n is None:
        vars(fs).pop("_request", None)
    else:
        from gcsfs.retry import retry_request

        fs._request = types.MethodType(retry_request(retries=n)(inner), fs)
    fs._znni_request_tries = n


def refresh_credentials(fs: Any) -> None:
    """Fetch the client's access token now; PermissionError when the token endpoint refuses
    the credentials for good (an unknown account, a deleted key). Anything retryable is left
    to gcsfs's own retries at the first request."""
    refresh = getattr(getattr(fs, "credentials", None), "maybe_refresh", None)
    if refresh is None:  # anonymous, or not gcsfs
        return
    try:
        refresh()
    except Exception as e:  # gcsfs re-raises a RefreshError as HttpError 401
        cause = e.__cause__ or e
        if type(cause).__name__ == "RefreshError" and not getattr(cause, "retryable", False):
            raise PermissionError(" ".join(str(cause).split())) from e


# a token check that gets no answer within this many seconds is left to the run's requests
CHECK_TIMEOUT_S = 10


def check_token(fs: Any, loc: Location) -> None:
    """One request for the URL's bucket with the client's fresh token and no retries, once
    per client and bucket; PermissionError when the store answers 401. Anonymous clients
    are not checked, and any other answer (403 for a token without bucket-level
    permission, an error, no answer) is left to the run's own requests."""
    creds = getattr(fs, "credentials", None)
    headers: dict[str, str] = {}
    bucket = loc.bucket
    checked = fs.__dict__.setdefault("_znni_checked_buckets", set())  # fsspec reuses fs
    if creds is None or getattr(creds, "credentials", None) is None or bucket in checked:
        return  # anonymous
    creds.apply(headers)
    if any(k.lower() == "authorization" for k in headers):
        request = urllib.request.Request(
            f"{fs._location}/storage/v1/b/{quote(bucket, safe='')}?fields=name",
            headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=CHECK_TIMEOUT_S):
                pass
        except urllib.error.HTTPError as e:
            if e.code == 401:
                raise PermissionError(
                    "the store answered 401 Invalid Credentials to a token fetched just "
                    "now (revoked, or not for this store)") from None
        except (OSError, ValueError):
            pass
    checked.add(bucket)
