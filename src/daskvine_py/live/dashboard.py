"""The live dashboard's web server: a tornado application in a thread of its own.

``Dashboard(request, check, address)`` listens on ``address`` (``127.0.0.1:0``: a free port on this
machine only) and answers only requests that carry its token, as Jupyter does: in the
link's ``?token=``, in an ``Authorization: token ...`` (or ``Bearer``) header, or in the
cookie the first page sets. Anything else gets 403. Pages (``pages.PAGES``) are drawn by
``pages`` from what the manager's I/O thread hands over: ``request`` (the manager's
``live.request_dashboard``) returns a ``Pending`` answer, asked at most every
``ASK_INTERVAL`` however many pages are open, and not waited for: a page is drawn at once
from the last answer, so a busy loop delays its data, never the page; only the first
waits. Each page redraws its content every second with a few lines of inline script, and
fetches nothing else: no CDN, no file. ``/metrics`` is Prometheus's text format
(``metrics``) and ``/live.json`` the snapshot.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import tornado.httpserver
import tornado.netutil
import tornado.web

from daskvine_py.live.metrics import exposition
from daskvine_py.live.pages import PAGES, DashboardView
from daskvine_py.report import drawing as draw

logger = logging.getLogger("daskvine_py.manager")

COOKIE = "daskvine_py_token"
#: Milliseconds between two redraws of a page's content.
REFRESH_MS = 1000
#: Seconds between two requests to the I/O thread, at least, and the longest wait for the
#: first answer.
ASK_INTERVAL = 0.2
FIRST_ANSWER_TIMEOUT = 10.0


class Pending(Protocol):
    """An answer of the I/O thread under way (the manager's ``live.Snapshot``): the
    dashboard's data in ``reply[0]`` once ``done`` is set."""

    @property
    def reply(self) -> list[dict[str, Any]]: ...

    @property
    def done(self) -> threading.Event: ...


_SCRIPT = """<script>
(function () {
  var content = document.getElementById('content');
  var page = content.getAttribute('data-page');
  function redraw() {
    fetch(page + '?fragment=1', {credentials: 'same-origin', cache: 'no-store'})
      .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
      .then(function (html) {
        content.innerHTML = html;
        document.body.setAttribute('data-updates',
          String(Number(document.body.getAttribute('data-updates') || 0) + 1));
      })
      .catch(function (e) { document.body.setAttribute('data-error', String(e)); })
      .finally(function () { setTimeout(redraw, %(refresh)d); });
  }
  setTimeout(redraw, %(refresh)d);
})();
</script>"""

_STYLE = (
    draw.STYLE
    + """
nav a { margin-right: 14px; } nav a.here { font-weight: 600; color: #222; }
.progress { display: inline-block; width: 320px; height: 12px; background: #eee;
            vertical-align: middle; margin-right: 8px; }
.progress div { height: 12px; background: #59a14f; }
"""
)


def link(host: str, port: int, token: str) -> str:
    """The dashboard's address to open, for a server bound to ``host``: where that is a
    wildcard (every interface: ``0.0.0.0``, ``::``, empty), this machine's name
    (``socket.gethostname``), which other machines can reach; a browser takes 0.0.0.0
    for its own machine, or refuses it."""
    if _wildcard(host):
        host = socket.gethostname()
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/status?token={token}"


def _wildcard(host: str) -> bool:
    try:
        return not host or ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a host name
        return False


class Dashboard:
    """The server and its thread; ``link`` is the address to open, token included."""

    def __init__(
        self,
        request: Callable[[], Pending],
        check: Callable[[], None],
        address: str = "127.0.0.1:0",
        token: str | None = None,
    ) -> None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        self.token = token or secrets.token_urlsafe(24)
        self._source = _Source(request, check)
        app = tornado.web.Application(
            [
                (r"/", _Index),
                (r"/metrics", _Metrics),
                (r"/live\.json", _Json),
                (r"/([a-z]+)", _Page),
            ],
            dashboard=self,
            log_function=_quiet,  # (an access log line per request: not ours to print)
        )
        sockets = tornado.netutil.bind_sockets(
            int(port or 0), host, family=socket.AF_INET if ":" not in host else socket.AF_INET6
        )
        self.port = sockets[0].getsockname()[1]
        self.link = link(host, self.port, self.token)
        self._loop: asyncio.AbstractEventLoop | None = None
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._serve,
            args=(app, sockets, ready),
            name="daskvine-dashboard",
            daemon=True,
        )
        self._thread.start()
        ready.wait(10)

    def _serve(
        self, app: tornado.web.Application, sockets: list[socket.socket], ready: threading.Event
    ) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        server = tornado.httpserver.HTTPServer(app)
        server.add_sockets(sockets)
        ready.set()
        try:
            loop.run_forever()
        finally:
            server.stop()
            loop.run_until_complete(server.close_all_connections())
            loop.close()

    def allowed(self, handler: tornado.web.RequestHandler) -> bool:
        given = handler.get_query_argument("token", None)
        if given is None:
            scheme, _, value = handler.request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() in ("token", "bearer"):
                given = value.strip()
        if given is None:
            given = handler.get_cookie(COOKIE)
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def data(self, fresh: bool = False) -> DashboardView:
        return self._source.view(fresh)

    def close(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(5)


def _quiet(handler: tornado.web.RequestHandler) -> None:
    pass


class _Source:
    """The view, updated with the I/O thread's answers: a new request at most every
    ``ASK_INTERVAL`` s, while none is under way (several pages open ask once), and only
    the first waited for. ``check`` raises if the I/O thread died."""

    def __init__(self, request: Callable[[], Pending], check: Callable[[], None]) -> None:
        self._request = request
        self._check = check
        self._view = DashboardView()
        self._pending: Pending | None = None
        self._asked = -float("inf")

    def view(self, fresh: bool = False) -> DashboardView:
        """The view; ``fresh``: with an answer asked for now, waited for (a scrape)."""
        now = time.monotonic()
        if self._pending is not None and self._pending.done.is_set():
            self._take()
        if self._pending is None and (fresh or now - self._asked >= ASK_INTERVAL):
            self._pending, self._asked = self._request(), now
        pending = self._pending
        if pending is not None and (fresh or not self._view.live):  # (nothing yet: wait)
            if not pending.done.wait(FIRST_ANSWER_TIMEOUT):
                self._check()
                raise TimeoutError("the manager's I/O thread does not answer")
            self._take()
        elif pending is not None and now - self._asked > FIRST_ANSWER_TIMEOUT:
            self._check()  # (a loop that died never answers)
        return self._view

    def _take(self) -> None:
        assert self._pending is not None
        self._view.update(self._pending.reply[0])
        self._pending = None


class _Handler(tornado.web.RequestHandler):
    def prepare(self) -> None:
        dashboard: Dashboard = self.settings["dashboard"]
        if not dashboard.allowed(self):
            raise tornado.web.HTTPError(403, reason="the dashboard's link carries its token")
        if self.get_query_argument("token", None) is not None:
            self.set_cookie(COOKIE, dashboard.token, httponly=True, samesite="Strict")
        self.set_header("Cache-Control", "no-store")

    @property
    def dashboard(self) -> Dashboard:
        dashboard: Dashboard = self.settings["dashboard"]
        return dashboard

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(f"{status_code}: {self._reason}\n")

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if not isinstance(value, tornado.web.HTTPError):  # (403 and 404 are not news)
            logger.warning(
                "dashboard: %s %s failed",
                self.request.method,
                self.request.uri,
                exc_info=(typ, value, tb),
            )


class _Index(_Handler):
    def get(self) -> None:
        self.redirect("/status")


class _Page(_Handler):
    def get(self, name: str) -> None:
        titles = dict(PAGES)
        if name not in titles:
            raise tornado.web.HTTPError(404, reason=f"no page {name!r}")
        content = self.dashboard.data().page(name)
        if self.get_query_argument("fragment", None):
            self.finish(content)
            return
        nav = "".join(
            f"<a href='/{page}'{' class=here' if page == name else ''}>{title}</a>"
            for page, title in PAGES
        )
        body = (
            f"<h1>daskvine_py: {draw.escape(titles[name])}</h1><nav>{nav}</nav>"
            f"<main id='content' data-page='/{name}'>{content}</main>"
            + _SCRIPT
            % {"refresh": REFRESH_MS}
        )
        self.finish(draw.PAGE.format(title=f"daskvine_py {titles[name]}", style=_STYLE, body=body))


class _Metrics(_Handler):
    def get(self) -> None:
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(exposition(self.dashboard.data(fresh=True).live))


class _Json(_Handler):
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(self.dashboard.data(fresh=True).live, default=str))
