"""``python -m daskvine_py.worker.task_process DIR``: run one task in a fresh interpreter.

This is ``task_mode="tasks"``, the classic mode: full isolation, and the baseline the
library processes are measured against. The worker writes the call to ``DIR/call.pkl``
and starts this module with ``DIR`` as current directory and temp dir; it reads the reply
(the same tuple a library sends) from ``DIR/reply.pkl``, and removes ``DIR``. Functions
are read from the worker's function directory, one file per function id, so each task
process loads only the functions its task uses.

A process that leaves no reply died: the worker reports its exit code or signal.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Sequence

CALL_FILE = "call.pkl"
REPLY_FILE = "reply.pkl"


def function_file(functions_dir: str, function_id: bytes) -> str:
    return os.path.join(functions_dir, function_id.hex())


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m daskvine_py.worker.task_process DIR", file=sys.stderr)
        return 2
    task_dir = args[0]
    # Imported here, after the interpreter started: these imports are the cost of the mode.
    from daskvine_py.wire.serialize import TaskDecoder
    from daskvine_py.worker.library import _die_with_parent, _erred, import_all, run
    from daskvine_py.worker.pipe import Reply

    _die_with_parent()
    with open(os.path.join(task_dir, CALL_FILE), "rb") as file:
        call, functions_dir, worker_name, import_modules = pickle.load(file)

    def lookup(function_id: bytes) -> bytes | None:
        try:
            with open(function_file(functions_dir, function_id), "rb") as file:
                return file.read()
        except FileNotFoundError:
            return None

    failure = import_all(import_modules, worker_name)
    reply: Reply
    if failure is not None:
        reply = _erred(call[0], failure, None)
    else:
        reply = run(call, TaskDecoder(lookup), worker_name)
    partial = os.path.join(task_dir, REPLY_FILE + ".part")
    with open(partial, "wb") as out:
        pickle.dump(reply, out, protocol=5)
    os.replace(partial, os.path.join(task_dir, REPLY_FILE))  # all or nothing
    return 0


if __name__ == "__main__":
    sys.exit(main())
