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

DATASETS = ("random", "sharegpt", "prefix")


@dataclass(slots=True, kw_only=True)
class BenchSettings:
    """What a bench run is asked to load, and how it reports: the same fields whichever front end filled them."""

    dataset: str = "random"  # one of DATASETS
    dataset_path: str | None = None  # a local ShareGPT JSON (or JSONL) file, for dataset "sharegpt"
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
        """A ShareGPT file exists: checked where the run starts, not where a stored campaign is read back."""
        say = spelling or FLAGS
        if self.dataset == "sharegpt" and self.dataset_path and not Path(self.dataset_path).is_file():
            raise SettingError("dataset_path", f"{say.subject('dataset_path', self.dataset_path)} is not a file "
                               f"(from {Path.cwd()})", f"point {say.name('dataset_path')} at a local ShareGPT JSON "
                               "(or JSONL) file")


class SettingError(RooftopError):
    """A bench setting that breaks a rule; `setting` is the field its problem starts with."""

    def __init__(self, setting: str, problem: str, fix: str):
        super().__init__(problem, fix)
        self.setting = setting


_NO_VALUE = object()


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
        in TOML; strings quoted in both, but for a dataset's name on the command line."""
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, float):
            text = repr(value)
            return text[:-2] if text.endswith(".0") else text
        if isinstance(value, list):
            items = [self.value(setting, v) for v in value]
            return ",".join(items) if self.flags else f"[{', '.join(items)}]"
        if isinstance(value, str) and not isinstance(value, Word) and not (self.flags and setting == "dataset"):
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
    "dcgm_url": "--dcgm-url", "client_procs": "--client-procs",
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


def sharegpt_file(s: BenchSettings, say: Spelling) -> None:
    if s.dataset == "sharegpt" and not s.dataset_path:
        raise SettingError("dataset", f"{say.subject('dataset', 'sharegpt')} needs {say.name('dataset_path')}",
                           "point it at a local ShareGPT JSON file")


def closed_loop_levels(s: BenchSettings, say: Spelling) -> None:
    if not s.request_rate and not s.concurrency:
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


def open_loop_cap(s: BenchSettings, say: Spelling) -> None:
    c = s.max_concurrency
    if c is not None and not s.request_rate:
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
    if s.num_requests is None and s.duration_s is None:
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


DATASET_RULES: tuple[Rule, ...] = (known_dataset, prompt_length, output_length, shared_prefix, sharegpt_file)
RULES: tuple[Rule, ...] = (
    *DATASET_RULES, closed_loop_levels, open_loop_rates, one_kind_of_loop, open_loop_cap, level_bounds,
    repeats_and_warmup, confidence_level, request_timeout, telemetry_choice, client_processes,
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
