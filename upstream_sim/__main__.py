"""``python -m upstream_sim`` from a checkout: forwards to ``ballast_tools.upstream_sim``."""

import sys

from ballast_tools.upstream_sim.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
