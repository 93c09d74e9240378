"""Bench settings as users give them (`rooftop bench` flags, a campaign's [bench] table), checked once for
every caller: each rule is one function with one wording, naming the setting the way the caller spells it
(`--input-len 0: ...` on the command line; `bench.input_len: 0: ...` in a campaign file)."""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rooftop.errors import RooftopError

TRACE_DATASETS = ("mooncake", "burstgpt", "azure", "trace")  # replayed on their own clock (bench/traces.py)
DATASETS = ("random", "sharegpt", "prefix", *TRACE_DATASETS, "conversation")
RAMP_STRATEGIES = ("linear", "exponential")  # bench/arrivals.py


@dataclass(slots=True, kw_only=True)
class BenchSettings:
    """What a bench run is asked to load, and how it reports: the same fields whichever front end filled them."""

    dataset: str = "random"  # one of DATASETS
    dataset_path: str | None = None  # a local ShareGPT JSON (or JSONL) file, or a trace file (TRACE_DATASETS)
    input_len: int = 256  # prompt tokens (random and prefix datasets)
    output_len: int = 256  # tokens each request generates; 0 with sharegpt: each conversation's own length
    prefix_len: int = 0  # shared prefix tokens, counted in input_len (dataset "prefix" only)
    concurrency: list[int] = field(default_factory=lambda: [1])  # closed-loop levels: requests in flight
    request_rate: list[float] = field(default_factory=list)  # open-loop levels, requests/s; then concurrency = []
    max_concurrency: int | None = None  # open loop: cap on requests in flight
    num_requests: int | None = 64  # per level; None: no count, the duration alone bounds each level
    duration_s: float | None = None  # seconds each level issues requests (num_requests, if given, caps it)
    repeats: int = 1
    warmup: int = 4  # warm-up requests, left out of every statistic
    seed: int = 0  # of the prompts, the arrivals and the bootstrap
    tokenizer: str | None = None  # local HF tokenizer dir; None: the server's /tokenize
    confidence: float = 0.95  # of every interval
    timeout_s: float = 600.0  # per request
    force_length: bool = True  # ignore_eos and min_tokens: every answer is output_len tokens long
    stream: bool = True
    # GPU telemetry over each level (bench/telemetry.py): NVML on this host, or a dcgm-exporter's /metrics
    telemetry: bool = True
    gpus: list[int] | None = None  # NVML indexes to sample; None: CUDA_VISIBLE_DEVICES, else every GPU
    dcgm_url: str | None = None  # read instead of NVML where given
    client_procs: int | None = None  # client processes per level; None: one per 256 streams, at most one per CPU
    # Arrivals of an open loop, as vllm bench serve spells them (bench/arrivals.py)
    burstiness: float = 1.0  # gamma shape of the gaps between arrivals; 1: Poisson
    ramp_up_strategy: str | None = None  # linear | exponential: one level whose rate moves from start to end
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None
    # Trace replay (TRACE_DATASETS): requests go at the trace's timestamps, divided by the speedup
    trace_speedup: float = 1.0
    trace_window_s: tuple[float, float] | None = None  # [start, end) in seconds of trace time; end may be inf
    # Multi-turn sessions (dataset "conversation", or "sharegpt" with multi_turn): each turn sends the history
    multi_turn: bool = False  # sharegpt: whole conversations, each human turn a request
    sessions: int = 16  # conversations per level
    turns: int = 4  # conversation: turns per session
    turn_input_len: int = 128  # conversation: new user tokens per turn
    turn_output_len: int = 64  # conversation: tokens each reply generates
    think_time_s: float = 0.0  # between a reply and the session's next turn
    # HOST:PORT of an OTLP/HTTP receiver for the server's request and step spans (bench/otlp_receiver.py)
    otlp_receiver: str | None = None

    @property
    def trace(self) -> bool:
        """Whether the dataset is a trace replayed on its own clock."""
        return self.dataset in TRACE_DATASETS

    @property
    def conversations(self) -> bool:
        """Whether a level runs multi-turn sessions (each turn sends the history so far)."""
        return self.dataset == "conversation" or (self.dataset == "sharegpt" and self.multi_turn)

    def check(self, spelling: Spelling | None = None) -> None:
        """Every rule below, in order; the first broken one raises its SettingError."""
        say = spelling or FLAGS
        for rule in RULES:
            rule(self, say)

    def check_dataset(self, spelling: Spelling | None = None) -> None:
        """The rules of the dataset alone (what building prompts needs)."""
        say = spelling or FLAGS
        for rule in DATASET_RULES:
            rule(self, say)

    def check_dataset_file(self, spelling: Spelling | None = None) -> None:
        """A ShareGPT or trace file exists: checked where the run starts, not where a stored campaign is read
        back."""
        say = spelling or FLAGS
        if (self.dataset == "sharegpt" or self.trace) and self.dataset_path and not Path(self.dataset_path).is_file():
            raise SettingError("dataset_path", f"{say.subject('dataset_path', self.dataset_path)} is not a file "
                               f"(from {Path.cwd()})", f"point {say.name('dataset_path')} at {_FILE_OF[self.dataset]}")


class SettingError(RooftopError):
    """A bench setting that breaks a rule; `setting` is the field its problem starts with."""

    def __init__(self, setting: str, problem: str, fix: str):
        super().__init__(problem, fix)
        self.setting = setting


_NO_VALUE = object()
_CHOICES = ("dataset", "ramp_up_strategy")  # settings whose value is one of a few words: unquoted as flags


class Word(str):
    """A placeholder in an example (`N`, `SECONDS`): written as is, never quoted."""


@dataclass(frozen=True, slots=True)
class Spelling:
    """How a front end writes a setting in an error: `rooftop bench`'s flags, or a campaign's [bench] keys."""

    names: dict[str, str]  # field -> flag or key
    flags: bool  # True: `--input-len 0`; False: `input_len = 0`

    def name(self, setting: str) -> str:
        return self.names.get(setting, setting)

    def value(self, setting: str, value: object) -> str:
        """A value as the user would write it: `1,8,16` and `prefix` as flags, `[1, 8, 16]` and `'prefix'`
        in TOML; strings quoted in both, but for a choice of words (a dataset's name) on the command line."""
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, float):
            text = repr(value)
            return text[:-2] if text.endswith(".0") else text
        if isinstance(value, list):
            items = [self.value(setting, v) for v in value]
            return ",".join(items) if self.flags else f"[{', '.join(items)}]"
        if isinstance(value, str) and not isinstance(value, Word) and not (self.flags and setting in _CHOICES):
            return repr(value)
        return str(value)

    def say(self, setting: str, value: object = _NO_VALUE) -> str:
        """The setting, with a value when given: `--input-len 256` / `input_len = 256`; `--no-telemetry`."""
        if value is _NO_VALUE:
            return self.name(setting)
        if self.flags and isinstance(value, bool):
            return self.name(setting) if value else "--no-" + self.name(setting).removeprefix("--")
        return f"{self.name(setting)} {self.value(setting, value)}" if self.flags else \
            f"{self.name(setting)} = {self.value(setting, value)}"

    def subject(self, setting: str, value: object = _NO_VALUE) -> str:
        """How a problem about `setting` starts: the flag and its value, or (in a campaign, whose error names
        the key already) the value alone."""
        if self.flags or value is _NO_VALUE:
            return self.say(setting, value)
        return self.value(setting, value)


# The flags of `rooftop bench`, and the keys of a campaign's [bench] (a field's own name where not listed).
FLAGS = Spelling({
    "dataset": "--dataset", "dataset_path": "--dataset-path", "input_len": "--input-len",
    "output_len": "--output-len", "prefix_len": "--prefix-len", "concurrency": "--concurrency",
    "request_rate": "--request-rate", "max_concurrency": "--max-concurrency", "num_requests": "--num-requests",
    "duration_s": "--duration", "repeats": "--repeats", "warmup": "--warmup", "seed": "--seed",
    "tokenizer": "--tokenizer", "confidence": "--confidence", "timeout_s": "--timeout",
    "force_length": "--ignore-eos", "stream": "--stream", "telemetry": "--telemetry", "gpus": "--gpus",
    "dcgm_url": "--dcgm-url", "client_procs": "--client-procs", "burstiness": "--burstiness",
    "ramp_up_strategy": "--ramp-up-strategy", "ramp_up_start_rps": "--ramp-up-start-rps",
    "ramp_up_end_rps": "--ramp-up-end-rps", "trace_speedup": "--trace-speedup", "trace_window_s": "--trace-window",
    "multi_turn": "--multi-turn", "sessions": "--sessions", "turns": "--turns", "turn_input_len": "--turn-input-len",
    "turn_output_len": "--turn-output-len", "think_time_s": "--think-time", "otlp_receiver": "--otlp-receiver",
}, flags=True)
KEYS = Spelling({"num_requests": "requests_per_level"}, flags=False)

Rule = Callable[[BenchSettings, Spelling], None]


def _positive_finite(x: float) -> bool:
    return 0 < x < math.inf  # nan fails both comparisons


def known_dataset(s: BenchSettings, say: Spelling) -> None:
    if s.dataset not in DATASETS:
        raise SettingError("dataset", f"{say.subject('dataset', s.dataset)} is not one rooftop builds",
                           f"use one of {', '.join(DATASETS)}")


def prompt_length(s: BenchSettings, say: Spelling) -> None:
    if s.input_len < 1:
        raise SettingError("input_len", f"{say.subject('input_len', s.input_len)}: a prompt needs at least one token",
                           f"e.g. {say.say('input_len', 256)}")


def output_length(s: BenchSettings, say: Spelling) -> None:
    """ShareGPT alone takes an output length of 0: each conversation's own answer length."""
    if s.output_len < 1 and not (s.output_len == 0 and s.dataset == "sharegpt"):
        raise SettingError("output_len", f"{say.subject('output_len', s.output_len)}: a request must generate at "
                           "least one token (TTFT and TPOT are times of generated tokens)",
                           f"e.g. {say.say('output_len', 256)}; with {say.say('dataset', 'sharegpt')}, 0 takes each "
                           "answer's own length")


def shared_prefix(s: BenchSettings, say: Spelling) -> None:
    """The prefix dataset shares a prefix shorter than the prompt; no other dataset shares one."""
    if s.dataset == "prefix" and not 1 <= s.prefix_len < s.input_len:
        raise SettingError("prefix_len", f"{say.subject('prefix_len', s.prefix_len)}: {say.say('dataset', 'prefix')} "
                           f"shares a prefix of at least 1 token and fewer than {say.name('input_len')} "
                           f"({s.input_len})", f"e.g. {say.say('prefix_len', max(1, s.input_len // 2))}")
    if s.dataset != "prefix" and s.prefix_len:
        raise SettingError("prefix_len", f"{say.subject('prefix_len', s.prefix_len)} has no effect with "
                           f"{say.say('dataset', s.dataset)}: only {say.say('dataset', 'prefix')} shares a prefix",
                           f"use {say.say('dataset', 'prefix')}, whose {say.name('input_len')} counts the prefix too, "
                           f"or drop {say.name('prefix_len')}")


_FILE_OF = {
    "sharegpt": "a local ShareGPT JSON (or JSONL) file",
    "mooncake": "a Mooncake trace (JSON Lines: timestamp, input_length, output_length, hash_ids)",
    "burstgpt": "a BurstGPT CSV (Timestamp, Model, Request tokens, Response tokens, ...)",
    "azure": "an Azure LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens)",
    "trace": "a rooftop trace (JSON Lines: timestamp_ms, input_len, output_len, optional hash_ids or prompt)",
}


def sharegpt_file(s: BenchSettings, say: Spelling) -> None:
    """ShareGPT and the traces are read from a file."""
    if (s.dataset == "sharegpt" or s.trace) and not s.dataset_path:
        raise SettingError("dataset", f"{say.subject('dataset', s.dataset)} needs {say.name('dataset_path')}",
                           f"point it at {_FILE_OF[s.dataset]}")


def trace_replay(s: BenchSettings, say: Spelling) -> None:
    """A trace sets its own clock: a positive speedup, a window of trace time, no rate or ramp beside it."""
    if not _positive_finite(s.trace_speedup):
        raise SettingError("trace_speedup", f"{say.subject('trace_speedup', s.trace_speedup)}: a speedup is a "
                           "positive, finite factor (2: the trace's gaps halved)", f"e.g. {say.say('trace_speedup', 2.0)}")
    w = s.trace_window_s
    if w is not None and not (len(w) == 2 and 0 <= w[0] < w[1] and not math.isnan(w[1])):
        raise SettingError("trace_window_s", f"{say.subject('trace_window_s', _window(w, say))}: a window is "
                           "START:END seconds of trace time, 0 <= START < END (END may be left out: to the end)",
                           f"e.g. {say.say('trace_window_s', Word('0:600') if say.flags else [0, 600])}")
    given = [f for f, on in (("trace_speedup", s.trace_speedup != 1.0), ("trace_window_s", w is not None)) if on]
    if given and not s.trace:
        raise SettingError(given[0], f"{say.subject(given[0])} has no effect with "
                           f"{say.say('dataset', s.dataset)}: only a trace is replayed on its own clock",
                           f"use {say.name('dataset')} {' | '.join(TRACE_DATASETS)} with {say.name('dataset_path')}")
    if s.trace and (s.request_rate or s.ramp_up_strategy or s.burstiness != 1.0):
        extra = "request_rate" if s.request_rate else "ramp_up_strategy" if s.ramp_up_strategy else "burstiness"
        raise SettingError(extra, f"{say.subject(extra)} has no effect with {say.say('dataset', s.dataset)}: a "
                           "trace's requests go at its own timestamps", f"drop {say.name(extra)}; "
                           f"{say.name('trace_speedup')} scales the trace's clock")


def _window(w, say: Spelling) -> object:
    """A trace window as the user wrote it: START:END on the command line, [START, END] in a file."""
    if not say.flags or w is None or len(w) != 2:
        return list(w) if w is not None else w
    end = "" if w[1] == math.inf else f"{w[1]:g}"
    return Word(f"{w[0]:g}:{end}")


def multi_turn_sessions(s: BenchSettings, say: Spelling) -> None:
    """Sessions, turns and their lengths are counts of at least 1; think time is 0 or more seconds."""
    if s.multi_turn and s.dataset != "sharegpt":
        raise SettingError("multi_turn", f"{say.subject('multi_turn', True)} reads ShareGPT's conversations and has "
                           f"no effect with {say.say('dataset', s.dataset)}",
                           f"use {say.say('dataset', 'sharegpt')} {say.say('multi_turn', True)}, or "
                           f"{say.say('dataset', 'conversation')} for synthetic sessions")
    for name in ("sessions", "turns", "turn_input_len", "turn_output_len"):
        if getattr(s, name) < 1:
            raise SettingError(name, f"{say.subject(name, getattr(s, name))}: a session needs at least 1",
                               f"e.g. {say.say(name, {'sessions': 16, 'turns': 4}.get(name, 128))}")
    if not (0 <= s.think_time_s < math.inf):
        raise SettingError("think_time_s", f"{say.subject('think_time_s', s.think_time_s)}: the time between a "
                           "reply and the next turn is 0 or more seconds", f"e.g. {say.say('think_time_s', 1.0)}")


def closed_loop_levels(s: BenchSettings, say: Spelling) -> None:
    if s.concurrency and (s.trace or s.ramp_up_strategy):
        why = (f"{say.say('dataset', s.dataset)} replays its requests at the trace's own times" if s.trace
               else f"{say.name('ramp_up_strategy')} sends its requests on a rising schedule")
        raise SettingError("concurrency", f"{say.subject('concurrency', s.concurrency)} has no effect: {why} (an "
                           "open loop)", f"drop {say.name('concurrency')}; cap requests in flight with "
                           f"{say.name('max_concurrency')}")
    if not s.request_rate and not s.concurrency and not (s.trace or s.ramp_up_strategy):
        raise SettingError("concurrency", f"{say.subject('concurrency', s.concurrency)}: a sweep needs at least one "
                           "level", f"e.g. {say.say('concurrency', [1, 8, 16])}")
    if any(c < 1 for c in s.concurrency):
        raise SettingError("concurrency", f"{say.subject('concurrency', s.concurrency)}: a closed-loop level keeps at "
                           "least 1 request in flight", f"e.g. {say.say('concurrency', [1, 8, 16])}")


def open_loop_rates(s: BenchSettings, say: Spelling) -> None:
    if not all(_positive_finite(r) for r in s.request_rate):
        raise SettingError("request_rate", f"{say.subject('request_rate', s.request_rate)} needs positive, finite "
                           f"rates (requests/s); for every request at once run a closed loop instead "
                           f"({say.say('concurrency', Word('N'))})", f"e.g. {say.say('request_rate', [2, 4, 8])}")


def one_kind_of_loop(s: BenchSettings, say: Spelling) -> None:
    if s.concurrency and s.request_rate:
        raise SettingError("concurrency", f"{say.subject('concurrency')} (closed-loop levels) and "
                           f"{say.name('request_rate')} (open-loop levels) were both given: a sweep is one or the "
                           "other", f"drop {say.name('concurrency')} (cap an open loop with "
                           f"{say.name('max_concurrency')}), or drop {say.name('request_rate')}")


def open_loop_arrivals(s: BenchSettings, say: Spelling) -> None:
    """Burstiness shapes an open loop's gaps; a ramp-up is one open-loop level of a counted set of requests
    whose rate moves from start to end (vllm bench serve's rules: no --request-rate beside it)."""
    if not _positive_finite(s.burstiness):
        raise SettingError("burstiness", f"{say.subject('burstiness', s.burstiness)}: burstiness is the gamma "
                           "shape of the gaps between arrivals, a positive, finite number (1: Poisson; under 1 "
                           "burstier)", f"e.g. {say.say('burstiness', 0.5)}")
    if s.burstiness != 1.0 and not (s.request_rate or s.ramp_up_strategy) and not s.trace:
        raise SettingError("burstiness", f"{say.subject('burstiness', s.burstiness)} shapes open-loop arrivals "
                           f"and has no effect without {say.name('request_rate')} or {say.name('ramp_up_strategy')}",
                           f"add {say.say('request_rate', [4])}, or drop {say.name('burstiness')}")
    ends = [f for f in ("ramp_up_start_rps", "ramp_up_end_rps") if getattr(s, f) is not None]
    if s.ramp_up_strategy is None:
        if ends:
            raise SettingError(ends[0], f"{say.subject(ends[0])} has no effect without "
                               f"{say.name('ramp_up_strategy')}", f"add {say.say('ramp_up_strategy', 'linear')}")
        return
    if s.ramp_up_strategy not in RAMP_STRATEGIES:
        raise SettingError("ramp_up_strategy", f"{say.subject('ramp_up_strategy', s.ramp_up_strategy)} is not a "
                           "ramp-up strategy", f"use one of {', '.join(RAMP_STRATEGIES)}")
    for f in ("ramp_up_start_rps", "ramp_up_end_rps"):
        v = getattr(s, f)
        if v is None or not _positive_finite(v):
            raise SettingError(f, f"{say.subject(f, v) if v is not None else say.name(f) if say.flags else 'not given'}: "
                               f"{say.say('ramp_up_strategy', s.ramp_up_strategy)} needs a positive, finite rate "
                               "(requests/s) at both ends", f"e.g. {say.say('ramp_up_start_rps', 1)} "
                               f"{say.say('ramp_up_end_rps', 10)}")
    if s.request_rate:
        raise SettingError("request_rate", f"{say.subject('request_rate', s.request_rate)} and "
                           f"{say.name('ramp_up_strategy')} were both given: the ramp sets the rate",
                           f"drop {say.name('request_rate')}")
    if s.num_requests is None:
        raise SettingError("ramp_up_strategy", f"{say.subject('ramp_up_strategy', s.ramp_up_strategy)} moves the "
                           f"rate over the level's requests and needs their count", f"add "
                           f"{say.say('num_requests', 200)}")


def open_loop_cap(s: BenchSettings, say: Spelling) -> None:
    c = s.max_concurrency
    if c is not None and not (s.request_rate or s.ramp_up_strategy or s.trace):
        raise SettingError("max_concurrency", f"{say.subject('max_concurrency', c)} caps an open loop's requests in "
                           f"flight and has no effect without {say.name('request_rate')}",
                           f"for a closed loop of {c} users use {say.say('concurrency', [c])}; or add "
                           f"{say.name('request_rate')} to cap its arrivals at {c} in flight")
    if c is not None and c < 1:
        raise SettingError("max_concurrency", f"{say.subject('max_concurrency', c)}: a cap on requests in flight is "
                           "at least 1", f"e.g. {say.say('max_concurrency', 16)}, or drop it for no cap")


def level_bounds(s: BenchSettings, say: Spelling) -> None:
    """A level ends after a count of requests and/or a time."""
    if s.num_requests is not None and s.num_requests < 1:
        raise SettingError("num_requests", f"{say.subject('num_requests', s.num_requests)}: a level needs at least "
                           "one request", f"e.g. {say.say('num_requests', 64)}, or {say.say('duration_s', Word('SECONDS'))} "
                           "alone")
    if s.duration_s is not None and not _positive_finite(s.duration_s):
        raise SettingError("duration_s", f"{say.subject('duration_s', s.duration_s)}: a level's duration must be a "
                           "positive, finite number of seconds", f"e.g. {say.say('duration_s', 60)}")
    if s.num_requests is None and s.duration_s is None and not (s.trace or s.conversations):
        raise SettingError("num_requests", f"neither {say.name('num_requests')} nor {say.name('duration_s')} is "
                           "given: a level would never end", f"e.g. {say.say('num_requests', 64)}")


def repeats_and_warmup(s: BenchSettings, say: Spelling) -> None:
    if s.repeats < 1:
        raise SettingError("repeats", f"{say.subject('repeats', s.repeats)}: a sweep runs at least once",
                           f"e.g. {say.say('repeats', 3)}")
    if s.warmup < 0:
        raise SettingError("warmup", f"{say.subject('warmup', s.warmup)}: a count of warm-up requests is 0 or more",
                           f"e.g. {say.say('warmup', 4)}, or 0 for none")


def confidence_level(s: BenchSettings, say: Spelling) -> None:
    if not 0.5 < s.confidence < 1.0:
        raise SettingError("confidence", f"{say.subject('confidence', s.confidence)} is not a confidence level: it "
                           "must lie strictly between 0.5 and 1 (a share, not a percentage)",
                           f"e.g. {say.say('confidence', 0.95)}")


def request_timeout(s: BenchSettings, say: Spelling) -> None:
    if not _positive_finite(s.timeout_s):
        raise SettingError("timeout_s", f"{say.subject('timeout_s', s.timeout_s)}: a request's timeout must be a "
                           "positive, finite number of seconds", f"e.g. {say.say('timeout_s', 600)}")


def telemetry_choice(s: BenchSettings, say: Spelling) -> None:
    """GPUs and a dcgm-exporter choose what telemetry samples: with telemetry off they would do nothing."""
    given = [f for f, v in (("gpus", s.gpus is not None), ("dcgm_url", s.dcgm_url is not None)) if v]
    if not s.telemetry and given:
        names = " and ".join(say.subject(f) for f in given)
        raise SettingError(given[0], f"{names} {'has' if len(given) == 1 else 'have'} no effect with "
                           f"{say.say('telemetry', False)}", f"drop {say.say('telemetry', False)} to sample the "
                           f"GPUs, or drop {' and '.join(say.name(f) for f in given)}")
    if s.gpus is not None and (not s.gpus or any(g < 0 for g in s.gpus)):
        raise SettingError("gpus", f"{say.subject('gpus', s.gpus)} needs GPU indexes from 0 (as nvidia-smi numbers "
                           "them)", f"e.g. {say.say('gpus', [0, 1])}")
    problem = dcgm_url_problem(s.dcgm_url) if s.dcgm_url is not None else None
    if problem:
        raise SettingError("dcgm_url", f"{say.subject('dcgm_url', s.dcgm_url)} {problem}",
                           f"e.g. {say.say('dcgm_url', 'http://HOST:9400/metrics')}")


def client_processes(s: BenchSettings, say: Spelling) -> None:
    if s.client_procs is not None and s.client_procs < 1:
        raise SettingError("client_procs", f"{say.subject('client_procs', s.client_procs)}: a level needs at least "
                           "one client process", f"e.g. {say.say('client_procs', 2)}, or drop it to pick one per 256 "
                           "requests in flight")


def otlp_receiver_address(s: BenchSettings, say: Spelling) -> None:
    """The receiver listens on HOST:PORT (a port of 0: any free one)."""
    if s.otlp_receiver is None:
        return
    host, sep, port = s.otlp_receiver.rpartition(":")
    if not (sep and host and port.isdigit() and int(port) <= 65535):
        raise SettingError("otlp_receiver", f"{say.subject('otlp_receiver', s.otlp_receiver)} is not HOST:PORT",
                           f"e.g. {say.say('otlp_receiver', '127.0.0.1:4318')}, and start the engine with "
                           "--otlp-traces-endpoint http://127.0.0.1:4318/v1/traces")


DATASET_RULES: tuple[Rule, ...] = (known_dataset, prompt_length, output_length, shared_prefix, sharegpt_file,
                                   multi_turn_sessions)
RULES: tuple[Rule, ...] = (
    *DATASET_RULES, trace_replay, closed_loop_levels, open_loop_rates, one_kind_of_loop, open_loop_arrivals,
    open_loop_cap, level_bounds,
    repeats_and_warmup, confidence_level, request_timeout, telemetry_choice, client_processes, otlp_receiver_address,
)


def dcgm_url_problem(url: str) -> str | None:
    """What is wrong with a dcgm-exporter URL in a few words (it needs http:// or https:// and a host),
    or None when it can be asked."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as e:
        return f"not a URL ({e})"
    if parts.scheme not in ("http", "https"):
        return "needs http:// or https:// before the host"
    if not parts.hostname:
        return "names no host"
    return None
