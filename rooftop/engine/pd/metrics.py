"""Prometheus metrics of prefill/decode disaggregation, added to a role's (or the router's) registry."""

from prometheus_client import CollectorRegistry, Counter, Histogram

from rooftop.engine.engine import StepRecord

# loopback transfers of a short prompt take ~1 ms; a long prompt across hosts, seconds
TRANSFER_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class PDMetrics:
    """KV transfer bytes, latency and failures; prompt tokens a decode worker computed (0 unless preempted)."""

    def __init__(self, registry: CollectorRegistry, model_name: str, role: str):
        labels = {"model_name": model_name, "role": role}
        names = list(labels)
        self.transfer_bytes = Counter(
            "rooftop_pd_kv_transfer_bytes", "KV bytes sent (prefill, router) or received (decode), frames included.",
            names, registry=registry).labels(**labels)
        self.transfers = Counter("rooftop_pd_kv_transfers", "KV transfers completed.", names,
                                 registry=registry).labels(**labels)
        self.transfer_seconds = Histogram(
            "rooftop_pd_kv_transfer_seconds", "Wall time of one KV transfer, connect to the decode worker's answer.",
            names, buckets=TRANSFER_BUCKETS_S, registry=registry).labels(**labels)
        self._failures = Counter("rooftop_pd_kv_transfer_failures", "KV transfers that failed, by reason.",
                                 [*names, "reason"], registry=registry)
        # only a decode worker has it: "decode never recomputes the prompt" reads 0 there
        self.decode_prompt_tokens = Counter(
            "rooftop_pd_decode_prompt_tokens_computed",
            "Prompt tokens a decode worker computed for sequences that arrived with their KV (0 unless preempted).",
            names, registry=registry).labels(**labels) if role == "decode" else None
        self._labels = labels

    def transferred(self, num_bytes: int, seconds: float) -> None:
        self.transfers.inc()
        self.transfer_bytes.inc(num_bytes)
        self.transfer_seconds.observe(seconds)

    def failed(self, reason: str) -> None:
        self._failures.labels(**self._labels, reason=reason).inc()

    def on_step(self, record: StepRecord) -> None:
        """Step listener of a decode worker's engine."""
        if record.num_imported_prompt_tokens and self.decode_prompt_tokens is not None:
            self.decode_prompt_tokens.inc(record.num_imported_prompt_tokens)
