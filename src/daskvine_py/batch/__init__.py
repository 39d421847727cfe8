"""Workers from batch systems: a pool sized to the work through any of Parsl's providers
(``pool``, planned by the pure ``planner``), ``python -m daskvine_py.factory`` for a manager
running elsewhere (``factory``), and the client that asks a manager for its demand and its
live snapshot over its port (``status``; the status command's view of it is in ``live``).

May import: ``wire`` and the bottom modules; it never imports the manager (a pool in the
manager's process is handed what it needs).
"""
