"""The worker's side of the node's input cache (``daskvine_py.inputs``): where it is, how
large, and what leaves it when.

The worker's libraries fetch and read the inputs; the worker only sets the scene and
cleans up after its runs:

- it names the cache for everything it starts (libraries, task processes inherit its
  variables): ``$DASKVINE_PY_INPUT_CACHE`` (``--input-cache``, default the node's temp
  directory as ``inputs.store.default_root`` says), ``$DASKVINE_PY_INPUT_CACHE_BYTES``
  (``--disk``, when given), and ``$DASKVINE_PY_INPUT_OWNER``, its own name in the claims
  its libraries' tasks make on what they read (``inputs.store.claim``);
- from the first run with ``cache_inputs`` on, it holds its owner's lock (``own``), which
  says to every process of the node that its claims still stand;
- as a run with ``cache_inputs="run"`` ends (``EndRunInputs``), it drops that run's
  claims, and as it exits, all of its own: the entries no claim is left on go. Those a
  process still uses are spared, and looked at again (``retry``) after 1 s, then less
  and less often, until they are gone;
- as it starts, it drops the claims of the workers of the node that died without doing
  so (SIGKILL), where a cache is there already.

Nothing here raises into the worker's loop: a cache it cannot use is logged, and the
tasks that read through it fail with their own errors.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from daskvine_py.inputs import OWNER_VARIABLE
from daskvine_py.inputs.store import Cleanup, Identity, InputCache, default_root, new_owner
from daskvine_py.wire import protocol as p
from daskvine_py.worker.messages import EndRunInputs

logger = logging.getLogger("daskvine_py.worker")

#: The environment variables the worker sets for its libraries (``daskvine_py.inputs``).
ROOT_VARIABLE = "DASKVINE_PY_INPUT_CACHE"
BYTES_VARIABLE = "DASKVINE_PY_INPUT_CACHE_BYTES"
#: Seconds before entries spared in use are looked at again; doubled each time, up to
#: ``RETRY_MAX``.
RETRY_FIRST = 1.0
RETRY_MAX = 60.0


class InputsKeeper:
    """One worker's claims on the node's input cache, and their cleanup."""

    def __init__(self, root: str | None, disk: int | None) -> None:
        if root:
            os.environ[ROOT_VARIABLE] = os.path.abspath(root)
        self.root = default_root()  # (the variable, else the temp directory)
        os.environ[ROOT_VARIABLE] = self.root
        if disk is not None:
            os.environ[BYTES_VARIABLE] = str(disk)
        self.owner = new_owner()
        os.environ[OWNER_VARIABLE] = self.owner
        self.cache: InputCache | None = None
        #: what cleanups removed, until the worker tells its manager (``take_dropped``)
        self.dropped: list[Identity] = []
        self.owned = False  #: it holds its owner lock (``own``)
        #: (when to look again at spared entries: ``time.monotonic()``, the delay after)
        self._retry: tuple[float, float] | None = None
        if os.path.isdir(os.path.join(self.root, "entries")):
            self._clean(lambda cache: cache.tidy())  # dead workers' claims

    def own(self) -> None:
        """Hold this worker's claims (its owner lock): before its first run with
        ``cache_inputs`` sends tasks. Idempotent."""
        if self.owned:
            return
        cache = self._open()
        if cache is None:
            return
        try:
            cache.own(self.owner)
            self.owned = True
        except OSError as exc:
            logger.error("worker cannot hold its claims in input cache %s: %s", self.root, exc)

    def end_run(self, end: EndRunInputs) -> None:
        """Run ``end.run_id`` ended: what its tasks fetched here goes, unless another
        claim keeps it."""
        if self.owned:
            self._clean(lambda cache: cache.end_run(self.owner, end.run_id))

    def take_dropped(self) -> p.InputsDropped | None:
        """What the cleanups removed since the last call, as the record for the manager."""
        if not self.dropped:
            return None
        files = tuple((i.url, i.version) for i in self.dropped[: p.MAX_INPUT_FILES])
        del self.dropped[: p.MAX_INPUT_FILES]
        return p.InputsDropped(files)

    def retry(self, now: float) -> None:
        """Look again at entries spared in use, when it is time (the loop calls it)."""
        if self._retry is not None and now >= self._retry[0]:
            self._clean(lambda cache: cache.tidy())

    def close(self) -> None:
        """The worker exits, its libraries gone: drop all its claims, let go of its lock."""
        if self.cache is None:
            return
        if self.owned:
            self._clean(lambda cache: cache.end_worker(self.owner))
        self.cache.close()
        self.cache = None
        self.owned = False

    def _open(self) -> InputCache | None:
        if self.cache is None:
            try:
                self.cache = InputCache(self.root, 0)  # (its bound is the libraries' to keep)
            except OSError as exc:
                logger.error("worker cannot use input cache %s: %s", self.root, exc)
        return self.cache

    def _clean(self, how: Callable[[InputCache], Cleanup]) -> None:
        cache = self._open()
        if cache is None:
            return
        try:
            cleanup = how(cache)
        except OSError as exc:
            logger.warning("worker could not clean input cache %s: %s", self.root, exc)
            return
        self.dropped.extend(cache.dropped)  # (said to the manager: ``take_dropped``)
        cache.dropped.clear()
        if not cleanup.spared:
            self._retry = None
            return
        delay = RETRY_FIRST if self._retry is None else min(2 * self._retry[1], RETRY_MAX)
        self._retry = (time.monotonic() + delay, delay)
