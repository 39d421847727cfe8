"""A big graph's first tasks submitted while the rest of it is still being read.

Reading a graph of 10^6 tasks takes seconds before the plan's passes can even start, and
the workers would wait for all of it. ``Stream`` is what ``graph.read`` shows the keys it
has finished (``graph.Early``): for a graph of at least ``STREAM_MIN`` tasks that carries
no annotations, it submits them in the read's order (each after its dependencies, the
order ``ordered`` keeps for a graph this big), ``graph.EARLY_EVERY`` at a time, up to
``STREAM_PREFIX`` tasks, while the read goes on. Only light legacy tasks that no pass
would change go early: none calls a function the rewrite knows or is marked for it
(``rewrite.may_reduce``), and fusion leaves the keys it went with (``keys``) alone. The
first task that does not qualify ends the stream; the rest go after the passes, as for
any graph.

Readers not yet read are not counted yet, so such a run is submitted ``arriving``: every
task with ``dependents=None`` (the state counts a task's readers as they arrive) and no
result released before the last part (``ExtendRun.last``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from daskvine_py.errors import SerializationError
from daskvine_py.manager.shipping import NOTHING, Shipped
from daskvine_py.options import RunOptions, input_lifetime
from daskvine_py.plan.annotations import RunSettings
from daskvine_py.plan.fusion import Chain
from daskvine_py.plan.graph import Key, LegacyCall, Node, Plan
from daskvine_py.plan.rewrite import may_reduce
from daskvine_py.scheduler import state as s
from daskvine_py.scheduler.messages import RunCache
from daskvine_py.wire import protocol as p
from daskvine_py.wire.serialize import TaskEncoder, urls_in

#: Fewest tasks a graph needs for its first tasks to go while it is read: smaller graphs
#: are read and planned in about a second (10^5 tasks: 1 s to the first task), and keep
#: every release as soon as possible.
STREAM_MIN = 200_000
#: Most tasks submitted while the graph is read: enough work for the workers while the
#: read finishes and the passes run; the rest keeps the passes' fusion and rewriting.
STREAM_PREFIX = 65_536

#: ``Manager._send_part`` for one run: (part, encoder, functions sent, opening or None).
Send = Callable[[list[s.NewTask], TaskEncoder, set[bytes], "s.SubmitRun | None"], None]


class Stream:
    """The keys submitted while the graph was read, and the encoder they used."""

    def __init__(
        self,
        opening: s.SubmitRun,
        send: Send,
        over: Callable[[], bool],
        prefix_of: Callable[[Key], str],
    ) -> None:
        #: the run's first event, sent with the first part (then None)
        self._opening: s.SubmitRun | None = opening._replace(arriving=True)
        self._send = send
        self._over = over
        #: the run reads remote files through the input cache: its tasks are placed by them
        self._find_files = opening.config is not None and bool(opening.config.inputs)
        #: a task's kind, for duration estimates (``dask.utils.key_split``)
        self._prefix_of = prefix_of
        self.encoder = TaskEncoder()
        #: function ids sent with a part already
        self.sent: set[bytes] = set()
        #: the keys submitted so far (the first ``len(keys)`` of the read's order)
        self.keys: set[Key] = set()
        #: function -> whether its tasks may go early (not a reducer the rewrite knows)
        self._plain: dict[Any, bool] = {}
        #: one prefix string, one tuple of function ids per kind of task
        self._shared: dict[Any, Any] = {}

    @property
    def opened(self) -> bool:
        """Whether the run was submitted (it is then ``arriving``)."""
        return bool(self.keys)

    def early(self, size: int, annotated: bool) -> Any:
        """``graph.Early``: follow the read of a big graph without annotations."""
        return self.seen if size >= STREAM_MIN and not annotated else None

    def seen(
        self, done: list[Key], nodes: dict[Key, Node], dependencies: dict[Key, frozenset[Key]]
    ) -> bool:
        """``graph.Seen``: submit the keys finished since the last call; go on?"""
        part: list[s.NewTask] = []
        going = True
        for priority in range(len(self.keys), len(done)):
            key = done[priority]
            node = nodes[key]
            if type(node) is not LegacyCall or not self._may_go(node.task[0]):
                going = False
                break
            payload, functions = encode_task(self.encoder, key, node)
            functions = self._shared.setdefault(functions, functions)
            prefix = self._prefix_of(key)
            prefix = self._shared.setdefault(prefix, prefix)
            deps = tuple(dependencies[key])
            files = urls_in(payload) if self._find_files else ()
            part.append(s.NewTask(key, payload, functions, deps, priority, prefix, None, files))
            self.keys.add(key)
        if part:
            self._send(part, self.encoder, self.sent, self._opening)
            self._opening = None
            if self._over():  # it failed already: the rest goes after the read, or not
                return False
        return going and len(self.keys) < STREAM_PREFIX

    def _may_go(self, func: Any) -> bool:
        try:
            plain = self._plain.get(func)
            if plain is None:
                plain = self._plain[func] = not may_reduce([func])
        except TypeError:  # unhashable: let the passes see it
            return False
        return plain


def opening_of(
    run_id: int,
    outputs: list[Key],
    options: RunOptions,
    watched: bool,
    settings: RunSettings | None = None,
    cache: RunCache | None = None,
    *,
    shipped: Shipped = NOTHING,
) -> s.SubmitRun:
    """A run's ``SubmitRun``, without its tasks and functions (its first part's);
    ``shipped``: its software and files (``shipping``)."""
    config = None
    if not options.default_execution or shipped is not NOTHING:
        config = p.RunConfig(
            run_id,
            options.task_mode,
            options.exec_mode,
            options.import_modules,
            tuple(options.env_vars.items()),
            options.task_sandbox,
            shipped.software,
            shipped.files,
            input_lifetime(options.cache_inputs),
            options.input_peers,
        )
    return s.SubmitRun(
        run_id,
        [],
        outputs,
        options.retries,
        {},
        options.replicas,
        config,
        watched,
        settings,
        cache,
        verify=float(options.verify),
        fast_abort=options.fast_abort,
    )


def encode_task(encoder: TaskEncoder, key: Key, node: Node) -> tuple[bytes, tuple[bytes, ...]]:
    """A task's payload and function ids; ``SerializationError`` naming what would not
    pickle (a chain's link, if that is where it is)."""
    try:
        return encoder.encode(node)
    except Exception as exc:
        if type(node) is Chain:  # name the link that cannot be pickled
            for link, link_node in node.links:
                encode_task(encoder, link, link_node)
        raise SerializationError(key, "the function or arguments", repr(exc)) from exc


def deferred_payload(
    encoder: TaskEncoder, plan: Plan, key: Key
) -> tuple[bytes, tuple[bytes, ...], dict[bytes, bytes]]:
    """A task's payload, function ids and the bytes of those functions, made in the I/O
    thread (with an encoder of its own) when the lineage of a lost cached result needs
    a task submitted without its payload."""
    payload, functions = encode_task(encoder, key, plan.nodes[key])
    return payload, functions, {fid: encoder.functions[fid] for fid in functions}
