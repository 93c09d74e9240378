"""`python -m rooftop.engine`: see rooftop/engine/cli.py."""

import sys

from rooftop.engine.cli import main

if __name__ == "__main__":  # not when multiprocessing's spawn imports the main module in the engine process
    sys.exit(main())
