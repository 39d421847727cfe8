"""``python -m daskvine_py.factory``: a worker pool for a manager running elsewhere; see
``batch.factory``."""

import sys

from daskvine_py.batch.factory import main

if __name__ == "__main__":
    sys.exit(main())
