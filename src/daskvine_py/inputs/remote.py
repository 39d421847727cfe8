"""The servers an input comes from: one stat that names its content, one whole-file fetch.

Two kinds, each with the maintained client the analyses already use:

- ``root://``: XRootD, through the ``XRootD.client`` bindings (imported on first use):
  ``FileSystem.stat`` gives the size and modification time (and the checksum, where the
  server's extended stat carries one); the fetch opens the file, checks that the open
  copy is the one stated, and reads it in ``CHUNK`` pieces. Before the process's first
  client, ``configure_xrootd`` makes the client's own failures quick (``XROOTD_SETTINGS``):
  our retries, not the client's, decide how long a dead server is waited for.
- ``http://`` and ``https://``: ``urllib``: a HEAD gives ``Content-Length`` and
  ``Last-Modified`` and/or ``ETag``; the GET's own headers must say the same, or the copy
  changed in between.

Every failure is sorted into one of three: the file is not there (``FileNotFoundError``,
``PermissionError``, ``IsADirectoryError``: never retried), the server refused for good
(``Refused``: never retried), or anything another attempt may cure (``Transient``: the
server is down or went away, a timeout, a 5xx, a copy that changed mid-fetch).
"""

from __future__ import annotations

import errno
import http.client
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from daskvine_py.inputs.store import Identity

#: The URL schemes fetched into the cache.
SCHEMES = ("root", "http", "https")
#: Bytes asked for in one read: large enough that a request's latency is small beside
#: its transfer, small enough that a read's timeout is a fair bound on a stalled server.
CHUNK = 8 * 2**20

#: Called with the bytes of each piece read from a server (the counters').
Count = Callable[[int], None]

#: XRootD's own error numbers (XProtocol.hh) for what no retry cures
_KXR_NOT_AUTHORIZED = 3010
#: the client's status code (XrdClStatus.hh ``errAuthFailed``): no credentials the
#: server accepts (no proxy, an expired one, a CA it does not trust)
_XRDCL_AUTH_FAILED = 204
_KXR_NOT_FOUND = 3011
_KXR_IS_DIRECTORY = 3016


class Transient(Exception):
    """A failure another attempt may cure: the server is down or went away mid-fetch,
    a timeout, a server error, a copy that changed while it was fetched."""


class Refused(Exception):
    """A failure no retry cures: the server refuses the request, or reports nothing that
    tells one copy from another."""


def identify(url: str, timeout: float) -> Identity:
    """Ask ``url``'s server (one request) what names its content."""
    if urlsplit(url).scheme == "root":
        return _xrootd_identify(url, timeout)
    return _http_identify(url, timeout)


def fetch(url: str, identity: Identity, destination: str, timeout: float, count: Count) -> None:
    """Write the content ``identity`` names to ``destination``; ``Transient`` if the
    server's copy is no longer that one. The size is the caller's to check."""
    if urlsplit(url).scheme == "root":
        _xrootd_fetch(url, identity, destination, timeout, count)
    else:
        _http_fetch(url, identity, destination, timeout, count)


def not_found(url: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, "no such file on its server", url)


# -- HTTP ------------------------------------------------------------------------------

_IDENTITY = {"Accept-Encoding": "identity"}  # a compressed body's length is not the file's


def _http_identify(url: str, timeout: float) -> Identity:
    request = urllib.request.Request(url, method="HEAD", headers=_IDENTITY)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return _http_identity(url, response.headers)
    except urllib.error.HTTPError as exc:
        raise _http_failure(url, exc.code, exc.reason) from exc
    except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
        raise Transient(f"HEAD failed: {_reason(exc)}") from exc


def _http_fetch(
    url: str, identity: Identity, destination: str, timeout: float, count: Count
) -> None:
    request = urllib.request.Request(url, headers=_IDENTITY)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise _http_failure(url, exc.code, exc.reason) from exc
    except (OSError, http.client.HTTPException) as exc:
        raise Transient(f"GET failed: {_reason(exc)}") from exc
    with response, open(destination, "wb") as file:
        if _http_identity(url, response.headers) != identity:
            raise Transient("the server's copy changed between the HEAD and the GET")
        while True:
            try:
                piece = response.read(CHUNK)
            except (OSError, http.client.HTTPException) as exc:
                raise Transient(f"the transfer broke off: {_reason(exc)}") from exc
            if not piece:
                break  # the end, or the server closed early: the caller counts the bytes
            count(len(piece))
            file.write(piece)


def _http_identity(url: str, headers: Any) -> Identity:
    length = headers.get("Content-Length")
    if length is None or not length.strip().isdigit():
        raise Refused("the server reports no Content-Length: a short transfer could not be told")
    version = " ".join(
        f"{name.lower()}={headers[name]}" for name in ("Last-Modified", "ETag") if headers.get(name)
    )
    if not version:
        raise Refused(
            "the server reports neither Last-Modified nor ETag: a changed copy could not be told"
        )
    return Identity(url, int(length), version)


def _http_failure(url: str, code: int, reason: object) -> Exception:
    if code in (404, 410):
        return not_found(url)
    if code in (401, 403):
        return PermissionError(errno.EACCES, f"the server refuses it ({code} {reason})", url)
    if code in (408, 425, 429) or code >= 500:
        return Transient(f"the server answered {code} {reason}")
    return Refused(f"the server answered {code} {reason}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        return str(exc.reason)
    return str(exc) or type(exc).__name__


# -- XRootD ----------------------------------------------------------------------------

#: The XRootD client's settings this module sets once per process, before its first
#: client (``XrdCl``'s defaults in brackets). Left alone where the environment sets one
#: (``XRD_CONNECTIONRETRY`` and so on: the client takes those first).
#:
#: - ``ConnectionRetry`` 1 [5] and ``ConnectionWindow`` 10 s [120]: one try to connect,
#:   of at most 10 s. By default a refused connection is tried again at each of 5 windows
#:   of 120 s, up to the request's own timeout: a dead server held each attempt for
#:   ``TIMEOUT`` and more (about 30 to 45 s, four times).
#: - ``StreamErrorWindow`` 0 s [1800]: by default, for 30 minutes after a connection to a
#:   server failed, every request to it fails at once with that error, so a server back
#:   within the retries (a restart) would still not be asked.
#: - ``TimeoutResolution`` 1 s [15]: how often the client looks for expired requests; a
#:   timeout of ``TIMEOUT`` seconds ends within a second of it, not up to 15 s late.
#:
#: They apply to the whole process, fsspec-xrootd's and uproot's own XRootD requests too
#: (a library that calls ``install()``): failures come sooner, and the tasks' retries
#: (``inputs.RETRY_DELAYS``) stand in for the client's.
XROOTD_SETTINGS = {
    "ConnectionRetry": 1,
    "ConnectionWindow": 10,
    "StreamErrorWindow": 0,
    "TimeoutResolution": 1,
}
_configured: list[bool] = []


def configure_xrootd() -> None:
    """Put ``XROOTD_SETTINGS`` into the XRootD client's environment, once per process
    (a setting the shell gave, ``XRD_*``, stays). A no-op without the bindings."""
    if _configured:
        return
    try:
        from XRootD import client
    except ImportError:
        return
    _configured.append(True)
    for name, value in XROOTD_SETTINGS.items():
        client.EnvPutInt(name, value)  # False where XRD_<NAME> was set: the user's stays


def _client() -> Any:
    try:
        from XRootD import client
    except ImportError as exc:
        raise Refused(
            "reading root:// needs the XRootD client's Python bindings here: pip install xrootd"
        ) from exc
    configure_xrootd()
    return client


def _xrootd_identify(url: str, timeout: float) -> Identity:
    client = _client()
    parsed = client.URL(url)
    if not parsed.is_valid():
        raise Refused("not a valid root:// URL")
    status, info = client.FileSystem(f"root://{parsed.hostid}").stat(
        parsed.path_with_params, timeout=_seconds(timeout)
    )
    if not status.ok:
        raise _xrootd_failure(url, status, "stat")
    if info.flags & client.flags.StatInfoFlags.IS_DIR:
        raise IsADirectoryError(errno.EISDIR, "a directory on its server", url)
    version = f"mtime={info.modtime}"
    if getattr(info, "haschecksum", False) and info.checksum:
        version += f" checksum={info.checksum}"
    return Identity(url, int(info.size), version)


def _xrootd_fetch(
    url: str, identity: Identity, destination: str, timeout: float, count: Count
) -> None:
    client = _client()
    seconds = _seconds(timeout)
    remote = client.File()
    status, _ = remote.open(url, client.flags.OpenFlags.READ, timeout=seconds)
    if not status.ok:
        raise _xrootd_failure(url, status, "open")
    try:
        status, info = remote.stat(timeout=seconds)
        if not status.ok:
            raise _xrootd_failure(url, status, "stat")
        if info.size != identity.size or identity.version.split(" ")[0] != f"mtime={info.modtime}":
            raise Transient("the server's copy changed between the stat and the open")
        with open(destination, "wb") as file:
            offset = 0
            while offset < identity.size:
                wanted = min(CHUNK, identity.size - offset)
                status, piece = remote.read(offset, wanted, timeout=seconds)
                if not status.ok:
                    raise _xrootd_failure(url, status, "read")
                if not piece:
                    break  # shorter than stated: the caller counts the bytes
                count(len(piece))
                file.write(piece)
                offset += len(piece)
    finally:
        remote.close(timeout=seconds)


def _xrootd_failure(url: str, status: Any, what: str) -> Exception:
    message = f"{what} failed: {str(status.message).strip()}"
    if status.errno == _KXR_NOT_FOUND:
        return not_found(url)
    if status.errno == _KXR_NOT_AUTHORIZED:
        return PermissionError(errno.EACCES, f"the server refuses it ({message})", url)
    if status.code == _XRDCL_AUTH_FAILED:
        return PermissionError(
            errno.EACCES,
            f"the server accepts none of our credentials ({message}; for X.509: "
            "X509_USER_PROXY names a valid proxy? X509_CERT_DIR holds its CAs?)",
            url,
        )
    if status.errno == _KXR_IS_DIRECTORY:
        return IsADirectoryError(errno.EISDIR, "a directory on its server", url)
    return Transient(message)


def _seconds(timeout: float) -> int:
    """The bindings take whole seconds; 0 would mean none."""
    return max(1, round(timeout))
