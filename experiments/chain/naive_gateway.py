"""The naive chain's gateway process: ``NaiveProxy`` on uvicorn.

python -m experiments.chain.naive_gateway --port P --upstream http://127.0.0.1:Q
"""

from __future__ import annotations

import argparse

import uvicorn

from experiments.chain.naive import NaiveProxy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    uvicorn.run(NaiveProxy(args.upstream), host="127.0.0.1", port=args.port, log_level="warning",
                interface="asgi3", backlog=4096)  # fmt: skip


if __name__ == "__main__":
    main()
