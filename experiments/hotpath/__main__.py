"""`python -m experiments.hotpath`."""

from experiments.hotpath.run import main

main()
