"""What a ``Manager`` shows of itself while it runs (docs/live.md): the live snapshot,
its metrics, the web dashboard and its link, and the notebook's view of the manager.

A base of ``manager.Manager``, apart so that the caller's API over runs stays in one
module: these read what the I/O thread builds on request (``live``), never its records.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from daskvine_py.manager import drawing as draw
from daskvine_py.manager.live import Snapshot, ask, request_dashboard

if TYPE_CHECKING:
    from daskvine_py.manager.commands import Command
    from daskvine_py.manager.dashboard import Dashboard
    from daskvine_py.manager.loop import IOLoop
    from daskvine_py.options import ManagerOptions

logger = logging.getLogger("daskvine_py.manager")


class ManagerViews:
    """``live``, ``metrics``, ``dashboard_link`` and ``_repr_html_``."""

    _io: IOLoop
    options: ManagerOptions
    address: str
    _dashboard: Dashboard | None

    def _command(self, command: Command) -> None: ...  # (the manager's)

    def _raise_if_dead(self) -> None: ...  # (the manager's)

    def _start_dashboard(self) -> None:
        """The dashboard, where ``dashboard_address`` says (None: none)."""
        self._dashboard = None
        address = self.options.dashboard_address
        if address is None:
            return
        from daskvine_py.manager.dashboard import Dashboard  # (tornado: only here)

        def request() -> Snapshot:
            return request_dashboard(self._command)

        try:
            self._dashboard = Dashboard(request, self._raise_if_dead, address)
        except OSError as exc:  # (a port taken, an address not this machine's)
            raise OSError(exc.errno, f"the dashboard cannot listen on {address} "
                                     f"(dashboard_address): {exc.strerror}") from exc  # fmt: skip

    def _stop_dashboard(self) -> None:
        dashboard = getattr(self, "_dashboard", None)  # (none if ``__init__`` failed first)
        if dashboard is not None:
            dashboard.close()

    @property
    def dashboard_link(self) -> str | None:
        """The live dashboard's address, its token included (None: no dashboard)."""
        return None if self._dashboard is None else self._dashboard.link

    def live(self, timeout: float = 10.0) -> dict[str, Any]:
        """What the manager is doing now, as plain data (docs/live.md): workers, tasks by
        state, runs in progress, categories. The I/O thread builds it at most once a
        second (a sooner call gets the last one); ``TimeoutError`` if it does not answer."""
        self._raise_if_dead()
        return ask(self._command, self._raise_if_dead, timeout)

    def metrics(self) -> str:
        """``live()`` in Prometheus's text format, what ``/metrics`` serves (docs/live.md)."""
        from daskvine_py.manager.metrics import exposition  # (prometheus-client: only here)

        return exposition(self.live())

    def _repr_html_(self) -> str:
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
        rows.append(("tasks", f"{totals['ready']:,} ready, {totals['processing']:,} on "
                              f"workers, {totals['tasks_done']:,} done, "
                              f"{totals['tasks_failed']:,} failed"))  # fmt: skip
        for run in live["runs"]:
            rows.append((f"run {run['id']}", f"{run['done']:,} of {run['tasks']:,} done"))
        return "<div><b>daskvine_py Manager</b>" + draw.table(("", ""), rows, header=False) + (
            "</div>"
        )
