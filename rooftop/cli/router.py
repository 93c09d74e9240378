"""`rooftop router`: the OpenAI-compatible front of an embedded prefill/decode pair."""

from typing import Annotated

import typer

from rooftop.errors import RooftopError


def command(
    prefill: Annotated[str, typer.Option("--prefill", help="URL of the `rooftop serve --role prefill` server")],
    decode: Annotated[str, typer.Option("--decode", help="URL of the `rooftop serve --role decode` server")],
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="0 = pick a free port (printed when ready)")] = 30000,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", help="wanted of clients on /v1 routes, and sent to the workers (start them with it too)")] = None,
) -> None:
    """Route OpenAI requests through an embedded prefill worker to its decode worker until Ctrl-C."""
    from rooftop.engine.pd.router import serve_router

    try:
        serve_router(prefill, decode, host, port, api_key)
    except (ValueError, OSError) as exc:
        raise RooftopError(f"rooftop router: {exc}", "check --prefill/--decode URLs and --host/--port") from None
