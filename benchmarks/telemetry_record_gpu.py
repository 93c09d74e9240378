"""Raw NVML samples of the GPUs while a load runs, through rooftop's own NVML sampler, written in the shape of
tests/bench/data/nvml_*.json. GPU only; needs nvidia-ml-py and a driver, and torch for the built-in load
(nothing else of rooftop's dependencies).

    python3 benchmarks/telemetry_record_gpu.py --out "$OUT/nvml_h200_recorded.json" [--gpus 0] [-- CMD ...]

Sampling starts; after --idle-before seconds the load starts: by default a child python3 that runs bf16
matmuls on every GPU CUDA sees (the environment is passed on as it is), full tilt for half of --load-seconds, then in short bursts with pauses
(utilization well under 100%) for the rest; a command after `--` replaces it. When the load has run
--load-seconds (a command still running then is ended: SIGTERM, SIGKILL 5 s later), sampling goes on for
--idle-after seconds, so that the window holds the power ramp at both ends (NVML's power is a 1-second
average on Hopper). Prints each GPU's figures with the energy counter's rise beside the power integrated
over the same window. Copy the file to tests/bench/data/nvml_h200_recorded.json: test_telemetry.py then
checks it in place of the hand-written one.
"""

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # rooftop from this checkout, installed or not

from rooftop.bench.telemetry import NVML_INTERVAL_S, open_sampler, summarize  # noqa: E402
from rooftop.provenance import provenance  # noqa: E402

# The built-in load, run as `python3 -c LOAD SECONDS` on every GPU CUDA sees.
LOAD = """
import sys, time, torch
gpus, seconds = range(torch.cuda.device_count()), float(sys.argv[1])
xs = [torch.randn(8192, 8192, device=f"cuda:{g}", dtype=torch.bfloat16) for g in gpus]
end_full, end = time.monotonic() + seconds / 2, time.monotonic() + seconds
while time.monotonic() < end:
    for x in xs:
        for _ in range(8):
            x @ x
    for g in gpus:
        torch.cuda.synchronize(g)
    if time.monotonic() > end_full:  # the second half: a burst, then as long idle
        time.sleep(0.02)
"""


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else x


def main() -> None:
    argv = sys.argv[1:]
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--gpus", default=None, help="NVML indexes, comma-separated (default: CUDA_VISIBLE_DEVICES, else all)")
    ap.add_argument("--idle-before", type=float, default=1.5, help="seconds sampled before the load")
    ap.add_argument("--load-seconds", type=float, default=8.0, help="seconds of load")
    ap.add_argument("--idle-after", type=float, default=2.5, help="seconds sampled after the load")
    ap.add_argument("--interval", type=float, default=NVML_INTERVAL_S, help="seconds between readings")
    args = ap.parse_args(argv)

    sampler, why = open_sampler(None if args.gpus is None else [int(g) for g in args.gpus.split(",")], None,
                                args.interval)
    if sampler is None:
        sys.exit(why)
    nv, handles, gpus = sampler.reader.nvml, sampler.reader.handles, sampler.reader.gpus
    devices = [{"gpu": g, "name": _text(nv.nvmlDeviceGetName(h)), "uuid": _text(nv.nvmlDeviceGetUUID(h)),
                "memory_total_mib": nv.nvmlDeviceGetMemoryInfo(h).total // (1 << 20)}
               for g, h in zip(gpus, handles, strict=True)]
    driver = _text(nv.nvmlSystemGetDriverVersion())
    if not command:
        command = [sys.executable, "-c", LOAD, str(args.load_seconds)]

    with sampler:
        sampler.start()
        t0_ns = time.perf_counter_ns()
        time.sleep(args.idle_before)
        load_start_ns = time.perf_counter_ns()
        proc = subprocess.Popen(command)
        try:
            exit_code = proc.wait(args.load_seconds + 60)  # the load's own set-up (CUDA context) comes first
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
            exit_code = proc.wait()
        load_end_ns = time.perf_counter_ns()
        time.sleep(args.idle_after)
        samples = sampler.stop()
        t1_ns = time.perf_counter_ns()

    doc = {
        "provenance": provenance(),
        "note": f"RECORDED by benchmarks/telemetry_record_gpu.py on {platform.node()}: idle, the load, idle",
        "source": "nvml",
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "recorded": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(command[:2] + ["LOAD"] + command[3:]) if command[1:2] == ["-c"] else " ".join(command),
        "command_exit": exit_code,
        "driver": driver,
        "nvml_py": getattr(nv, "__version__", None),
        "devices": devices,
        "interval_s": args.interval,
        "seconds": (t1_ns - t0_ns) / 1e9,
        "load_window_ns": [load_start_ns, load_end_ns],
        "read_note": sampler.note,
        "unsupported": sorted(f"GPU {g}: {name}" for g, name in sampler.reader.unsupported),
        "samples": [dataclasses.asdict(s) for s in samples],
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")

    whole = summarize(samples, output_tokens=None, wall_s=doc["seconds"], source="nvml")
    load = summarize(samples, output_tokens=None, wall_s=(load_end_ns - load_start_ns) / 1e9, source="nvml",
                     start_ns=load_start_ns, end_ns=load_end_ns)
    print(f"{len(samples)} samples of GPU {','.join(map(str, gpus))} over {whole['all']['window_s']:.2f} s "
          f"(driver {driver}; load exit {exit_code}; read note {sampler.note}; unsupported {doc['unsupported']})")

    def f(x, spec):
        return format(x, spec) if x is not None else "-".rjust(int(spec.split(".")[0]))

    print(f"{'window':<6} {'gpu':>3} {'name':<14} {'n':>4} {'W mean':>7} {'W max':>7} {'SM MHz':>6} {'SM %':>5} "
          f"{'mem %':>5} {'MiB max':>8} {'counter J':>10} {'integral J':>10} {'diff %':>6}")
    for name, out in (("whole", whole), ("load", load)):
        for g, d in zip(out["gpus"], devices, strict=True):
            c, i = g["energy_counter_j"], g["energy_power_integral_j"]
            diff = f"{100 * (i - c) / c:6.2f}" if c and i is not None else f"{'-':>6}"
            print(f"{name:<6} {g['gpu']:>3} {d['name'][:14]:<14} {g['samples']:>4} {f(g['power_mean_w'], '7.1f')} "
                  f"{f(g['power_max_w'], '7.1f')} {f(g['sm_clock_mean_mhz'], '6.0f')} "
                  f"{f(g['sm_util_mean_pct'], '5.1f')} {f(g['mem_util_mean_pct'], '5.1f')} "
                  f"{f(g['mem_used_max_mib'], '8.0f')} {f(c, '10.1f')} {f(i, '10.1f')} {diff}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
