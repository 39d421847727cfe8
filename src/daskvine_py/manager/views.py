"""What a ``Manager`` shows of itself while it runs (docs/live.md): the live snapshot,
its metrics, the web dashboard and its link, and the notebook's view of the manager.

``LiveViews`` is a part the manager owns, given what it needs and nothing more: how to
queue a command for the I/O thread and how to check that thread is alive. It reads what
the I/O thread builds on request (``live``), never its records; the pages, the metrics'
format and the server are the ``live`` package's (``daskvine_py.live``). The manager's
``live()``, ``metrics()``, ``dashboard_link`` and ``_repr_html_`` hand over to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from daskvine_py.manager.live import Snapshot, ask, request_dashboard
from daskvine_py.report import drawing as draw

if TYPE_CHECKING:
    from daskvine_py.live.dashboard import Dashboard
    from daskvine_py.manager.commands import Command


class LiveViews:
    """The live views of one manager at ``address``; ``command`` queues a command for its
    I/O thread, ``check`` raises if that thread died."""

    def __init__(
        self, command: Callable[[Command], None], check: Callable[[], None], address: str
    ) -> None:
        self._command = command
        self._check = check
        self.address = address
        #: the web dashboard, once started (None: none)
        self.dashboard: Dashboard | None = None

    def start_dashboard(self, address: str | None) -> None:
        """The dashboard, listening on ``address`` (``dashboard_address``; None: none)."""
        if address is None:
            return
        from daskvine_py.live.dashboard import Dashboard  # (tornado: only here)

        def request() -> Snapshot:
            return request_dashboard(self._command)

        try:
            self.dashboard = Dashboard(request, self._check, address)
        except OSError as exc:  # (a port taken, an address not this machine's)
            raise OSError(
                exc.errno,
                f"the dashboard cannot listen on {address} (dashboard_address): {exc.strerror}",
            ) from exc

    def close(self) -> None:
        """Stop the dashboard, if one runs."""
        if self.dashboard is not None:
            self.dashboard.close()

    @property
    def dashboard_link(self) -> str | None:
        """The live dashboard's address, its token included (None: no dashboard)."""
        return None if self.dashboard is None else self.dashboard.link

    def live(self, timeout: float = 10.0) -> dict[str, Any]:
        """``Manager.live()``: the snapshot the I/O thread builds (``live.ask``)."""
        self._check()
        return ask(self._command, self._check, timeout)

    def metrics(self) -> str:
        """``live()`` in Prometheus's text format, what ``/metrics`` serves."""
        from daskvine_py.live.metrics import exposition  # (prometheus-client: only here)

        return exposition(self.live())

    def html(self) -> str:
        """A notebook's view: the address, the dashboard's link, the workers and the runs
        in progress."""
        rows: list[tuple[Any, ...]] = [("address", self.address)]
        link = self.dashboard_link
        if link is not None:
            anchor = f"<a href='{draw.escape(link)}' target='_blank'>{draw.escape(link)}</a>"
            rows.append(("dashboard", draw.Raw(anchor)))
        try:
            live = self.live(timeout=2.0)
        except (TimeoutError, RuntimeError) as exc:
            rows.append(("state", f"not answering: {exc}"))
            return draw.table(("", ""), rows, header=False)
        totals = live["totals"]
        rows.append(("workers", f"{totals['workers']:,} ({totals['cores']:,} cores)"))
        tasks = (
            f"{totals['ready']:,} ready, {totals['processing']:,} on workers, "
            f"{totals['tasks_done']:,} done, {totals['tasks_failed']:,} failed"
        )
        rows.append(("tasks", tasks))
        for run in live["runs"]:
            rows.append((f"run {run['id']}", f"{run['done']:,} of {run['tasks']:,} done"))
        table = draw.table(("", ""), rows, header=False)
        return f"<div><b>daskvine_py Manager</b>{table}</div>"
