"""A process told to end closes its managers first: SIGTERM and SIGHUP.

``kill``, ``timeout``, a batch system ending a job (SIGTERM) and a closed terminal (SIGHUP)
end a Python process at once by default: ``close`` never runs, so local workers and their
libraries stay until their manager timeout, and connection files pile up. While a manager
is open, these signals close every open manager as ``close`` does, then the process ends
as the signal's default action would (same status, so ``timeout`` and batch systems see
what they expect).

The handler is installed only from the main thread (Python allows no other), and only
over the default action: a signal the process ignores (``nohup``) or handles itself stays
its own, since a library must not take signals from the application. An application that
installs its handler later replaces ours, and may chain to it. When the last manager
closes, the default action is restored, unless the application has set a handler since.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from types import FrameType
from typing import Any, Protocol

logger = logging.getLogger("daskvine_py.manager")

#: The signals that close managers (SIGHUP does not exist on every platform).
SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)

#: Seconds a signalled manager gives its local workers to leave before killing them:
#: a batch system's grace period after SIGTERM is often a few seconds only.
SIGNAL_CLOSE_TIMEOUT = 1.0


class Closable(Protocol):
    def close(self, timeout: float = ...) -> None: ...


_open: weakref.WeakSet[Any] = weakref.WeakSet()
#: signal -> the handler it had before ours (always the default action)
_installed: dict[int, Any] = {}
#: the process whose managers these are: a child forked from it (multiprocessing's
#: fork, which ``terminate()``s with SIGTERM) inherits the handler and copies of them,
#: but must not close them (their files and workers are its parent's)
_owner = os.getpid()
#: reentrant: the handler runs in the main thread, which it may interrupt holding it
_lock = threading.RLock()


def watch(manager: Closable) -> None:
    """``manager`` is open: the signals close it (see the module's docstring)."""
    global _owner
    with _lock:
        if os.getpid() != _owner:  # a forked child's own manager: forget its parent's
            _open.clear()
            _owner = os.getpid()
        _open.add(manager)
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in SIGNALS:
        if signum in _installed:
            continue  # installed for another open manager: it closes them all
        try:
            if signal.getsignal(signum) is not signal.SIG_DFL:
                continue  # ignored, or the application's own (or set outside Python)
            signal.signal(signum, _on_signal)
        except (ValueError, OSError):  # not allowed here (an embedded interpreter)
            continue
        _installed[signum] = signal.SIG_DFL


def unwatch(manager: Closable) -> None:
    """``manager`` closed; the last one to close restores the default actions."""
    with _lock:
        _open.discard(manager)
        if _open:
            return
    if threading.current_thread() is not threading.main_thread():
        return  # left installed: with no manager open it acts as the default action
    for signum, previous in list(_installed.items()):
        try:
            if signal.getsignal(signum) is _on_signal:
                signal.signal(signum, previous)
        except (ValueError, OSError):
            continue
        del _installed[signum]


#: a handler is closing the managers: the process ends when it is done
_closing = False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Close every open manager, then end the process as the signal's default action.

    A signal arriving meanwhile waits for that: ``timeout`` and batch systems signal the
    whole process group right after the process itself, and the default action would
    end the process halfway through closing (its connection file left behind)."""
    global _closing
    if _closing:
        return
    _closing = True
    with _lock:
        managers = list(_open) if os.getpid() == _owner else []
    if managers:
        logger.warning(
            "%s received: closing %d manager(s) and stopping their local workers",
            signal.Signals(signum).name,
            len(managers),
        )
    for manager in managers:
        try:
            manager.close(timeout=SIGNAL_CLOSE_TIMEOUT)
        except BaseException:  # the process ends anyway: close the others
            logger.exception("could not close a manager on %s", signal.Signals(signum).name)
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)
    os._exit(128 + signum)  # not reached: the default action of these signals ends us
