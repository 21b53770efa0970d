//! Counters, gauges and histograms of the server, rendered in Prometheus' text format at
//! `GET /metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use wgspec::engine::BatchStatus;

/// The status a request is counted with when its client left before the whole answer was sent
/// (nginx's "client closed request").
pub const CANCELLED: u16 = 499;
/// The route of requests that never reached one: heads that do not parse as HTTP/1.1, which
/// hyper answers itself (400, 414, 431).
pub const UNPARSED: &str = "unparsed";

/// Time to first token (seconds): queueing and prefill included.
const TTFT_BOUNDS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Time between consecutive tokens of a stream (seconds); tokens accepted from one draft arrive
/// together, so speculation shows as many near-zero latencies.
const TOKEN_BOUNDS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
/// Rows of a batched pass (prompt chunks, decoding tokens, drafts): at most 64.
const ROWS_BOUNDS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// Cumulative buckets over fixed upper bounds.
struct Histogram {
    bounds: &'static [f64],
    /// counts[i]: observations <= bounds[i] and > bounds[i - 1]; the last one: above all bounds.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0 }
    }

    fn observe(&mut self, seconds: f64) {
        let i = self.bounds.iter().position(|b| seconds <= *b).unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            cumulative += count;
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.counts[self.bounds.len()];
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

struct Inner {
    /// (route, status) -> requests, each counted once when its answer ended (or
    /// [`CANCELLED`]).
    requests: BTreeMap<(String, u16), u64>,
    /// error type -> answers carrying it (streams that failed after their 200 included).
    errors: BTreeMap<&'static str, u64>,
    /// Generations that ran to their end (stop or length).
    completions: u64,
    /// Generations stopped because their client left.
    cancelled: u64,
    /// Generations the engine failed.
    failed: u64,
    prompt_tokens: u64,
    generated_tokens: u64,
    drafted: u64,
    accepted: u64,
    /// Target forward passes of decoding (generated tokens / τ, summed over requests).
    decode_forwards: f64,
    ttft: Histogram,
    token_latency: Histogram,
    /// The batch after its last pass, and the rows of each pass.
    batch: BatchStatus,
    rows_per_pass: Histogram,
}

/// The server's metrics; one per server, shared by every handler and the GPU worker.
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// One generation that ran (to its end, or until its client left), as counted.
pub struct GenerationCounts {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// τ of the request.
    pub tokens_per_target_forward: f64,
    /// Its client left before the end.
    pub cancelled: bool,
}

impl GenerationCounts {
    /// The counts of a generation that ended (cancelled: its client left), counting
    /// `prompt_tokens` of its prompt (a request's prompt counts once, whatever its `n`: with the
    /// first of its choices counted).
    pub fn of(c: &wgspec::engine::Completion, prompt_tokens: usize) -> GenerationCounts {
        GenerationCounts {
            prompt_tokens,
            generated_tokens: c.tokens.len(),
            drafted: c.stats.drafted,
            accepted: c.stats.accepted,
            tokens_per_target_forward: c.stats.tokens_per_target_forward,
            cancelled: c.finish_reason == wgspec::generation::FinishReason::Cancelled,
        }
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            inner: Mutex::new(Inner {
                requests: BTreeMap::new(),
                errors: BTreeMap::new(),
                completions: 0,
                cancelled: 0,
                failed: 0,
                prompt_tokens: 0,
                generated_tokens: 0,
                drafted: 0,
                accepted: 0,
                decode_forwards: 0.0,
                ttft: Histogram::new(TTFT_BOUNDS),
                token_latency: Histogram::new(TOKEN_BOUNDS),
                batch: BatchStatus::default(),
                rows_per_pass: Histogram::new(ROWS_BOUNDS),
            }),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        // Counters stay usable after a panic elsewhere: a poisoned lock still holds valid numbers.
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut inner)
    }

    pub fn request(&self, route: &str, status: u16) {
        self.with(|m| *m.requests.entry((route.to_string(), status)).or_insert(0) += 1);
    }

    pub fn error(&self, kind: &'static str) {
        self.with(|m| *m.errors.entry(kind).or_insert(0) += 1);
    }

    pub fn first_token(&self, latency: Duration) {
        self.with(|m| m.ttft.observe(latency.as_secs_f64()));
    }

    pub fn next_token(&self, latency: Duration) {
        self.with(|m| m.token_latency.observe(latency.as_secs_f64()));
    }

    /// Counts a generation that ran; its tokens count whether or not its client stayed.
    pub fn generation(&self, c: &GenerationCounts) {
        self.with(|m| {
            if c.cancelled {
                m.cancelled += 1;
            } else {
                m.completions += 1;
            }
            m.prompt_tokens += c.prompt_tokens as u64;
            m.generated_tokens += c.generated_tokens as u64;
            m.drafted += c.drafted as u64;
            m.accepted += c.accepted as u64;
            if c.tokens_per_target_forward > 0.0 {
                m.decode_forwards += c.generated_tokens as f64 / c.tokens_per_target_forward;
            }
        });
    }

    pub fn failed_generation(&self) {
        self.with(|m| m.failed += 1);
    }

    /// The batch now, and the rows of the pass that just ran (if one did).
    pub fn batch(&self, status: BatchStatus, pass_rows: Option<usize>) {
        self.with(|m| {
            m.batch = status;
            if let Some(rows) = pass_rows {
                m.rows_per_pass.observe(rows as f64);
            }
        });
    }

    /// The Prometheus text exposition of everything; `queue_depth`: the jobs waiting for the
    /// GPU worker now.
    pub fn render(&self, queue_depth: usize) -> String {
        self.with(|m| {
            let mut out = String::new();
            let _ = writeln!(
                out,
                "# HELP wgspec_requests_total HTTP requests, each counted once when its answer ended, \
                 by route and status (499: the client left first; route \"{UNPARSED}\": a request \
                 head that did not parse).\n\
                 # TYPE wgspec_requests_total counter"
            );
            for ((route, status), n) in &m.requests {
                let _ = writeln!(out, "wgspec_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}");
            }
            let _ = writeln!(
                out,
                "# HELP wgspec_errors_total Error answers by type (OpenAI's error `type`).\n\
                 # TYPE wgspec_errors_total counter"
            );
            for (kind, n) in &m.errors {
                let _ = writeln!(out, "wgspec_errors_total{{kind=\"{kind}\"}} {n}");
            }
            let counters = [
                ("wgspec_completions_total", "Generations that ran to their end.", m.completions),
                (
                    "wgspec_cancelled_generations_total",
                    "Generations stopped because their client left.",
                    m.cancelled,
                ),
                ("wgspec_failed_generations_total", "Generations the engine failed.", m.failed),
                (
                    "wgspec_prompt_tokens_total",
                    "Prompt tokens of generations that ran (cancelled ones included).",
                    m.prompt_tokens,
                ),
                (
                    "wgspec_generated_tokens_total",
                    "Tokens generated (by cancelled generations too).",
                    m.generated_tokens,
                ),
                ("wgspec_drafted_tokens_total", "Draft tokens proposed.", m.drafted),
                ("wgspec_accepted_tokens_total", "Draft tokens the target accepted.", m.accepted),
            ];
            let b = &m.batch;
            let batch_counters = [
                ("wgspec_batch_passes_total", "Forward passes of the batch.", b.passes),
                (
                    "wgspec_batch_rows_total",
                    "Rows of those passes (prompt chunks, decoding tokens, drafts).",
                    b.rows,
                ),
                ("wgspec_batch_draft_rows_total", "Draft rows of those passes.", b.drafts),
                (
                    "wgspec_batch_drafts_cut_total",
                    "Drafts dropped before their pass once ranked, below a step too unsure to pay for them.",
                    b.drafts_cut,
                ),
                (
                    "wgspec_batch_draft_trees_total",
                    "Batched requests' newest tokens whose drafts after them in their pass were a token tree.",
                    b.trees,
                ),
                (
                    "wgspec_batch_eagle_follows_total",
                    "The EAGLE head's passes over the kept rows of the requests it follows.",
                    b.head_follows,
                ),
                (
                    "wgspec_batch_eagle_step_rows_total",
                    "Rows of the EAGLE head's draft steps (a chain's drafts after its first).",
                    b.head_step_rows,
                ),
                (
                    "wgspec_batch_eagle_follow_rows_total",
                    "Rows of the EAGLE head's follows (the kept rows it ran, followed prompts' included).",
                    b.head_follow_rows,
                ),
                (
                    "wgspec_batch_eagle_step_passes_total",
                    "Submissions of the EAGLE head's draft steps.",
                    b.head_step_passes,
                ),
                (
                    "wgspec_preemptions_total",
                    "Batched requests preempted for KV cache pages (recomputed when admitted again).",
                    b.preemptions,
                ),
                (
                    "wgspec_prefix_cache_hit_tokens_total",
                    "Positions batched requests found in the prefix cache when admitted (not computed).",
                    b.cached_tokens,
                ),
            ];
            for (name, help, value) in counters.into_iter().chain(batch_counters) {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
            }
            let _ = writeln!(
                out,
                "# HELP wgspec_batch_draft_k_total Batched requests' newest tokens by the drafts after them in their pass (K; \"8\": 8 or more).\n\
                 # TYPE wgspec_batch_draft_k_total counter"
            );
            for (k, n) in b.k.iter().enumerate() {
                let _ = writeln!(out, "wgspec_batch_draft_k_total{{k=\"{k}\"}} {n}");
            }
            let acceptance = if m.drafted > 0 { m.accepted as f64 / m.drafted as f64 } else { 0.0 };
            let tau =
                if m.decode_forwards > 0.0 { m.generated_tokens as f64 / m.decode_forwards } else { 0.0 };
            let gauges = [
                ("wgspec_acceptance_rate", "Accepted / drafted tokens since the start.", acceptance),
                (
                    "wgspec_tokens_per_target_forward",
                    "Tau: generated tokens per target forward since the start.",
                    tau,
                ),
                ("wgspec_queue_depth", "Requests waiting for the GPU worker.", queue_depth as f64),
                ("wgspec_running_sequences", "Requests in the batch's passes.", b.running as f64),
                (
                    "wgspec_waiting_sequences",
                    "Requests in the batch waiting for admission.",
                    b.waiting as f64,
                ),
                ("wgspec_kv_pages_used", "KV cache pages held by batched requests.", b.pages_used as f64),
                (
                    "wgspec_kv_pages_free",
                    "KV cache pages a request can take (free, or cached and held by none).",
                    b.pages_free as f64,
                ),
                (
                    "wgspec_kv_pages_cached",
                    "KV cache pages the prefix cache keeps (held or not).",
                    b.pages_cached as f64,
                ),
            ];
            for (name, help, value) in gauges {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
            }
            m.ttft.render(
                &mut out,
                "wgspec_time_to_first_token_seconds",
                "From the request's arrival to its first token.",
            );
            m.token_latency.render(
                &mut out,
                "wgspec_token_latency_seconds",
                "Between consecutive tokens of a request.",
            );
            m.rows_per_pass.render(&mut out, "wgspec_batch_pass_rows", "Rows of each pass of the batch.");
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_cumulative_buckets() {
        let m = Metrics::new();
        m.request("/v1/completions", 200);
        m.request("/v1/completions", 200);
        m.request("/v1/completions", 429);
        m.error("rate_limit_exceeded");
        m.first_token(Duration::from_millis(20));
        m.first_token(Duration::from_secs(100));
        m.generation(&GenerationCounts {
            prompt_tokens: 3,
            generated_tokens: 10,
            drafted: 8,
            accepted: 6,
            tokens_per_target_forward: 2.5,
            cancelled: false,
        });
        m.generation(&GenerationCounts {
            prompt_tokens: 2,
            generated_tokens: 5,
            drafted: 0,
            accepted: 0,
            tokens_per_target_forward: 1.0,
            cancelled: true,
        });
        let status = BatchStatus {
            running: 2,
            waiting: 1,
            drafts: 4,
            drafts_cut: 3,
            trees: 2,
            head_follows: 9,
            head_step_rows: 11,
            head_follow_rows: 13,
            head_step_passes: 4,
            measured_costs: None,
            pages_used: 5,
            pages_free: 59,
            pages_cached: 6,
            cached_tokens: 128,
            passes: 7,
            rows: 30,
            preemptions: 1,
            k: [5, 0, 2, 0, 0, 0, 0, 0, 1],
        };
        m.batch(status, Some(3));
        m.batch(status, Some(12));
        let text = m.render(3);
        for line in [
            "wgspec_running_sequences 2",
            "wgspec_waiting_sequences 1",
            "wgspec_kv_pages_used 5",
            "wgspec_kv_pages_free 59",
            "wgspec_kv_pages_cached 6",
            "wgspec_prefix_cache_hit_tokens_total 128",
            "wgspec_batch_passes_total 7",
            "wgspec_batch_rows_total 30",
            "wgspec_batch_draft_rows_total 4",
            "wgspec_batch_drafts_cut_total 3",
            "wgspec_batch_draft_trees_total 2",
            "wgspec_batch_eagle_follows_total 9",
            "wgspec_batch_eagle_step_rows_total 11",
            "wgspec_batch_eagle_follow_rows_total 13",
            "wgspec_batch_eagle_step_passes_total 4",
            "wgspec_batch_draft_k_total{k=\"0\"} 5",
            "wgspec_batch_draft_k_total{k=\"2\"} 2",
            "wgspec_batch_draft_k_total{k=\"8\"} 1",
            "wgspec_preemptions_total 1",
            "wgspec_batch_pass_rows_bucket{le=\"2\"} 0",
            "wgspec_batch_pass_rows_bucket{le=\"4\"} 1",
            "wgspec_batch_pass_rows_bucket{le=\"16\"} 2",
            "wgspec_batch_pass_rows_count 2",
            "wgspec_requests_total{route=\"/v1/completions\",status=\"200\"} 2",
            "wgspec_requests_total{route=\"/v1/completions\",status=\"429\"} 1",
            "wgspec_errors_total{kind=\"rate_limit_exceeded\"} 1",
            "wgspec_acceptance_rate 0.75",
            "wgspec_completions_total 1",
            "wgspec_cancelled_generations_total 1",
            "wgspec_generated_tokens_total 15",
            "wgspec_queue_depth 3",
            "wgspec_tokens_per_target_forward 1.6666666666666667",
            "wgspec_time_to_first_token_seconds_bucket{le=\"0.01\"} 0",
            "wgspec_time_to_first_token_seconds_bucket{le=\"0.025\"} 1",
            "wgspec_time_to_first_token_seconds_bucket{le=\"60\"} 1",
            "wgspec_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2",
            "wgspec_time_to_first_token_seconds_count 2",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }
}
