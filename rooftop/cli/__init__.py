"""The `rooftop` command: thin. Each sub-module parses one command's flags and calls its package.

Every command is registered here; a user error (RooftopError) ends as one red line, never a traceback.
"""

import importlib
import signal
import sys

import typer
from rich.console import Console
from rich.markup import escape

from rooftop.errors import RooftopError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="rooftop: find and document the ceiling of an LLM serving deployment.",
    pretty_exceptions_enable=False,
)

# (module under rooftop.cli, command name): a module that fails to import fails the command line.
_COMMANDS = [
    ("demo", "demo"),
    ("run", "run"),
    ("deploy", "deploy"),
    ("bench", "bench"),
    ("calibrate", "calibrate"),
    ("profile", "profile"),
    ("roofline", "roofline"),
    ("serve", "serve"),
    ("router", "router"),
    ("report", "report"),
    ("model", "model"),
]

for _module, _name in _COMMANDS:
    _mod = importlib.import_module(f"rooftop.cli.{_module}")
    if hasattr(_mod, "app"):  # a command with subcommands (`rooftop model init`)
        app.add_typer(_mod.app, name=_name)
    else:
        app.command(_name, context_settings={"help_option_names": ["-h", "--help"]})(_mod.command)


def _spread_goodput(argv: list[str]) -> list[str]:
    """`--goodput ttft:500 tpot:50` (vllm bench serve's spelling: several values after one flag) as
    typer reads a repeated option: `--goodput ttft:500 --goodput tpot:50`."""
    out: list[str] = []
    values = None  # values taken since the last --goodput; None outside one
    for arg in argv:
        if arg == "--goodput":
            values = 0
            continue
        if values is not None and (values == 0 or (":" in arg and not arg.startswith("-"))):
            out += ["--goodput", arg]  # the first value whatever it is: a bad one gets --goodput's own error
            values += 1
            continue
        if values == 0:
            out.append("--goodput")
        values = None
        out.append(arg)
    if values == 0:
        out.append("--goodput")  # a flag with no value: typer says so
    return out


def main() -> None:
    """Entry point of the console script."""
    # A background job of a non-interactive shell starts with SIGINT ignored, and Python then raises no
    # KeyboardInterrupt: rooftop's own handler makes Ctrl-C (or kill -INT) tear deployments down anyway.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        app(args=_spread_goodput(sys.argv[1:]))
    except RooftopError as exc:
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        Console(stderr=True).print("[yellow]interrupted[/]")
        sys.exit(130)
