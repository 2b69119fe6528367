"""`python -m experiments.soak`."""

import sys

from experiments.soak.run import main

sys.exit(main())
