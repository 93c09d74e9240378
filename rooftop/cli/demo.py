"""`rooftop demo`: the built-in campaign on the embedded engine; the last line printed is the run directory."""

import os
from pathlib import Path

import typer

from rooftop.cli.run import run_and_report

DEMO = Path(__file__).resolve().parent.parent / "campaign" / "demo.toml"


PD_PINS = ("prefill = { cpus = [0] }", "decode = { cpus = [1] }")


def pd_pins(cpus: list[int]) -> tuple[str, str]:
    """The PD lever's worker pins: the CPUs the baseline may use, split in halves, decode taking the
    larger (so the lever changes the topology, not how many CPUs serve); one CPU serves both. On the
    2-core CI machine that is [0] and [1]."""
    half = len(cpus) // 2
    prefill, decode = (cpus[:half], cpus[half:]) if half else (cpus, cpus)
    return f"prefill = {{ cpus = {prefill} }}", f"decode = {{ cpus = {decode} }}"


def demo_text() -> str:
    """The demo campaign: the PD lever's pins sized to this machine's CPUs; on a machine with a GPU,
    the `small` preset and that GPU's roofline."""
    text = DEMO.read_text()
    for old, new in zip(PD_PINS, pd_pins(sorted(os.sched_getaffinity(0))), strict=True):
        text = text.replace(old, new)
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no usable torch CUDA: the CPU demo
        gpu = None
    if gpu:
        text = text.replace('preset = "tiny"', 'preset = "small"').replace("of the tiny DeepSeek", "of the small DeepSeek")
        text = text.replace("[deployment]\n", f'[hardware]\ngpu = "{gpu}"\n\n[deployment]\n', 1)
        # A GPU decodes the CPU's 4 x 12 tokens in a tenth of a second: too short a level for its repeats
        # to agree or for GPU telemetry (utilization is a sample over up to 1 s). Levels of 1-4 s instead.
        for old, new in (("output_len = 12", "output_len = 32"), ("requests_per_level = 4", "requests_per_level = 24")):
            assert old in text, old
            text = text.replace(old, new, 1)
    return text


def command(
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="where the run directory goes"),
) -> None:
    """Run the built-in campaign (tiny on CPU, small on a GPU) and write its documents."""
    from rooftop.campaign.runner import start

    spec, store = start(DEMO, runs_dir, text=demo_text())
    print(run_and_report(spec, store))
