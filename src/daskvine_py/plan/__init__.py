"""Any Dask graph into one plan of tasks, read once: normalising every graph form
(``graph``), Dask's annotations (``annotations``), tree rewriting of large reductions
(``rewrite``) and fusion of linear chains (``fusion``). Pure: no sockets, no processes.

May import: ``wire``, and the bottom modules (``errors``, ``options``, ``config``).
"""
