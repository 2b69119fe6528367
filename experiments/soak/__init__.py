"""The gateway's memory over a long run at 2x the knee."""
