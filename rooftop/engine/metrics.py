"""Prometheus metrics of the engine, in a registry of their own (several engines may share a process)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rooftop.engine.engine import StepRecord

# step times from ~1 ms (GPU decode) to seconds (long CPU prefill)
STEP_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class EngineMetrics:
    """Gauges read the engine when scraped; counters and the histogram follow each step."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        r = self.registry
        self.running = Gauge("rooftop_engine_num_requests_running", "Requests holding KV pages (prefilling or decoding).",
                             ["model_name"], registry=r).labels(**labels)
        self.waiting = Gauge("rooftop_engine_num_requests_waiting", "Requests queued without KV pages.",
                             ["model_name"], registry=r).labels(**labels)
        self.kv_usage = Gauge("rooftop_engine_kv_cache_usage", "Fraction of KV-cache pages in use (0..1).",
                              ["model_name"], registry=r).labels(**labels)
        self.prefill_tokens = Counter("rooftop_engine_prefill_tokens", "Prompt tokens computed (recomputes included).",
                                      ["model_name"], registry=r).labels(**labels)
        self.decode_tokens = Counter("rooftop_engine_decode_tokens", "Tokens computed by decode steps.",
                                     ["model_name"], registry=r).labels(**labels)
        self.preemptions = Counter("rooftop_engine_preemptions", "Requests preempted (pages freed, to recompute).",
                                   ["model_name"], registry=r).labels(**labels)
        # vLLM's names and units (tokens), so --metrics-url reads the embedded engine as it reads vLLM
        self.prefix_queries = Counter("vllm:prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache as requests were admitted.",
                                      ["model_name"], registry=r).labels(**labels)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                                   ["model_name"], registry=r).labels(**labels)
        # speculative decoding, as vLLM names and counts it (0 without --speculative-config): sequences a step
        # verified drafts of, their draft tokens, those accepted, and those accepted at each draft position
        self.spec_drafts = Counter("vllm:spec_decode_num_drafts", "Draft proposals verified (a sequence's drafts "
                                   "in one step).", ["model_name"], registry=r).labels(**labels)
        self.spec_draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified.",
                                         ["model_name"], registry=r).labels(**labels)
        self.spec_accepted_tokens = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                                            ["model_name"], registry=r).labels(**labels)
        self._spec_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                     "Draft tokens accepted, by their position among a step's drafts (0: first).",
                                     ["model_name", "position"], registry=r)
        self.requests = Counter("rooftop_engine_requests", "Requests finished, by reason.",
                                ["model_name", "finish_reason"], registry=r)
        self._step = Histogram("rooftop_engine_step_seconds", "Wall time of one engine step, by kind.",
                               ["model_name", "kind"], buckets=STEP_BUCKETS_S, registry=r)
        self._step_kind = {k: self._step.labels(model_name=model_name, kind=k) for k in ("prefill", "decode")}
        self._device = Histogram(
            "rooftop_engine_step_device_seconds",
            "Device time of one engine step's forward (CUDA events; GPU steps that sampled), by kind.",
            ["model_name", "kind"], buckets=STEP_BUCKETS_S, registry=r)
        self._device_kind = {k: self._device.labels(model_name=model_name, kind=k) for k in ("prefill", "decode")}
        self.model_name = model_name

    def attach(self, engine) -> None:
        """Read the engine's queues and cache at scrape time; count its steps as they happen.
        engine: an Engine, or an EngineProcess (its figures as the engine process last sent them)."""
        self.running.set_function(lambda: engine.num_running)
        self.waiting.set_function(lambda: engine.num_waiting)
        self.kv_usage.set_function(lambda: engine.kv_cache_usage)
        engine.step_listeners.append(self.on_step)

    def on_step(self, record: StepRecord) -> None:
        self.prefill_tokens.inc(record.num_tokens - record.num_decode_tokens)
        self.decode_tokens.inc(record.num_decode_tokens)
        if record.num_preemptions:
            self.preemptions.inc(record.num_preemptions)
        if record.num_prefix_query_tokens:
            self.prefix_queries.inc(record.num_prefix_query_tokens)
            self.prefix_hits.inc(record.num_prefix_hit_tokens)
        if record.num_accepted_tokens_per_pos is not None:  # a speculative step: every position, 0s included
            self.spec_drafts.inc(record.num_drafts)
            self.spec_draft_tokens.inc(record.num_draft_tokens)
            self.spec_accepted_tokens.inc(record.num_accepted_tokens)
            for position, n in enumerate(record.num_accepted_tokens_per_pos):
                self._spec_per_pos.labels(model_name=self.model_name, position=str(position)).inc(n)
        self._step_kind[record.kind].observe(record.seconds)
        if record.device_seconds is not None:
            self._device_kind[record.kind].observe(record.device_seconds)

    def finished(self, reason: str) -> None:
        self.requests.labels(model_name=self.model_name, finish_reason=reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
