"""``python -m experiments.chain``: see ``experiments.chain.run``."""

from experiments.chain.run import main

raise SystemExit(main())
