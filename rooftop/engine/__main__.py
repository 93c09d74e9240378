"""`python -m rooftop.engine`: see rooftop/engine/cli.py."""

import sys

from rooftop.engine.cli import main

sys.exit(main())
