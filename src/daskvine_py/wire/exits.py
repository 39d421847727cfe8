"""Exit statuses of ``python -m daskvine_py.worker``: the contract between a worker process
and whoever started it (the manager's local launcher, a batch pool), which reads them back
into words.
"""

#: Besides 0 (told to stop, or the
#: manager went silent after we had joined) and argparse's 2 for bad arguments.
EXIT_REJECTED = 2
EXIT_NO_MANAGER = 3
EXIT_AUTH_FAILED = 4
EXIT_NO_LIBRARIES = 5
EXIT_UNFIT = 6
EXIT_MEANINGS = {
    EXIT_REJECTED: "the manager rejected it (version mismatch) or its arguments were bad",
    EXIT_NO_MANAGER: "the manager never answered its registration",
    EXIT_AUTH_FAILED: "it could not authenticate with the manager: wrong or missing keys",
    EXIT_NO_LIBRARIES: "its library processes died before it could register (see its log)",
    EXIT_UNFIT: "the software a run ships cannot run on its node (its log says why)",
}
