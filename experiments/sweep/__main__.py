"""`python -m experiments.sweep`."""

import sys

from experiments.sweep.run import main

sys.exit(main())
