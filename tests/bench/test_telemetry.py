"""GPU telemetry: dcgm-exporter text parsed, NVML samples reduced to a level's figures, the samplers opened
for real (NVML where a driver is, a dcgm-exporter stand-in on 127.0.0.1), and `rooftop bench` with them."""

import asyncio
import ctypes
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from rooftop.bench.summary import level_telemetry
from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.bench.telemetry import (
    NvmlReader,
    Sample,
    Sampler,
    open_sampler,
    parse_dcgm,
    summarize,
    visible_gpus,
)

DATA = Path(__file__).parent / "data"
DCGM_TEXT = (DATA / "dcgm_exporter_h200x2.txt").read_text()
# Hand-written to look like NVML reads of two H200s; the figures below are worked out by hand from it.
HANDWRITTEN = DATA / "nvml_h200_tp2_handwritten.json"
# A real NVML stream from benchmarks/telemetry_record_gpu.py on an H200, where one has been put here; until
# then the hand-written file stands in for it (its test id says so).
RECORDED = sorted(DATA.glob("nvml_*_recorded*.json")) or [HANDWRITTEN]
ROOT = Path(__file__).resolve().parents[2]


def load_samples(path: Path) -> list[Sample]:
    return [Sample(**s) for s in json.loads(path.read_text())["samples"]]


def approx(x: float) -> pytest.approx:
    return pytest.approx(x, rel=1e-9)


def test_dcgm_exposition_gives_one_sample_per_gpu_in_each_unit():
    samples = parse_dcgm(DCGM_TEXT, t_ns=123)
    assert [s.gpu for s in samples] == [0, 1]
    g0, g1 = samples
    assert g0 == Sample(123, 0, sm_util_pct=100.0, mem_util_pct=54.0, sm_clock_mhz=1980.0,
                        mem_used_mib=130412.0, power_w=687.412, energy_j=approx(48213775.120))
    assert (g1.sm_util_pct, g1.sm_clock_mhz, g1.power_w) == (99.0, 1965.0, 674.905)
    assert g1.energy_j == approx(47990126.553)  # mJ -> J


def test_dcgm_blank_values_mig_instances_openmetrics_names_and_pod_copies():
    text = "\n".join([
        # an unsupported field: DCGM's int64 and fp64 blanks are no value
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-a"} 9223372036854775794',
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a"} 140737488355328.000000',
        # a MIG instance's series is not the whole GPU
        'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b",GPU_I_PROFILE="1g.18gb",GPU_I_ID="9"} 4000',
        'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b"} 70000',
        # OpenMetrics spelling of a counter, and a timestamp
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total{gpu="1",UUID="GPU-b"} 5000 1700000000000',
        # the same GPU once per pod using it (Kubernetes mapping): the first value counts
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",pod="a"} 80',
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",pod="b"} 80',
        'DCGM_FI_DEV_SM_CLOCK{UUID="GPU-c"} 1400',  # no gpu label
        'DCGM_FI_DEV_SM_CLOCK{gpu="2"} NaN',
    ])
    samples = parse_dcgm(text, t_ns=0)
    # GPUs 0 and 2 are there, with no value
    assert samples == [Sample(0, 0), Sample(0, 1, sm_util_pct=80.0, mem_used_mib=70000.0, energy_j=5.0), Sample(0, 2)]


def test_recorded_h200_pair_counter_and_power_integral_by_hand():
    """Expected figures worked out by hand from the hand-written file's numbers."""
    out = summarize(load_samples(HANDWRITTEN), output_tokens=4096, wall_s=1.25, source="nvml")
    g0, g1 = out["gpus"]
    # counter: the 10 increments of GPU 0, 64.113 + 68.207 + ... + 68.991 J
    assert g0["energy_counter_j"] == approx(669.295)
    # trapezoids 0.1 s apart: 0.1 * ((612.412 + 690.642) / 2 + 655.934 + 688.301 + ... + 664.073)
    assert g0["energy_power_integral_j"] == approx(0.1 * (651.527 + 6046.835))
    assert (g0["energy_j"], g0["energy_source"]) == (g0["energy_counter_j"], "counter")
    assert g1["energy_counter_j"] == approx(659.556)
    assert g1["energy_power_integral_j"] == approx(0.1 * (639.993 + 5982.167))
    assert g0["samples"] == g1["samples"] == 11 and g0["window_s"] == 1.0 and not g0["short_window"]
    assert g0["sm_util_mean_pct"] == approx(1097 / 11) and g0["sm_util_max_pct"] == 100.0
    assert g0["mem_util_mean_pct"] == approx(55.0)
    assert g0["sm_clock_mean_mhz"] == approx(21465 / 11)
    assert g0["mem_used_max_mib"] == 130414.0 and g1["mem_used_max_mib"] == 130382.0
    # the window's mean power is the counter's rise over it; the power readings' own mean is kept beside it
    assert g0["power_mean_w"] == approx(669.295 / 1.0) and g0["power_max_w"] == 700.012
    assert g0["power_gauge_mean_w"] == approx(7349.889 / 11)
    assert g0["j_per_output_token"] == approx(669.295 / 4096)

    both = out["all"]
    assert both["gpus"] == 2 and both["samples"] == 22
    assert both["energy_j"] == approx(669.295 + 659.556) and both["energy_source"] == "counter"
    assert both["j_per_output_token"] == approx((669.295 + 659.556) / 4096)
    assert both["power_total_w"] == approx(669.295 + 659.556)
    assert both["sm_util_mean_pct"] == approx(2195 / 22) and both["mem_used_max_mib"] == 130414.0
    assert both["window_s"] == approx(1.0) and both["coverage"] == approx(0.8)
    json.dumps(out)  # the store and summary.json take it as it is


def test_without_a_counter_energy_is_the_power_integral():
    """A GPU whose counter NVML does not support (before Volta) gives energy_j None in every sample."""
    samples = load_samples(HANDWRITTEN)
    for s in samples:
        s.energy_j = None
    both = summarize(samples, output_tokens=4096, wall_s=1.0)["all"]
    integral_j = 0.1 * (651.527 + 6046.835) + 0.1 * (639.993 + 5982.167)
    assert both["energy_j"] == approx(integral_j) and both["energy_source"] == "power_integral"
    assert both["j_per_output_token"] == approx(integral_j / 4096)

    samples = load_samples(HANDWRITTEN)
    for s in samples:
        if s.gpu == 1:
            s.energy_j = None
    both = summarize(samples, output_tokens=4096, wall_s=1.0)["all"]
    assert both["energy_j"] == approx(669.295 + 0.1 * (639.993 + 5982.167))
    assert both["energy_source"] == "mixed"


def test_a_counter_that_went_down_falls_back_to_the_power_integral():
    """A driver reload between two reads resets the counter: its drop is no energy."""
    samples = [s for s in load_samples(HANDWRITTEN) if s.gpu == 0]
    samples[-1].energy_j = 12.5
    g0 = summarize(samples, output_tokens=None, wall_s=1.0)["gpus"][0]
    assert g0["energy_counter_j"] is None and g0["energy_source"] == "power_integral"
    assert g0["energy_j"] == approx(0.1 * (651.527 + 6046.835))


def test_too_few_samples_give_no_energy_and_no_error():
    one = summarize([Sample(10, 0, power_w=500.0, energy_j=1000.0)], output_tokens=100, wall_s=1.0)
    assert one["gpus"][0]["energy_j"] is None and one["all"]["energy_j"] is None
    assert one["all"]["j_per_output_token"] is None and one["all"]["power_total_w"] == 500.0
    empty = summarize([], output_tokens=0, wall_s=0.0)
    assert empty["gpus"] == [] and empty["all"]["energy_j"] is None and empty["all"]["coverage"] is None
    tokenless = summarize(load_samples(HANDWRITTEN), output_tokens=0, wall_s=1.0)["all"]
    assert tokenless["energy_j"] is not None and tokenless["j_per_output_token"] is None


def test_a_window_takes_the_readings_inside_and_energy_at_its_edges():
    """The level ran from 0.05 s after GPU 0's first reading to 0.95 s: gauges from the 9 readings inside,
    counter and power read as linear between readings and taken at the edges (worked by hand)."""
    samples = [s for s in load_samples(HANDWRITTEN) if s.gpu == 0]
    t0 = samples[0].t_ns
    out = summarize(samples, output_tokens=1000, wall_s=0.9, source="nvml",
                    start_ns=t0 + 50_000_000, end_ns=t0 + 950_000_000)
    g0 = out["gpus"][0]
    assert g0["samples"] == 9 and g0["window_s"] == approx(0.9) and out["all"]["coverage"] == approx(1.0)
    # 0.9 s is shorter than the driver's utilization period (up to 1 s): no utilization for it
    assert g0["short_window"] and g0["sm_util_mean_pct"] is None and g0["mem_util_mean_pct"] is None
    assert g0["sm_clock_mean_mhz"] is not None and g0["power_max_w"] == 700.012
    # the counter's rise less half of its first step (64.113 J) and half of its last (68.991 J)
    assert g0["energy_counter_j"] == approx(669.295 - 64.113 / 2 - 68.991 / 2)
    # power at the edges: halfway between readings 0 and 1, and 9 and 10
    p_lo, p_hi = (612.412 + 655.934) / 2, (664.073 + 690.642) / 2
    inner = 688.301 + 699.757 + 700.012 + 694.228 + 671.845 + 642.519 + 630.166
    assert g0["energy_power_integral_j"] == approx(0.05 * (p_lo + 655.934) / 2 + 0.1 * (655.934 / 2 + inner + 664.073 / 2)
                                                   + 0.05 * (664.073 + p_hi) / 2)
    assert out["all"]["j_per_output_token"] == approx((669.295 - 64.113 / 2 - 68.991 / 2) / 1000)


def test_a_window_between_two_readings_interpolates_both_edges():
    """A level shorter than the interval (DCGM reads each second): no reading inside, energy still taken."""
    a, b = Sample(0, 0, sm_util_pct=50.0, power_w=100.0, energy_j=0.0), Sample(10**9, 0, sm_util_pct=70.0,
                                                                                 power_w=300.0, energy_j=200.0)
    g = summarize([a, b], output_tokens=10, wall_s=0.5, start_ns=250_000_000, end_ns=750_000_000)["gpus"][0]
    assert g["energy_counter_j"] == approx(100.0) and g["energy_power_integral_j"] == approx(0.5 * (150 + 250) / 2)
    assert g["sm_clock_mean_mhz"] is None and g["samples"] == 2  # gauges from the two readings around it
    assert g["short_window"] and g["sm_util_mean_pct"] is None  # half a second: no utilization
    assert g["power_mean_w"] == approx(100.0 / 0.5) and g["power_gauge_mean_w"] == approx(200.0)


def test_level_telemetry_gives_each_figure_an_interval_across_repeats():
    """Two repeats of a level: the windows of the first and second half of the hand-written stream."""
    samples = load_samples(HANDWRITTEN)
    t0 = min(s.t_ns for s in samples)
    halves = [summarize(samples, 2000, 0.5, "nvml", start_ns=t0 + lo, end_ns=t0 + lo + 500_000_000)
              for lo in (0, 500_000_000)]
    tel = level_telemetry(halves, confidence=0.95, seed=0)
    assert tel["source"] == "nvml" and tel["gpus"] == [0, 1] and tel["repeats"] == 2
    assert tel["energy_source"] == "counter" and tel["note"] is None and tel["windows"] == halves
    j = tel["all"]["j_per_output_token"]
    per = [h["all"]["j_per_output_token"] for h in halves]
    assert j["per_repeat"] == [round(v, 6) for v in per] and j["mean"] == round((per[0] + per[1]) / 2, 6)
    assert j["ci_low"] <= j["mean"] <= j["ci_high"] and j["ci_method"]
    assert [g["gpu"] for g in tel["per_gpu"]] == [0, 1]
    assert tel["per_gpu"][0]["energy_j"]["per_repeat"] == [round(h["gpus"][0]["energy_j"], 4) for h in halves]
    assert set(tel["all"]) == {"sm_util_mean_pct", "sm_util_max_pct", "mem_util_mean_pct", "sm_clock_mean_mhz",
                               "mem_used_max_mib", "power_total_w", "energy_j", "j_per_output_token"}
    # a repeat without a figure keeps its place in per_repeat
    halves[1]["all"]["energy_j"] = None
    e = level_telemetry(halves, 0.95, 0)["all"]["energy_j"]
    assert e["per_repeat"][1] is None and e["mean"] == round(halves[0]["all"]["energy_j"], 4)
    assert level_telemetry([], 0.95, 0) is None


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name + (" (HAND-WRITTEN: no recording yet)"
                                                                  if p == HANDWRITTEN else ""))
def test_nvml_recording_counter_agrees_with_power_integral(path):
    """A real NVML stream from an H200 (the hand-written file until one is put here): the figures match
    numpy's trapezoid and the raw counters, and the two energies agree within 10% (NVML's power is a
    1-second average on Hopper: the integral lags a change of load by about half a second, which the
    idle time at both ends of a recording takes in)."""
    samples = load_samples(path)
    out = summarize(samples, output_tokens=1000, wall_s=1.0)
    for g in out["gpus"]:
        mine = [s for s in samples if s.gpu == g["gpu"]]
        t_s = np.array([s.t_ns for s in mine], dtype=np.int64)
        t_s = (t_s - t_s[0]) / 1e9
        assert g["energy_power_integral_j"] == pytest.approx(np.trapezoid([s.power_w for s in mine], t_s))
        if mine[0].energy_j is not None:
            assert g["energy_counter_j"] == pytest.approx(mine[-1].energy_j - mine[0].energy_j)
            assert g["energy_counter_j"] == pytest.approx(g["energy_power_integral_j"], rel=0.10)
        assert g["power_max_w"] >= g["power_mean_w"] > 0 and g["sm_clock_mean_mhz"] > 0


def nvml_library_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(nvml_library_loads(), reason="this host has an NVIDIA driver")
def test_without_a_driver_it_says_why_once():
    sampler, why = open_sampler(None, None)
    assert sampler is None and why == "no NVML: libnvidia-ml.so.1 not found (no NVIDIA driver on this host)"


class FakeNvml:
    """Just what visible_gpus asks of pynvml: UUIDs of three GPUs."""

    class NVMLError(Exception):
        pass

    uuids = ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.uuids:
            raise self.NVMLError(uuid)
        return uuid

    def nvmlDeviceGetIndex(self, handle):
        return self.uuids.index(handle)


@pytest.mark.parametrize("env, gpus", [
    (None, [0, 1, 2]), ("1", [1]), ("2,0", [2, 0]), ("GPU-cccc,0", [2, 0]), (" 1 , 1", [1]),
    ("0,7,1", [0]), ("1,MIG-xyz,0", [1]),  # CUDA stops at the first entry that names no GPU
    ("", []), ("-1", []), ("GPU-zzzz", []),
])
def test_cuda_visible_devices_names_the_gpus_to_sample(env, gpus):
    got, why = visible_gpus(FakeNvml(), 3, env)
    assert got == gpus and (why is None) == bool(gpus)


@pytest.mark.gpu
@pytest.mark.skipif(not nvml_library_loads(), reason="needs an NVIDIA driver")
def test_nvml_sampler_reads_every_gpu_each_window():
    sampler, why = open_sampler(None, None, interval_s=0.05)
    assert why is None
    with sampler:
        for _ in range(2):  # start and stop again, as a bench does for each level
            sampler.start()
            samples = sampler.stop()
            gpus = sampler.reader.gpus
            assert {s.gpu for s in samples} == set(gpus) and len(samples) >= 2 * len(gpus)
            assert all(s.power_w > 0 and s.sm_clock_mhz > 0 and s.mem_used_mib > 0 for s in samples)
            assert sampler.note is None


class DcgmStandIn:
    """dcgm-exporter's /metrics on 127.0.0.1: the recorded text, GPU 0's energy counter rising 1 J per
    scrape; /other answers with an engine's metrics, anything else 404."""

    def __init__(self):
        self.scrapes = 0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/metrics":
                    stand_in.scrapes += 1
                    body = DCGM_TEXT.replace("} 48213775120", f"}} {48213775120 + 1000 * stand_in.scrapes}")
                elif self.path == "/other":
                    body = 'vllm:num_requests_running{engine="0"} 3.0\n'
                else:
                    self.send_error(404)
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def dcgm():
    server = DcgmStandIn()
    yield server
    server.close()


def test_dcgm_sampler_reads_the_exporter_over_http(dcgm):
    sampler, why = open_sampler([1, 0], f"{dcgm.url}/metrics", interval_s=0.01)
    assert why is None and sampler.source == "dcgm"
    with sampler:
        sampler.start()
        samples = sampler.stop()
    g0 = [s for s in samples if s.gpu == 0]
    assert len(g0) >= 2 and len(samples) == 2 * len(g0)  # a reading at start, one at stop
    assert {(s.power_w, s.sm_clock_mhz, s.mem_used_mib) for s in samples if s.gpu == 1} == {(674.905, 1965.0, 130380.0)}
    assert summarize(samples, 100, 1.0)["gpus"][0]["energy_counter_j"] == approx(len(g0) - 1)


def test_dcgm_sampler_of_one_gpu_leaves_the_others_out(dcgm):
    sampler, why = open_sampler([1], f"{dcgm.url}/metrics")
    with sampler:
        sampler.start()
        assert {s.gpu for s in sampler.stop()} == {1}


def test_dcgm_that_cannot_serve_says_why_without_raising(dcgm):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"
    sampler, why = open_sampler(None, closed)
    assert sampler is None and why.startswith(f"no DCGM telemetry: {closed}: ") and "refused" in why
    sampler, why = open_sampler(None, f"{dcgm.url}/missing")
    assert sampler is None and "404" in why
    sampler, why = open_sampler(None, f"{dcgm.url}/other")
    assert sampler is None and "exports no DCGM_FI_DEV_*" in why
    sampler, why = open_sampler([0, 3], f"{dcgm.url}/metrics")
    assert sampler is None and why.endswith("exports no GPU [3]")


def test_an_exporter_gone_mid_run_is_noted_and_the_window_ends(dcgm):
    sampler, why = open_sampler(None, f"{dcgm.url}/metrics", interval_s=0.01)
    dcgm.close()
    sampler.start()
    assert sampler.stop() == []
    assert sampler.note.startswith("dcgm read failed: ") and "refused" in sampler.note
    sampler.close()


def rooftop_bench(url: str, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """`rooftop bench` as a user runs it: two levels, two repeats, a few short requests."""
    done = subprocess.run(
        [sys.executable, "-m", "rooftop", "bench", "--base-url", url, "--input-len", "8", "--output-len", "4",
         "--concurrency", "1,2", "--num-requests", "4", "--repeats", "2", "--warmup", "1", "--out", str(out), *flags],
        capture_output=True, text=True, cwd=ROOT, timeout=300, env={**os.environ, "COLUMNS": "250"})
    assert done.returncode == 0, done.stderr
    return done


def test_bench_reads_a_dcgm_exporter_over_each_level(fake_server, dcgm, tmp_path):
    srv = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    done = rooftop_bench(srv.url, tmp_path, "--dcgm-url", f"{dcgm.url}/metrics")
    assert "telemetry off" not in done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["telemetry_note"] is None and summary["config"]["dcgm_url"] == f"{dcgm.url}/metrics"
    for lv in summary["levels"]:
        tel = lv["telemetry"]
        assert tel["source"] == "dcgm" and tel["gpus"] == [0, 1] and tel["repeats"] == 2 and tel["note"] is None
        # the window is the level's own, from the readings just before it and just after
        assert tel["coverage"] == 1.0 and all(w["all"]["coverage"] == approx(1.0) for w in tel["windows"])
        a = tel["all"]
        # levels of a few ms: shorter than the utilization period, so none; the rest as scraped
        assert a["sm_util_mean_pct"]["mean"] is None and a["mem_util_mean_pct"]["mean"] is None
        assert all(g["short_window"] for w in tel["windows"] for g in w["gpus"])
        assert a["sm_clock_mean_mhz"]["mean"] == 1972.5 and a["mem_used_max_mib"]["mean"] == 130412.0
        # GPU 0's counter rises (1 J a scrape); GPU 1's stands still: its energy is its power over the window
        assert tel["energy_source"] == "mixed"
        g1 = tel["per_gpu"][1]
        for w in tel["windows"]:
            w0, w1 = w["gpus"]
            assert w["output_tokens"] == 4 * 4 and w0["energy_source"] == "counter" and w0["energy_j"] > 0
            assert w1["energy_source"] == "power_integral" and w1["energy_j"] == approx(674.905 * w["wall_s"])
            assert w["all"]["j_per_output_token"] == approx((w0["energy_j"] + w1["energy_j"]) / 16)
            # power: GPU 0's from its counter over the window, GPU 1's (counter standing still) as read
            assert w0["power_mean_w"] == approx(w0["energy_j"] / w0["window_s"]) and w1["power_mean_w"] == 674.905
            assert w["all"]["power_total_w"] == approx(w0["power_mean_w"] + 674.905)
        assert g1["energy_j"]["per_repeat"] == [round(w["gpus"][1]["energy_j"], 4) for w in tel["windows"]]
        assert a["j_per_output_token"]["per_repeat"] == [round(w["all"]["j_per_output_token"], 6)
                                                         for w in tel["windows"]]
    # the table shows the telemetry: total power and J per token as the summary has them
    assert "GPU util %" in done.stdout and "power W" in done.stdout and "J/tok" in done.stdout
    assert "GPU telemetry from DCGM over GPU 0,1" in done.stdout


@pytest.mark.skipif(nvml_library_loads(), reason="this host has an NVIDIA driver")
def test_bench_without_a_gpu_says_so_once_and_goes_on(fake_server, tmp_path):
    srv = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    done = rooftop_bench(srv.url, tmp_path)
    line = "GPU telemetry off: no NVML: libnvidia-ml.so.1 not found (no NVIDIA driver on this host)"
    assert done.stderr.count("telemetry") == 1 and line in done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["telemetry_note"] == line and summary["complete"]
    assert [lv["telemetry"] for lv in summary["levels"]] == [None, None]
    assert [lv["completed"] for lv in summary["levels"]] == [8, 8]
    assert "GPU util" not in done.stdout and "J/tok" not in done.stdout

    quiet = rooftop_bench(srv.url, tmp_path, "--no-telemetry")
    assert "telemetry" not in quiet.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["telemetry_note"] == "GPU telemetry off: not asked for (--no-telemetry)"


@pytest.mark.gpu
@pytest.mark.skipif(not nvml_library_loads(), reason="needs an NVIDIA driver")
def test_bench_samples_every_gpu_through_nvml(fake_server, tmp_path):
    """On a GPU host: each level's telemetry from NVML over every visible GPU, its window the level's own."""
    srv = fake_server("--ttft-ms", "5", "--itl-ms", "2")
    notes = []
    cfg = BenchConfig(base_url=srv.url, input_len=16, output_len=16, concurrency=[1, 4], num_requests=8, repeats=2,
                      warmup=1, out_dir=tmp_path)
    summary = asyncio.run(run_bench(cfg, on_note=notes.append)).summary
    sampler, _ = open_sampler(None, None)
    gpus = sampler.reader.gpus
    sampler.close()
    assert notes == [] and summary["telemetry_note"] is None
    for lv in summary["levels"]:
        tel = lv["telemetry"]
        assert tel["source"] == "nvml" and tel["gpus"] == gpus and tel["repeats"] == 2, tel
        assert tel["note"] is None and tel["coverage"] == 1.0
        assert tel["energy_source"] == "counter", "the H200's energy counter (Volta and later) was not read"
        a = tel["all"]
        assert a["power_total_w"]["mean"] > 0 and a["sm_clock_mean_mhz"]["mean"] > 0
        util = a["sm_util_mean_pct"]["mean"]
        short = all(g["short_window"] for w in tel["windows"] for g in w["gpus"])
        assert a["mem_used_max_mib"]["mean"] > 0 and (util is None if short else 0 <= util <= 100)
        assert all(e > 0 for e in a["energy_j"]["per_repeat"])
        for w in tel["windows"]:
            assert w["all"]["j_per_output_token"] == approx(w["all"]["energy_j"] / w["output_tokens"])
            assert all(g["samples"] >= 1 for g in w["gpus"])


class FlakyNvml:
    """A stand-in for pynvml over two GPUs: GPU 1's power read fails every time with a transient error, and
    it has no energy counter (NOT_SUPPORTED: not a failure to report); GPU 0 reads 400 W."""

    NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_UNKNOWN, NVML_CLOCK_SM = 3, 13, 999, 1

    class NVMLError(Exception):
        def __init__(self, value):
            self.value = value

        def __str__(self):
            return "Unknown Error" if self.value == 999 else f"NVML error {self.value}"

    class Util:
        gpu, memory = 80, 40

    class Memory:
        used = 1 << 30

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return self.Util()

    def nvmlDeviceGetClockInfo(self, h, which):
        return 1980

    def nvmlDeviceGetMemoryInfo(self, h):
        return self.Memory()

    def nvmlDeviceGetPowerUsage(self, h):
        if h == 1:
            raise self.NVMLError(self.NVML_ERROR_UNKNOWN)
        return 400_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)

    def nvmlShutdown(self):
        pass


def test_a_failing_nvml_call_is_named_per_gpu_and_the_others_still_count():
    sampler = Sampler(NvmlReader(FlakyNvml(), [0, 1]), interval_s=0.05)
    sampler.start()
    samples = sampler.stop()
    n = sampler.reader.reads
    assert n >= 2 and len(samples) == 2 * n
    assert sampler.note == f"nvml reads failed: GPU 1 power failed in {n} of {n} reads (Unknown Error)"
    # a new window counts afresh
    sampler.start()
    sampler.stop()
    assert sampler.note.endswith(f"in {sampler.reader.reads} of {sampler.reader.reads} reads (Unknown Error)")
    # GPU 1's missing power leaves the all-GPU power and energy over GPU 0, said so
    t0 = samples[0].t_ns
    two = [Sample(t0 + i * 10**8, g, power_w=400.0 if g == 0 else None) for i in range(21) for g in (0, 1)]
    out = summarize(two, output_tokens=1000, wall_s=2.0, source="nvml", note=sampler.note)
    a = out["all"]
    assert a["power_total_w"] == approx(400.0) and a["power_gpus"] == [0]
    assert a["energy_j"] == approx(800.0) and a["energy_gpus"] == [0] and a["j_per_output_token"] == approx(0.8)
    assert out["note"] == (sampler.note + "; power over all GPUs sums GPU 0 only (GPU 1 gave none); energy over "
                           "all GPUs sums GPU 0 only (GPU 1 gave none)")


def test_a_gap_in_the_readings_is_noted_and_taken_off_the_coverage():
    """A 10-s level read every 0.1 s, but no reading between 0.2 s and 9.8 s (no read failed)."""
    s = 1_000_000_000
    ts = [-0.05, 0.1, 0.2, 9.8, 9.9, 10.05]
    samples = [Sample(int(t * s), 0, sm_util_pct=0.0, power_w=100.0, energy_j=1000 + 100 * t) for t in ts]
    out = summarize(samples, output_tokens=1000, wall_s=10.0, source="nvml", start_ns=0, end_ns=10 * s,
                    interval_s=0.1)
    a = out["all"]
    assert a["max_gap_s"] == approx(9.6) and a["window_s"] == approx(10.0)
    assert a["coverage"] == approx((10.0 - (9.6 - 0.1)) / 10.0)  # the gap leaves all but one interval out
    assert out["note"] == ("no reading for 9.6 s at a stretch (GPU 0; readings every 0.1 s): the gauges miss "
                           "that time and coverage leaves it out")
    assert a["energy_j"] == approx(1000.0)  # the counter's rise is whole whatever the gaps
    tel = level_telemetry([out], 0.95, 0)
    assert tel["coverage"] == approx(0.05) and tel["max_gap_s"] == approx(9.6) and tel["note"] == out["note"]
    # steady readings: no note, full coverage
    even = [Sample(int(t * s / 10), 0, power_w=100.0) for t in range(-1, 102)]
    steady = summarize(even, 1000, 10.0, "nvml", start_ns=0, end_ns=10 * s, interval_s=0.1)
    assert steady["note"] is None and steady["all"]["coverage"] == approx(1.0)


@pytest.mark.parametrize(("url", "why"), [
    ("localhost/metrics", "needs http:// or https:// before the host"), ("dcgm-host", "needs http:// or https://"),
    ("http://[::1", "not a URL (Invalid IPv6 URL)"), ("http://", "names no host"),
    ("http://h:port/metrics", "not a URL"),
])
def test_a_malformed_dcgm_url_says_why_without_raising(url, why):
    sampler, note = open_sampler(None, url)
    assert sampler is None and note.startswith(f"no DCGM telemetry: {url}: ") and why in note
