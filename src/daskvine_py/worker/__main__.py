"""``python -m daskvine_py.worker``: run one worker (``shell.main``)."""

import sys

from daskvine_py.worker.shell import main

if __name__ == "__main__":
    sys.exit(main())
