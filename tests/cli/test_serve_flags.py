"""`rooftop serve` takes the same flags as `python -m rooftop.engine` (its help says so), and they reach
the engine's ServeConfig with the same meaning."""

import argparse

import typer
from typer.main import get_command

from rooftop.cli import serve
from rooftop.engine.build import add_arguments

ENGINE_ONLY = {"--parent-pid", "--help"}  # python -m rooftop.engine's supervisor hook (its README says so)


def serve_flags() -> set[str]:
    app = typer.Typer()
    app.command()(serve.command)
    return {o for p in get_command(app).params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}


def test_serve_takes_every_engine_flag():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    engine = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    assert engine - serve_flags() - ENGINE_ONLY == set()
    assert {"--cuda-graphs", "--no-cuda-graphs", "--threads"} <= serve_flags()


def test_no_cuda_graphs_reaches_the_config(monkeypatch):
    from typer.testing import CliRunner

    import rooftop.engine.server as server

    seen = []
    monkeypatch.setattr(server, "serve", lambda cfg: seen.append(cfg) or 0)
    app = typer.Typer()
    app.command()(serve.command)
    for argv in (["--no-cuda-graphs", "--threads", "3", "--no-enable-prefix-caching"], []):
        done = CliRunner().invoke(app, argv, catch_exceptions=False)
        assert done.exit_code == 0, done.output
    assert [(c.cuda_graphs, c.threads, c.enable_prefix_caching) for c in seen] == [(False, 3, False), (True, None, True)]
