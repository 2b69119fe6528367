"""`python -m experiments.bench`."""

import sys

from experiments.bench.run import main

sys.exit(main())
