"""`python -m rooftop.engine ...`: run the embedded engine's server on its own (argparse, no rooftop CLI)."""

import argparse
import sys

from rooftop.engine.build import add_arguments, config_from_args
from rooftop.engine.parent_watch import add_parent_pid, exit_with_parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rooftop.engine",
                                     description="The rooftop embedded engine: an OpenAI-compatible server.")
    add_arguments(parser)
    add_parent_pid(parser)
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    cfg = config_from_args(args)
    from rooftop.engine.server import serve  # after parsing, so --help does not wait for torch

    try:
        return serve(cfg)
    except (ValueError, OSError) as exc:  # bad flags, port taken: one line, no traceback
        print(f"rooftop-engine: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
