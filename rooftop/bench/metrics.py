"""Per-request latencies and per-level figures, from records alone (pure functions).

Definitions (also in docs/statistics.md):
- TTFT: first token-carrying chunk's arrival minus the moment the generator decided to send.
- ITL: gap between consecutive token-carrying chunks of one request (a chunk that carries several
  tokens, e.g. under MTP, is one gap: ITL is per chunk, TPOT per token).
- TPOT: (E2E - TTFT) / (output tokens - 1), for requests with at least two output tokens.
- E2E: end of the response minus the decision to send.
- output tok/s: output tokens of the level's successful requests over the level's wall time.
- goodput: requests that met the SLO (bench/slo.py) over the level's wall time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rooftop.bench.records import RequestRecord

NS_PER_MS = 1e6


def ttft_ms(r: RequestRecord) -> float | None:
    return (r.chunk_ns[0] - r.decided_ns) / NS_PER_MS if r.ok and r.chunk_ns else None


def e2e_ms(r: RequestRecord) -> float | None:
    return (r.end_ns - r.decided_ns) / NS_PER_MS if r.ok and r.end_ns is not None else None


def tpot_ms(r: RequestRecord) -> float | None:
    """(E2E − TTFT) / (output tokens − 1); None for a one-token answer, and for one not streamed (its
    tokens arrived together: no time between them is known)."""
    n = r.output_tokens
    if not r.ok or not r.streamed or not r.chunk_ns or n < 2 or r.end_ns is None:
        return None
    return (r.end_ns - r.chunk_ns[0]) / NS_PER_MS / (n - 1)


def itl_ms(r: RequestRecord) -> list[float]:
    if not r.ok or not r.streamed:
        return []
    t = r.chunk_ns
    return [(t[i] - t[i - 1]) / NS_PER_MS for i in range(1, len(t))]


def mean_in_flight(records: list[RequestRecord], t0_ns: int, t1_ns: int) -> float:
    """Time-weighted mean number of requests in flight over [t0, t1] (decision to end)."""
    if t1_ns <= t0_ns:
        return float("nan")
    busy = 0
    for r in records:
        end = r.end_ns if r.end_ns is not None else t1_ns
        lo, hi = max(r.decided_ns, t0_ns), min(end, t1_ns)
        if hi > lo:
            busy += hi - lo
    return busy / (t1_ns - t0_ns)


@dataclass(slots=True)
class TokenCheck:
    """Disagreements between what was asked, what the server's usage says and the client's count."""

    output_len_mismatch: int = 0  # server usage completion_tokens != requested output length
    usage_vs_client_output: int = 0  # server completion_tokens != client tokenizer count
    usage_vs_client_input: int = 0  # server prompt_tokens != client tokenizer count
    no_usage: int = 0  # successful requests whose server sent no usage
    examples: list[dict] = field(default_factory=list)

    @property
    def any(self) -> bool:
        return bool(self.output_len_mismatch or self.usage_vs_client_output or self.usage_vs_client_input)


def token_check(records: list[RequestRecord], forced_length: bool, max_examples: int = 5) -> TokenCheck:
    """Every mismatch is counted and shown with examples; none is silently resolved."""
    tc = TokenCheck()
    for r in records:
        if not r.ok:
            continue
        if r.completion_tokens_server is None:
            tc.no_usage += 1
            continue
        bad = {}
        if forced_length and r.expected_output_len is not None and r.completion_tokens_server != r.expected_output_len:
            tc.output_len_mismatch += 1
            bad["requested_output"] = r.expected_output_len
        if r.completion_tokens_client is not None and r.completion_tokens_client != r.completion_tokens_server:
            tc.usage_vs_client_output += 1
            bad["client_output"] = r.completion_tokens_client
        if (
            r.prompt_tokens_client is not None and r.prompt_tokens_server is not None
            and r.prompt_tokens_client != r.prompt_tokens_server
        ):
            tc.usage_vs_client_input += 1
            bad["client_input"] = r.prompt_tokens_client
        if bad and len(tc.examples) < max_examples:
            bad.update(
                index=r.index, repeat=r.repeat, server_output=r.completion_tokens_server,
                server_input=r.prompt_tokens_server,
            )
            tc.examples.append(bad)
    return tc


@dataclass(slots=True)
class RunFigures:
    """One level of one repeat, reduced to the figures a summary needs."""

    completed: int
    failed: int
    error_classes: dict[str, int]
    wall_s: float
    output_tokens: int
    input_tokens: int
    output_tok_s: float
    total_tok_s: float
    request_s: float
    ttft_ms: list[float]
    tpot_ms: list[float]
    itl_ms: list[float]
    e2e_ms: list[float]
    achieved_concurrency: float  # mean in flight while the generator was still issuing
    achieved_rate: float  # requests actually sent per second
    slo_met: int | None = None  # requests that met the SLO (bench/slo.py); None without one


def run_figures(records: list[RequestRecord], start_ns: int, end_ns: int, last_decided_ns: int,
                meets_slo: Callable[[RequestRecord], bool] | None = None) -> RunFigures:
    """Reduce one level-run's records (warm-up excluded by the caller); `meets_slo` (bench/slo.py)
    counts the requests that met an SLO."""
    ok = [r for r in records if r.ok]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            errors[r.error_class or "unknown"] = errors.get(r.error_class or "unknown", 0) + 1
    wall_s = max(end_ns - start_ns, 1) / 1e9
    out_tok = sum(r.output_tokens for r in ok)
    in_tok = sum(r.input_tokens for r in ok)
    window_end = last_decided_ns if last_decided_ns > start_ns else end_ns
    # Dispatch rate from when requests really left (a cap or a late loop shows here), not from
    # when they were scheduled: n sends span n-1 gaps.
    sent = sorted(r.sent_ns for r in records if r.sent_ns is not None)
    achieved_rate = (len(sent) - 1) / ((sent[-1] - sent[0]) / 1e9) if len(sent) > 1 and sent[-1] > sent[0] else 0.0
    return RunFigures(
        completed=len(ok), failed=len(records) - len(ok), error_classes=errors, wall_s=wall_s,
        output_tokens=out_tok, input_tokens=in_tok, output_tok_s=out_tok / wall_s,
        total_tok_s=(out_tok + in_tok) / wall_s, request_s=len(ok) / wall_s,
        ttft_ms=[v for r in ok if (v := ttft_ms(r)) is not None],
        tpot_ms=[v for r in ok if (v := tpot_ms(r)) is not None],
        itl_ms=[v for r in ok for v in itl_ms(r)],
        e2e_ms=[v for r in ok if (v := e2e_ms(r)) is not None],
        achieved_concurrency=mean_in_flight(records, start_ns, window_end),
        achieved_rate=achieved_rate,
        slo_met=sum(meets_slo(r) for r in records) if meets_slo is not None else None,
    )
