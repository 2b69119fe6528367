"""`python -m experiments.gencost`."""

import sys

from experiments.gencost.run import main

sys.exit(main())
