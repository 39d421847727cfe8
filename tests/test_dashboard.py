"""The live dashboard seen from outside: headless Chromium during a 20,000-task run, the
token rule on every route, no request off the machine, ``/metrics`` against
``last_run``, and a manager without a dashboard (docs/live.md)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any

import dask
import pytest

from browser import CHROMIUM, SKIP_REASON, chromium
from daskvine_py import Manager
from daskvine_py.live import dashboard
from daskvine_py.live.dashboard import COOKIE
from daskvine_py.live.pages import PAGES

#: Every route the dashboard answers, and one it does not.
ROUTES = ("/", "/metrics", "/live.json", "/nosuchpage", *(f"/{name}" for name, _ in PAGES))


def _leaf(i: int, after: int = 0) -> int:
    return i + 1 + after


def _gate(path: str, *after: int) -> int:
    """A task that waits until ``path`` exists."""
    while not os.path.exists(path):
        time.sleep(0.01)
    return 0


def _inc(x: int) -> int:
    return x + 1


def _total(*parts: int) -> int:
    return sum(parts)


def _fail(x: int) -> int:
    return x // 0


def _gated_graph(gates: tuple[str, str]) -> tuple[dict, str]:
    """20,000 tasks: 19,799 leaves, summed by hundreds, then in one. The first third of the
    leaves is free; the second waits for a task that waits for the first gate's file, the
    last for one that waits for the second's (and the first's task: one core at most
    waits)."""
    n = 19_799
    dsk: dict = {"gate-a": (_gate, gates[0]), "gate-b": (_gate, gates[1], "gate-a")}
    for i in range(n):
        dsk[("leaf", i)] = (
            (_leaf, i) if i < 6_600 else (_leaf, i, "gate-a" if i < 13_200 else "gate-b")
        )
    parts = range(0, n, 100)
    for g in parts:
        dsk[("part", g)] = (_total, *[("leaf", i) for i in range(g, min(g + 100, n))])
    dsk["total"] = (_total, *[("part", g) for g in parts])
    assert len(dsk) == 20_000
    return dsk, "total"


def _url(manager: Manager, route: str, token: str | None = "") -> str:
    """``route`` of the manager's dashboard, with its token (``""``), another, or none."""
    link = manager.dashboard_link
    assert link is not None
    base = link.split("/status?")[0]
    if token == "":
        token = link.split("token=")[1]
    if token is None:
        return base + route
    return f"{base}{route}{'&' if '?' in route else '?'}token={token}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 302 itself is the answer


_OPENER = urllib.request.build_opener(_NoRedirect)


def _fetch(url: str, **headers: str) -> tuple[int, str, Any]:
    """(status, body, headers) of a GET, whatever its status."""
    request = urllib.request.Request(url, headers=headers)
    try:
        with _OPENER.open(request, timeout=30) as response:
            return response.status, response.read().decode(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), error.headers


def _wait(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Whether ``condition`` held within ``timeout`` seconds (asked every 50 ms)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _dom(tmp_path, url: str, *args: str) -> str:
    """The page's DOM after three virtual seconds: its script has redrawn it."""
    done = chromium(tmp_path, "--virtual-time-budget=3000", *args, "--dump-dom", url)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _body(dom: str) -> dict[str, str]:
    """The attributes of the page's <body>."""
    match = re.search(r"<body([^>]*)>", dom)
    assert match is not None, dom[:500]
    return dict(re.findall(r'([\w-]+)="([^"]*)"', match.group(1)))


def _done(dom: str) -> tuple[int, int]:
    """The status page's (tasks done, failed), from its Totals table."""
    match = re.search(r"<th>done</th><td>([\d,]+) tasks, ([\d,]+) failed", dom)
    assert match is not None, dom[:2000]
    return int(match.group(1).replace(",", "")), int(match.group(2).replace(",", ""))


def _metrics(text: str) -> dict[str, float]:
    """Prometheus's text format: each sample's value by its name and labels."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


@pytest.fixture(scope="module")
def dash_manager():
    """A manager with its dashboard and two one-core workers."""
    with Manager() as manager:
        manager.start_workers(2, cores=1)
        yield manager


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_chromium_sees_the_done_count_rise_during_a_20000_task_run(dash_manager, tmp_path):
    gates = (str(tmp_path / "gate-a"), str(tmp_path / "gate-b"))
    dsk, key = _gated_graph(gates)
    got: list[Any] = []
    run = threading.Thread(target=lambda: got.append(dash_manager.get(dsk, key, fast_abort=0)))
    run.start()
    try:

        def done_now() -> int:
            return dash_manager.live()["totals"]["tasks_done"]

        before = done_now()
        failed_before = dash_manager.live()["totals"]["tasks_failed"]
        assert _wait(lambda: done_now() > before)  # the run is under way
        # A third of the leaves is free to run, the rest waits for the gates: each load
        # is during the run, and the second sees more done than the first.
        first = _dom(tmp_path, dash_manager.dashboard_link)
        assert int(_body(first).get("data-updates", "0")) > 0, _body(first)
        assert "data-error" not in _body(first)
        done_first, _ = _done(first)
        assert before < done_first < before + 20_000
        assert re.search(r"of 20,000 done", first), first[:3000]

        open(gates[0], "w").close()
        assert _wait(lambda: done_now() > done_first)
        second = _dom(tmp_path, dash_manager.dashboard_link)
        assert int(_body(second).get("data-updates", "0")) > 0, _body(second)
        done_second, failed = _done(second)
        assert done_first < done_second < before + 20_000  # risen, and the run still going
        assert failed == failed_before
        assert re.search(r"of 20,000 done", second)
    finally:
        for gate in gates:
            open(gate, "w").close()
        run.join(240)
    assert got == [dask.get(dsk, key)]
    assert dash_manager.last_run.categories["leaf"].tasks == 19_799


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_every_route_needs_the_token(dash_manager):
    token = dash_manager.dashboard_link.split("token=")[1]
    for route in ROUTES:
        for url, headers in (
            (_url(dash_manager, route, None), {}),
            (_url(dash_manager, route, "wrong"), {}),
            (_url(dash_manager, route, token[:-1]), {}),
            (_url(dash_manager, route + "?fragment=1", "wrong"), {}),
            (_url(dash_manager, route, None), {"Authorization": "token wrong"}),
            (_url(dash_manager, route, None), {"Authorization": f"Basic {token}"}),
            (_url(dash_manager, route, None), {"Authorization": "token "}),
            (_url(dash_manager, route, None), {"Cookie": f"{COOKIE}=wrong"}),
        ):
            status, body, _ = _fetch(url, **headers)
            assert status == 403, (url, headers, status)
            assert token not in body

    for name, _ in PAGES:  # with the token in a header, every page
        status, body, _ = _fetch(
            _url(dash_manager, f"/{name}", None), Authorization=f"token {token}"
        )
        assert status == 200 and "<main id='content'" in body, (name, status)
    status, body, _ = _fetch(
        _url(dash_manager, "/live.json", None), Authorization=f"Bearer {token}"
    )
    assert status == 200 and json.loads(body)["totals"]["workers"] == 2
    status, body, _ = _fetch(_url(dash_manager, "/nosuchpage"))
    assert status == 404
    status, _, headers = _fetch(_url(dash_manager, "/"))
    assert status == 302 and headers["Location"] == "/status"

    # The link's first page sets the cookie; with only the cookie, the pages answer.
    status, _, headers = _fetch(_url(dash_manager, "/status"))
    cookie = headers["Set-Cookie"]
    assert status == 200 and cookie.startswith(f"{COOKIE}={token};")
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    status, body, _ = _fetch(_url(dash_manager, "/workers", None), Cookie=f"{COOKIE}={token}")
    assert status == 200 and "<main id='content'" in body

    status, body, headers = _fetch(_url(dash_manager, "/metrics"))
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    samples = _metrics(body)
    assert samples["daskvine_py_workers"] == 2 and samples["daskvine_py_cores"] == 2


#: What Chromium asks of Google's services by itself, whatever the page, even with
#: --disable-background-networking (its component updater, its account check, its
#: network clock): never a page's. Anything else a page asked for would be a CDN's.
BROWSER_OWN = {"update.googleapis.com", "accounts.google.com", "clients2.google.com"}


class _Proxy:
    """A TCP listener on 127.0.0.1 that Chromium takes for its HTTP proxy: it records the
    host of every request made to it (``GET http://host/...``, ``CONNECT host:443``),
    and answers 502."""

    def __init__(self) -> None:
        self.hosts: list[str] = []
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._socket.settimeout(0.1)
        self.port = self._socket.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def pages(self) -> list[str]:
        """The hosts asked for that are not the browser's own."""
        return [host for host in self.hosts if host not in BROWSER_OWN]

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(5)
                try:
                    first = connection.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
                    connection.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                except OSError as exc:
                    first = f"? ({exc})"
                if first:  # (a socket Chromium opened ahead and closed unused asked nothing)
                    self.hosts.append(_host(first))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close()


def _host(request_line: str) -> str:
    """The host a proxy's request asks for: ``GET http://host/path HTTP/1.1`` or
    ``CONNECT host:443 HTTP/1.1`` (the line itself if it is neither)."""
    parts = request_line.split(" ")
    if len(parts) != 3:
        return request_line
    target = parts[1] if "//" in parts[1] else "//" + parts[1]
    return urllib.parse.urlsplit(target).hostname or request_line


class _Links(HTMLParser):
    """Every attribute of a page that could make the browser fetch something."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "xlink:href", "action", "poster", "data", "srcset"):
                self.links.append((tag, name, value or ""))


@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_the_pages_make_no_request_off_the_machine(dash_manager, tmp_path):
    # Something on every page: a run, and a failed one with its traceback.
    dsk: dict = {("a", i): (_leaf, i) for i in range(50)}
    dsk["sum"] = (_total, *dsk)
    assert dash_manager.get(dsk, "sum") == dask.get(dsk, "sum")
    with pytest.raises(ZeroDivisionError):
        dash_manager.get({"x": (_leaf, 1), "bad": (_fail, "x")}, "bad")
    failures = _url(dash_manager, "/failures?fragment=1")
    assert _wait(lambda: "ZeroDivisionError" in _fetch(failures)[1], 10), _fetch(failures)

    # Statically: nothing in any page or fragment points off the machine.
    for name, _ in PAGES:
        for route in (f"/{name}", f"/{name}?fragment=1"):
            status, text, _ = _fetch(_url(dash_manager, route))
            assert status == 200
            links = _Links()
            links.feed(text)
            for tag, attribute, value in links.links:
                assert not re.match(r"\s*(https?:)?//", value, re.I), (route, tag, attribute)
            assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", text, re.I), route
            assert "<script src" not in text and "<link" not in text, route

    # In the browser, every request off the machine sent to a proxy that records it:
    # Chromium sends loopback directly (its implicit bypass rules; "<-loopback>" in
    # --proxy-bypass-list would send it to the proxy), so the pages load and their
    # script's redraws fetch from the dashboard, while the proxy hears none of theirs.
    proxy = _Proxy()
    try:
        flags = (
            f"--proxy-server=http://127.0.0.1:{proxy.port}",
            "--disable-features=NetworkTimeServiceQuerying",
        )
        for name, _ in PAGES:
            dom = _dom(tmp_path, _url(dash_manager, f"/{name}"), *flags)
            body = _body(dom)
            assert int(body.get("data-updates", "0")) > 0 and "data-error" not in body, name
            assert proxy.pages() == [], (name, proxy.hosts)
        dom = _dom(tmp_path, _url(dash_manager, "/metrics"), *flags)
        assert "daskvine_py_tasks_done_total" in dom and proxy.pages() == [], proxy.hosts

        # The proxy does hear a page that fetches from elsewhere, over HTTP and HTTPS.
        elsewhere = tmp_path / "elsewhere.html"
        elsewhere.write_text(
            "<html><body><img src='http://daskvine-py.invalid/x.png'>"
            "<script src='https://cdn.daskvine-py.invalid/x.js'></script>"
            "</body></html>"
        )
        _dom(tmp_path, elsewhere.as_uri(), *flags)
        assert _wait(lambda: len(proxy.pages()) >= 2, 10), proxy.hosts
        assert sorted(proxy.pages()) == ["cdn.daskvine-py.invalid", "daskvine-py.invalid"]
    finally:
        proxy.close()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_metrics_after_runs_equal_last_runs_counts():
    first: dict = {("inc", i): (_inc, i) for i in range(300)}
    first.update({("double", i): (_total, ("inc", i), ("inc", i)) for i in range(300)})
    first["sum"] = (_total, *[("double", i) for i in range(300)])
    second: dict = {("leaf", i): (_leaf, i) for i in range(120)}
    second["total"] = (_total, *[("leaf", i) for i in range(120)])
    third = {"x": (_inc, 1), "bad": (_fail, "x"), "y": (_inc, 2)}

    with Manager() as manager:
        manager.start_workers(2, cores=1)
        url = _url(manager, "/metrics")
        done = failed = 0

        def tally() -> None:
            nonlocal done, failed
            categories = manager.last_run.categories
            done += sum(category.tasks for category in categories.values())
            failed += sum(category.failed for category in categories.values())

        def metrics() -> dict[str, float]:
            status, body, _ = _fetch(url)
            assert status == 200
            return _metrics(body)

        def settled() -> bool:  # (the dashboard asks the I/O thread every 0.2 s at most)
            samples = metrics()
            return (
                samples["daskvine_py_tasks_done_total"] == done
                and samples["daskvine_py_tasks_failed_total"] == failed
            )

        assert manager.get(first, "sum") == dask.get(first, "sum")
        tally()
        assert manager.get(second, "total") == dask.get(second, "total")
        tally()
        assert done > 0 and failed == 0
        _wait(settled, 10)
        samples = metrics()
        assert samples["daskvine_py_tasks_done_total"] == done
        assert samples["daskvine_py_tasks_failed_total"] == 0
        assert samples["daskvine_py_workers"] == 2 and samples["daskvine_py_cores"] == 2
        assert all(
            samples[f'daskvine_py_tasks{{state="{state}"}}'] == 0
            for state in ("ready", "processing", "running")
        )

        with pytest.raises(ZeroDivisionError):
            manager.get(third, ["bad", "y"])
        tally()
        assert failed >= 1  # (a task that raised is tried once more elsewhere: two)
        _wait(settled, 10)
        samples = metrics()
        assert samples["daskvine_py_tasks_done_total"] == done
        assert samples["daskvine_py_tasks_failed_total"] == failed


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_no_dashboard_when_its_address_is_none():
    named = "daskvine-dashboard"
    before = sum(thread.name == named for thread in threading.enumerate())
    with Manager(dashboard_address=None) as manager:
        assert manager.dashboard_link is None
        assert sum(thread.name == named for thread in threading.enumerate()) == before
        assert "dashboard" not in manager._repr_html_()
    with Manager() as manager:
        link = manager.dashboard_link
        assert link is not None and link.startswith("http://127.0.0.1:")
        assert sum(thread.name == named for thread in threading.enumerate()) == before + 1
        assert f"href='{link}'" in manager._repr_html_()
    assert sum(thread.name == named for thread in threading.enumerate()) == before

    # Nor is its web server imported.
    script = (
        "import sys\nfrom daskvine_py import Manager\n"
        "with Manager(dashboard_address=None) as m:\n    pass\n"
        "print('tornado' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "host, shown",
    [
        ("0.0.0.0", socket.gethostname()),
        ("::", socket.gethostname()),
        ("0:0:0:0:0:0:0:0", socket.gethostname()),
        ("", socket.gethostname()),
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "[::1]"),
        ("node17.cluster", "node17.cluster"),
    ],
)
def test_the_link_names_a_host_a_browser_can_open(host, shown):
    assert dashboard.link(host, 8796, "tok") == f"http://{shown}:8796/status?token=tok"


@pytest.mark.timeout(60)
def test_a_dashboard_on_every_interface_links_to_this_machines_name(monkeypatch):
    """``dashboard_address="0.0.0.0:0"``: the link names this machine, not 0.0.0.0. (Tests
    listen on loopback only: the server is bound there, told it was 0.0.0.0.)"""
    bound = []
    bind = dashboard.tornado.netutil.bind_sockets

    def loopback_instead(port: int, address: str, **kwargs: Any) -> list[socket.socket]:
        bound.append(address)
        return bind(port, "127.0.0.1", family=socket.AF_INET)

    monkeypatch.setattr(dashboard.tornado.netutil, "bind_sockets", loopback_instead)
    with Manager(dashboard_address="0.0.0.0:0") as manager:
        link = manager.dashboard_link
    assert bound == ["0.0.0.0"]
    assert link is not None and link.startswith(f"http://{socket.gethostname()}:"), link
    monkeypatch.undo()
    with Manager(dashboard_address="127.0.0.1:0") as manager:
        link = manager.dashboard_link
        assert link is not None and link.startswith("http://127.0.0.1:"), link
        status, body, _ = _fetch(link)
    assert status == 200 and "daskvine_py" in body
