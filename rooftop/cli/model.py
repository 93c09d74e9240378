"""`rooftop model init --arch ARCH --preset tiny DIR`: a model directory to serve with random weights."""

from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(help="Model directories of real architectures (config.json + tokenizer), no download.",
                  no_args_is_help=True, add_completion=False)


@app.command("init")
def init(
    directory: Path = typer.Argument(..., metavar="DIR", help="where to write config.json and the tokenizer"),
    arch: str = typer.Option(..., "--arch", help="llama, qwen3_moe or deepseek_v2 (`rooftop model list`)"),
    preset: str = typer.Option("tiny", "--preset", help="tiny (a 2-core CPU) or small (one GPU)"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing config.json"),
) -> None:
    """Write config.json (the architecture's own keys) and a printable-ASCII tokenizer; serve it with
    random weights, e.g. `vllm serve DIR --load-format dummy`."""
    from rooftop.models import init_model_dir, model_config

    written = init_model_dir(directory, arch, preset, force)
    config = model_config(arch, preset)
    Console(highlight=False).print(
        f"{config['architectures'][0]} ({preset}: {config['num_hidden_layers']} layers, hidden "
        f"{config['hidden_size']}) in {directory}: " + ", ".join(p.name for p in written))


@app.command("list")
def list_() -> None:
    """The architectures and presets `rooftop model init` writes."""
    from rooftop.models import ARCHS, PRESETS, model_config

    console = Console(highlight=False)
    for arch in ARCHS:
        sizes = ", ".join(f"{p} ({model_config(arch, p)['num_hidden_layers']} layers, hidden "
                          f"{model_config(arch, p)['hidden_size']})" for p in PRESETS)
        console.print(f"{arch:12} {model_config(arch, 'tiny')['architectures'][0]:24} {sizes}")
