//! The speculative-decoding benchmark harness: target-only decoding and speculation over a
//! prompt set, alternating them, plus `verify_cost = t(forward of K+1 tokens) / t(forward of 1
//! token)`. Both runs go through the engine every front end uses ([`Engine::generate_tokens`]),
//! so a bench measures the drafts, ensembles and schedules that requests get.

use serde::{Deserialize, Serialize};
use web_time::Instant;
use wgspec::engine::{DraftKind, Engine, Request};
use wgspec::model::{Model, MAX_BATCH};
use wgspec::speculative::SpecStats;
use wgspec::{Error, Result};

/// The prompt set kept in the repository (`benches/prompts.json`): code and prose.
pub const DEFAULT_PROMPTS: &str = include_str!("../../../benches/prompts.json");

/// One benchmark prompt.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct BenchPrompt {
    pub name: String,
    /// `"code"` or `"prose"`.
    pub kind: String,
    pub prompt: String,
}

/// Parses a prompt set (a JSON array of [`BenchPrompt`]).
pub fn parse_prompts(json: &str) -> Result<Vec<BenchPrompt>> {
    serde_json::from_str(json).map_err(|e| Error::InvalidArgument(format!("prompt set: {e}")))
}

/// The outcome of one prompt: target-only and speculative runs of the same request.
#[derive(Clone, Debug, Serialize)]
pub struct PromptResult {
    pub name: String,
    pub kind: String,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub target_only_tokens_per_second: f64,
    pub speculative_tokens_per_second: f64,
    pub speedup: f64,
    pub tokens_per_target_forward: f64,
    pub acceptance_rate: f64,
    pub mean_k: f64,
    /// The target-only run's steps, its dispatches and its host time encoding and submitting
    /// them (the speculative run's are in `stats`).
    pub target_only_steps: usize,
    pub target_only_dispatches: u64,
    pub target_only_host_encode_seconds: f64,
    /// Whether the speculative tokens equal the target-only tokens (always expected when greedy).
    pub identical: bool,
    /// Which run went first (they alternate from prompt to prompt).
    pub speculative_first: bool,
    pub stats: SpecStats,
}

/// Runs `bench` (tokenized: `prompt`) with the target alone and with speculation (in the order
/// `spec_first` says), both through the engine with `req` (its draft, else the engine's
/// default, for the speculative run); the speculative runs of a bench share the engine's K
/// schedule, as a server's requests do.
pub async fn run_prompt(
    engine: &mut Engine,
    bench: &BenchPrompt,
    prompt: &[u32],
    req: &Request,
    spec_first: bool,
) -> Result<PromptResult> {
    let plain_req = Request { draft: Some(DraftKind::None), ..req.clone() };
    let mut plain = None;
    let mut spec = None;
    for spec_turn in [spec_first, !spec_first] {
        if spec_turn {
            spec = Some(engine.generate_tokens(prompt, req).await?);
        } else {
            plain = Some(engine.generate_tokens(prompt, &plain_req).await?);
        }
    }
    let (Some(plain), Some(spec)) = (plain, spec) else {
        return Err(Error::InvalidArgument("benchmark run missing".into()));
    };
    let s = spec.stats;
    let speedup = if plain.stats.base.tokens_per_second > 0.0 {
        s.base.tokens_per_second / plain.stats.base.tokens_per_second
    } else {
        0.0
    };
    Ok(PromptResult {
        name: bench.name.clone(),
        kind: bench.kind.clone(),
        prompt_tokens: prompt.len(),
        generated_tokens: s.base.generated_tokens,
        target_only_tokens_per_second: plain.stats.base.tokens_per_second,
        speculative_tokens_per_second: s.base.tokens_per_second,
        speedup,
        tokens_per_target_forward: s.tokens_per_target_forward,
        acceptance_rate: s.acceptance_rate,
        mean_k: s.mean_k,
        target_only_steps: plain.stats.verify_forwards,
        target_only_dispatches: plain.stats.dispatches,
        target_only_host_encode_seconds: plain.stats.host_encode_seconds,
        identical: spec.tokens == plain.tokens,
        speculative_first: spec_first,
        stats: s,
    })
}

/// Totals over a set of prompt results.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub prompts: usize,
    pub generated_tokens: usize,
    /// Generated tokens over the summed decode times of each mode.
    pub target_only_tokens_per_second: f64,
    pub speculative_tokens_per_second: f64,
    pub speedup: f64,
    /// τ: generated tokens per verify pass.
    pub tokens_per_target_forward: f64,
    pub acceptance_rate: f64,
    /// Drafted tokens (tree nodes) per verify pass, and the passes that verified a tree.
    pub nodes_per_verify: f64,
    pub tree_cycles: usize,
    /// Cycles the adaptive K ran as plain steps (drafting judged not to pay), and all cycles.
    pub plain_cycles: usize,
    pub cycles: usize,
    /// Compute dispatches and host microseconds (encoding and submitting them) per cycle of the
    /// speculative runs, and per step of the target-only runs.
    pub dispatches_per_cycle: f64,
    pub host_us_per_cycle: f64,
    pub target_only_dispatches_per_step: f64,
    pub target_only_host_us_per_step: f64,
    pub all_identical: bool,
}

impl Summary {
    pub fn of(rs: &[&PromptResult]) -> Summary {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let tokens: usize = rs.iter().map(|r| r.generated_tokens).sum();
        let plain_s: f64 =
            rs.iter().map(|r| ratio(r.generated_tokens as f64, r.target_only_tokens_per_second)).sum();
        let spec_s: f64 = rs.iter().map(|r| r.stats.base.decode_seconds).sum();
        let drafted: usize = rs.iter().map(|r| r.stats.drafted).sum();
        let accepted: usize = rs.iter().map(|r| r.stats.accepted).sum();
        let verifies: usize = rs.iter().map(|r| r.stats.verify_forwards).sum();
        let steps = rs.iter().map(|r| r.target_only_steps as f64).sum::<f64>();
        let (plain_tps, spec_tps) = (ratio(tokens as f64, plain_s), ratio(tokens as f64, spec_s));
        Summary {
            prompts: rs.len(),
            generated_tokens: tokens,
            target_only_tokens_per_second: plain_tps,
            speculative_tokens_per_second: spec_tps,
            speedup: ratio(spec_tps, plain_tps),
            tokens_per_target_forward: ratio(tokens as f64, verifies as f64),
            acceptance_rate: ratio(accepted as f64, drafted as f64),
            nodes_per_verify: ratio(drafted as f64, verifies as f64),
            tree_cycles: rs.iter().map(|r| r.stats.tree_cycles).sum(),
            plain_cycles: rs.iter().map(|r| r.stats.plain_cycles).sum(),
            cycles: verifies,
            dispatches_per_cycle: ratio(rs.iter().map(|r| r.stats.dispatches as f64).sum(), verifies as f64),
            host_us_per_cycle: ratio(
                1e6 * rs.iter().map(|r| r.stats.host_encode_seconds).sum::<f64>(),
                verifies as f64,
            ),
            target_only_dispatches_per_step: ratio(
                rs.iter().map(|r| r.target_only_dispatches as f64).sum(),
                steps,
            ),
            target_only_host_us_per_step: ratio(
                1e6 * rs.iter().map(|r| r.target_only_host_encode_seconds).sum::<f64>(),
                steps,
            ),
            all_identical: rs.iter().all(|r| r.identical),
        }
    }
}

/// What `wgspec bench` writes.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub adapter: String,
    pub target: String,
    pub target_gpu_weight_bytes: u64,
    pub target_file_weight_bytes: u64,
    pub draft: String,
    /// `"4"` or `"adaptive (max 16)"`.
    pub k: String,
    pub max_tokens: usize,
    /// Over all prompts, with verify_cost at `verify_cost_k` (the fixed K or the runs' mean K).
    pub summary: Summary,
    pub verify_cost: f64,
    pub verify_cost_k: usize,
    /// `"code"` and `"prose"`.
    pub by_kind: std::collections::BTreeMap<String, Summary>,
    pub verify_cost_by_k: std::collections::BTreeMap<usize, f64>,
    pub prompts: Vec<PromptResult>,
}

/// Median time of a forward pass of `rows` tokens at position `pos` (argmax read-back, as a
/// greedy verify pass), over `reps` runs after one warm-up. The cache is rolled back to `pos`.
pub async fn forward_seconds(model: &mut Model, pos: usize, rows: usize, reps: usize) -> Result<f64> {
    if rows == 0 || rows > MAX_BATCH || pos + rows > model.context() || pos > model.len() {
        return Err(Error::InvalidArgument(format!(
            "timing {rows} rows at {pos} with {} cached of {}",
            model.len(),
            model.context()
        )));
    }
    let vocab = model.config.vocab_size as u32;
    let tokens: Vec<u32> = (0..rows as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let mut times = Vec::with_capacity(reps);
    for rep in 0..=reps {
        let t = Instant::now();
        model.forward_argmax(&tokens, pos).await?;
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
        model.truncate(pos);
    }
    times.sort_by(f64::total_cmp);
    Ok(times.get(times.len() / 2).copied().unwrap_or(0.0))
}

/// `verify_cost` for each K in `ks`: t(forward of K+1 tokens) / t(forward of 1 token) at `pos`
/// (the model must hold at least `pos` positions).
pub async fn verify_costs(
    model: &mut Model,
    pos: usize,
    ks: &[usize],
    reps: usize,
) -> Result<Vec<(usize, f64)>> {
    let one = forward_seconds(model, pos, 1, reps).await?;
    let mut out = Vec::with_capacity(ks.len());
    for &k in ks {
        let t = forward_seconds(model, pos, k + 1, reps).await?;
        out.push((k, if one > 0.0 { t / one } else { 0.0 }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_set_parses_and_has_code_and_prose() {
        let p = parse_prompts(DEFAULT_PROMPTS).unwrap_or_else(|e| panic!("{e}"));
        assert!(p.iter().any(|x| x.kind == "code") && p.iter().any(|x| x.kind == "prose"));
    }
}
