"""`GET /metrics`: the server's counters in Prometheus' text format, named as vLLM names its own (requests,
prompt and generated tokens, draft tokens verified and accepted, the queue, time to first token), so that the
dashboards people already have read them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specchat.engine.stats import GenerationStats

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)  # seconds


class Metrics:
    """One server's counters since it started; `waiting` and `running` are read when scraped."""

    def __init__(self, waiting, running):
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter("specchat_requests", "Requests answered, by HTTP status", ["status"],
                                registry=registry)
        self.prompt_tokens = Counter("specchat_prompt_tokens", "Prompt tokens of the requests run", registry=registry)
        self.cached_tokens = Counter("specchat_prompt_tokens_cached", "Prompt tokens whose keys and values were cached",
                                     registry=registry)
        self.generation_tokens = Counter("specchat_generation_tokens", "Tokens generated", registry=registry)
        self.steps = Counter("specchat_decode_steps", "Target forwards after the prefills (a step: one verified tree)",
                             registry=registry)
        self.draft_tokens = Counter("specchat_spec_decode_num_draft_tokens", "Draft tokens verified",
                                    registry=registry)
        self.accepted_tokens = Counter("specchat_spec_decode_num_accepted_tokens", "Draft tokens accepted",
                                       registry=registry)
        self.time_to_first_token = Histogram("specchat_time_to_first_token_seconds",
                                             "From a request's arrival to its first token", buckets=TTFT_BUCKETS,
                                             registry=registry)
        Gauge("specchat_num_requests_waiting", "Requests queued", registry=registry).set_function(waiting)
        Gauge("specchat_num_requests_running", "Requests generating", registry=registry).set_function(running)
        self.decode_tokens = Counter("specchat_decode_tokens", "Tokens committed by decode steps",
                                     registry=registry)
        self._decoded = self._stepped = 0  # tau's terms, as the counters hold them
        tau = Gauge("specchat_mean_accepted_length", "Tokens a decode step, over every request (tau)",
                    registry=registry)
        tau.set_function(lambda: self._decoded / self._stepped if self._stepped else 0.0)

    def answered(self, status: int) -> None:
        self.requests.labels(status=str(status)).inc()

    def ran(self, stats: GenerationStats | None) -> None:
        """A request the engine ran, to its end or cut short."""
        if stats is None:
            return
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cached_tokens.inc(stats.reused_tokens)
        self.generation_tokens.inc(stats.new_tokens)
        self.decode_tokens.inc(stats.decode_tokens)
        self.steps.inc(stats.steps)
        self._decoded += stats.decode_tokens
        self._stepped += stats.steps
        self.draft_tokens.inc(stats.drafted_nodes)
        self.accepted_tokens.inc(stats.accepted)

    def render(self) -> bytes:
        return generate_latest(self.registry)
