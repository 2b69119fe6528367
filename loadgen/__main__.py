"""``python -m loadgen`` from a checkout: forwards to ``ballast_tools.loadgen``."""

import sys

from ballast_tools.loadgen.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
