"""`python -m app` is `specgate`. The guard matters: vLLM spawns its engine
processes, and a spawned child re-imports the main module."""

import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
