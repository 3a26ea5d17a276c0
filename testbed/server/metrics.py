"""Prometheus metrics for the server under vLLM v1's names (vllm/v1/metrics/loggers.py), so vLLM's Grafana
dashboards and autoscalers read them unchanged; series only this project has use the `testbed:` prefix.

Every series carries vLLM's labels model_name and engine ("0": one engine per server). Gauges, the
engine-wide counters (prefix-cache queries/hits, preemptions, speculative decoding) and the per-step
histogram (iteration tokens) are updated by the stepping thread after every loop turn, from the engine's
own cumulative counters; per-request counters and histograms are fed from the request outputs as the
stepping thread sees them (prometheus_client is thread-safe). Latencies are on the engine clock, from the
moment the HTTP request was received (vLLM: from the engine's receipt), so queue time includes parsing
and tokenization.
"""

from __future__ import annotations

from collections.abc import Hashable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.parser import text_string_to_metric_families

from testbed.outputs import RequestOutput

disable_created_metrics()  # no *_created series (as vLLM); process-wide in prometheus_client

# vLLM's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]  # fmt: skip
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000]
PARAMS_N_BUCKETS = [1, 2, 5, 10, 20]  # vLLM's request_params_n
ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
FINISH_REASONS = ("stop", "length", "abort", "error")  # vLLM's FinishReason values


class ServerMetrics:
    def __init__(self, model_name: str, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        r, labels, values = self.registry, ["model_name", "engine"], [model_name, "0"]

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=r).labels(*values)

        def counter(name, doc):
            return Counter(name, doc, labels, registry=r).labels(*values)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(*values)

        # ---- vLLM's series ----
        self.num_running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.num_waiting = gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed (including ones not yet handed to the engine).",
        )
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self._finished = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels + ["finished_reason"],
            registry=r,
        )
        for reason in FINISH_REASONS:
            self._finished.labels(*values, reason)
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", TOKEN_BUCKETS
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            LATENCY_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            LATENCY_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            LATENCY_BUCKETS,
        )
        # the request's own parameters, at finish (vLLM: FinishedRequestStats.n_param / max_tokens_param);
        # deviation: fixed 1-2-5 buckets to 100000 (vLLM builds them up to max_model_len)
        self.params_n = histogram("vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS)
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", TOKEN_BUCKETS
        )
        self.max_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            TOKEN_BUCKETS,
        )
        self._cache_info_set = False
        self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.spec_accepted = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        self._spec_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            labels + ["position"],
            registry=r,
        )
        # ---- this project's series ----
        self.kv_free_blocks = gauge("testbed:kv_cache_free_blocks", "Free KV-cache blocks (cached-free included).")
        self.kv_num_blocks = gauge("testbed:kv_cache_num_blocks", "KV-cache blocks in total.")
        self.prefix_hit_rate = gauge("testbed:prefix_cache_hit_rate", "Prefix-cache hits / queries, in tokens.")
        self.grammar_time = counter(
            "testbed:structured_output_time_seconds", "Time spent on grammar masks and matcher updates."
        )
        self._rejected = Counter(
            "testbed:request_rejected",
            "Requests refused before the engine saw them.",
            labels + ["reason"],
            registry=r,
        )
        for reason in ("queue_full", "shutting_down"):
            self._rejected.labels(*values, reason)
        self._labels = values
        self._seen: dict[Hashable, float] = {}  # engine counter -> value already added to its Prometheus counter
        self._last_step = 0
        self._last_token_time: dict[tuple, float] = {}  # (request id, sequence index) -> previous token time

    # ---- fed by the stepping thread -----------------------------------------------------------------
    def _advance(self, counter, key: Hashable, total: float) -> None:
        """Add what an engine's cumulative counter gained since the last look."""
        gained = total - self._seen.get(key, 0)
        if gained > 0:
            counter.inc(gained)
        self._seen[key] = total

    def cache_config_info(self, engine) -> None:
        """vLLM's vllm:cache_config_info: a gauge of 1 whose labels are the KV cache's configuration
        (CacheConfig.metrics_info(); the names vLLM uses, values as strings)."""
        config = engine.config.cache
        swap = config.preemption_mode == "swap"
        info = {
            "block_size": str(engine.kv.block_size),
            "cache_dtype": str(config.dtype),
            "enable_prefix_caching": str(bool(config.prefix_caching)),
            "num_gpu_blocks": str(engine.kv.num_blocks),
            "num_cpu_blocks": str(config.num_cpu_blocks) if swap and config.num_cpu_blocks else "None",
            "swap_space": str(config.swap_space_gb if swap else 0),
        }
        gauge = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", [*info, "engine"],
                      registry=self.registry)  # fmt: skip
        gauge.labels(**info, engine="0").set(1)

    def engine_state(self, engine, num_pending: int) -> None:
        if not self._cache_info_set:
            self._cache_info_set = True
            self.cache_config_info(engine)
        kv, scheduler = engine.kv, engine.scheduler
        free, total = kv.pool.num_free_blocks, kv.num_blocks
        self.num_running.set(scheduler.num_running)
        self.num_waiting.set(scheduler.num_waiting + num_pending)
        self.kv_free_blocks.set(free)
        self.kv_num_blocks.set(total)
        self.kv_usage.set((total - free) / total if total else 0.0)
        self.prefix_hit_rate.set(kv.prefix_hit_rate)
        self._advance(self.prefix_queries, "prefix_queries", kv.prefix_queries)
        self._advance(self.prefix_hits, "prefix_hits", kv.prefix_hits)
        self._advance(self.preemptions, "preemptions", scheduler.num_preemptions)
        stats = engine.last_stats
        if stats is not None and stats.step != self._last_step:  # one engine step per stepping-thread turn
            self._last_step = stats.step
            self.iteration_tokens.observe(stats.num_prefill_tokens + stats.num_decode_tokens)
            if stats.grammar_time_s:
                self.grammar_time.inc(stats.grammar_time_s)
        spec = engine.speculator  # the speculator (None without speculative decoding)
        if spec is not None:
            m = spec.metrics
            self._advance(self.spec_drafts, "spec_drafts", m.num_drafts)
            self._advance(self.spec_draft_tokens, "spec_draft_tokens", m.num_draft_tokens)
            self._advance(self.spec_accepted, "spec_accepted", m.num_accepted_tokens)
            for pos, accepted in enumerate(m.accepted_per_position):
                self._advance(self._spec_per_pos.labels(*self._labels, str(pos)), ("spec_pos", pos), accepted)

    def on_output(self, out: RequestOutput, first_token: bool, finish_reason: str | None = None, params=None) -> None:
        """finish_reason: overrides the output's (a request failed by an engine failure is "error");
        params: the request's SamplingParams (its n and max_tokens are observed at finish)."""
        m, rid = out.metrics, out.request_id
        c = out.outputs[0]  # a group's sequence outputs hold just that sequence (testbed.sequence_group)
        seq = (rid, c.index)  # parallel sampling: inter-token intervals within each sequence
        if out.new_token_ids:
            self.generation_tokens.inc(len(out.new_token_ids))
            if m is not None and m.token_times:
                now = m.token_times[-1]
                previous = self._last_token_time.get(seq)
                if previous is not None:  # vLLM: one inter-token interval per output after the first
                    self.itl.observe(max(0.0, now - previous))
                self._last_token_time[seq] = now
        if c.finish_reason is not None:
            self._last_token_time.pop(seq, None)
        if first_token and m is not None and m.first_token_time is not None:
            self.prompt_tokens.inc(len(out.prompt_token_ids))
            self.ttft.observe(max(0.0, m.first_token_time - m.arrival_time))
        if out.finished:
            reason = finish_reason or c.finish_reason or "abort"
            self._finished.labels(*self._labels, reason).inc()
            if reason not in ("abort", "error") and m is not None and m.finish_time is not None:
                num_output = sum(len(c.token_ids) for c in out.outputs)
                self._observe_finished(m, len(out.prompt_token_ids), num_output)
                self.max_generation_tokens.observe(max(len(c.token_ids) for c in out.outputs))
                if params is not None:
                    self.params_n.observe(params.n)
                    if params.max_tokens is not None:
                        self.params_max_tokens.observe(params.max_tokens)

    def _observe_finished(self, m, num_prompt: int, num_output: int) -> None:
        """vLLM's per-request histograms, at finish (vllm/v1/metrics/stats.py FinishedRequestStats)."""
        self.e2e.observe(max(0.0, m.finish_time - m.arrival_time))
        self.request_prompt_tokens.observe(num_prompt)
        self.request_generation_tokens.observe(num_output)
        if m.first_scheduled_time is None or m.first_token_time is None:
            return
        last_token = m.token_times[-1] if m.token_times else m.first_token_time
        self.queue_time.observe(max(0.0, m.first_scheduled_time - m.arrival_time))
        self.prefill_time.observe(max(0.0, m.first_token_time - m.first_scheduled_time))
        self.decode_time.observe(max(0.0, last_token - m.first_token_time))
        self.inference_time.observe(max(0.0, last_token - m.first_scheduled_time))
        if num_output > 1:
            self.tpot.observe(max(0.0, (last_token - m.first_token_time) / (num_output - 1)))

    def rejected(self, reason: str) -> None:
        self._rejected.labels(*self._labels, reason).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def parse_metrics(text: str) -> dict[str, float]:
    """Parse an exposition text with prometheus_client's own parser into {'name{labels}': value} (labels
    sorted by name) and {'name': value summed over labels}."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
            if labels:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values
