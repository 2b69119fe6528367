"""`python -m experiments.demo`."""

import sys

from experiments.demo.run import main

sys.exit(main())
