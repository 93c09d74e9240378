"""`rooftop demo`: the built-in campaign on the embedded engine; the last line printed is the run directory."""

from pathlib import Path

import typer

from rooftop.cli.run import run_and_report

DEMO = Path(__file__).resolve().parent.parent / "campaign" / "demo.toml"


def demo_text() -> str:
    """The demo campaign; on a machine with a GPU, the `small` preset and that GPU's roofline."""
    text = DEMO.read_text()
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no usable torch CUDA: the CPU demo
        gpu = None
    if gpu:
        text = text.replace('preset = "tiny"', 'preset = "small"').replace("of the tiny DeepSeek", "of the small DeepSeek")
        text = text.replace("[deployment]\n", f'[hardware]\ngpu = "{gpu}"\n\n[deployment]\n', 1)
    return text


def command(
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="where the run directory goes"),
) -> None:
    """Run the built-in campaign (tiny on CPU, small on a GPU) and write its documents."""
    from rooftop.campaign.runner import start

    spec, store = start(DEMO, runs_dir, text=demo_text())
    print(run_and_report(spec, store))
