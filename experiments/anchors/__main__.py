"""``python -m experiments.anchors`` (see ``experiments/anchors/run.py``)."""

import sys

from experiments.anchors.run import main

if __name__ == "__main__":
    sys.exit(main())
