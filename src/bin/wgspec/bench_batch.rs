//! `wgspec bench --concurrency N,..`: the engine's batch under load, without HTTP. For each level
//! N the same R requests (prompt i mod the set) run through [`Engine::batch_step`] with at most N
//! in the batch at once, a request taking the place of one that ended (N clients sending one
//! after another). Per level: output tokens/s, time to first token and time per output token
//! (p50, p99, in passes' wall time), the passes and their rows, the drafts among them (those
//! accepted, the token trees, and those cut once ranked), preemptions, the positions found in
//! the prefix cache, and the requests whose tokens differ from the first level's (a request's
//! output must not depend on who else is served), the costs its plans took at its end (as
//! `--batch-costs` takes them: a run on another adapter, a GPU, replayed here), and with costs
//! fixed (`--batch-costs`) its tokens per second at those costs. Each level starts with an empty prefix cache (an earlier level's prompts would be
//! found computed): it finds only what its own requests computed.

use std::collections::HashMap;
use std::time::Instant;

use serde::Serialize;
use wgspec::engine::{BatchEvent, BatchLimits, Engine, FixedCosts, Request, SeqId};
use wgspec::model::MAX_BATCH;
use wgspec::{Error, Result};

/// One level's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Level {
    pub concurrency: usize,
    pub requests: usize,
    pub output_tokens: usize,
    pub seconds: f64,
    pub output_tokens_per_second: f64,
    /// From a request's submission to its first token, and per token after it (ms).
    pub ttft_ms: (f64, f64),
    pub tpot_ms: (f64, f64),
    pub passes: u64,
    pub rows_per_pass: f64,
    pub draft_rows: u64,
    /// Output tokens that were drafts the target accepted.
    pub accepted_drafts: usize,
    /// Requests' newest tokens whose drafts in their pass were a token tree.
    pub trees: u64,
    /// Drafts dropped once ranked, below a step too unsure to pay for them
    /// ([`wgspec::engine::BatchStatus::drafts_cut`]).
    pub drafts_cut: u64,
    /// The EAGLE head's follows, its steps' rows, the follows' rows and the steps' submissions
    /// ([`wgspec::engine::BatchStatus::head_follows`]).
    pub head_follows: u64,
    pub head_step_rows: u64,
    pub head_follow_rows: u64,
    pub head_step_passes: u64,
    pub preemptions: u64,
    /// Positions its requests found in the prefix cache when admitted: computed by its earlier
    /// requests, or (a preempted request coming back) by themselves.
    pub cached_tokens: u64,
    /// Requests whose tokens differ from the first level's.
    pub differ: Vec<usize>,
    /// The costs its plans took at its end, measured or fixed
    /// ([`wgspec::engine::BatchStatus::measured_costs`]).
    pub measured_costs: Option<FixedCosts>,
    /// With costs fixed: its output tokens over the seconds its passes, their rows, the EAGLE
    /// head's follows and its steps take at those costs.
    pub modelled_tokens_per_second: Option<f64>,
}

/// The q-th percentile (0-100) of `v`, by linear interpolation (0 for none).
fn percentile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let at = (v.len() - 1) as f64 * q / 100.0;
    let (lo, hi) = (at.floor() as usize, (at.ceil() as usize).min(v.len() - 1));
    v[lo] + (v[hi] - v[lo]) * (at - lo as f64)
}

/// Runs every level over `requests` (their prompts tokenized), printing a line per level.
pub async fn run(
    engine: &mut Engine,
    requests: &[(Vec<u32>, Request)],
    levels: &[usize],
    costs: Option<FixedCosts>,
) -> Result<Vec<Level>> {
    for (_, r) in requests {
        engine.check_batchable(r)?;
    }
    if let Some(n) = levels.iter().find(|n| !(1..=MAX_BATCH).contains(n)) {
        return Err(Error::InvalidArgument(format!("--concurrency takes 1..={MAX_BATCH}, got {n}")));
    }
    let mut first: Option<Vec<Vec<u32>>> = None;
    let mut out = Vec::new();
    for &n in levels {
        let limits = engine.batch_limits();
        engine.set_batch_limits(BatchLimits { max_seqs: n, ..limits });
        engine.forget_prefix_cache()?;
        let (level, tokens) = level(engine, requests, n, costs).await?;
        engine.set_batch_limits(limits);
        let level = match &first {
            None => level,
            Some(want) => {
                let differ = (0..tokens.len()).filter(|&i| tokens[i] != want[i]).collect();
                Level { differ, ..level }
            }
        };
        first.get_or_insert(tokens);
        eprintln!(
            "N={:<3} {:8.2} tok/s  TTFT p50 {:.0} ms p99 {:.0} ms  TPOT p50 {:.1} ms  {:.1} rows/pass  \
             {} drafts ({} accepted, {} trees, {} cut)  {} preempted  {} cached  {} of {} differ",
            n,
            level.output_tokens_per_second,
            level.ttft_ms.0,
            level.ttft_ms.1,
            level.tpot_ms.0,
            level.rows_per_pass,
            level.draft_rows,
            level.accepted_drafts,
            level.trees,
            level.drafts_cut,
            level.preemptions,
            level.cached_tokens,
            level.differ.len(),
            requests.len()
        );
        if let Some(t) = level.modelled_tokens_per_second {
            eprintln!(
                "      {t:8.2} tok/s at the fixed costs  ({} passes, {} head follows, {} head step rows)",
                level.passes, level.head_follows, level.head_step_rows
            );
        }
        if let Some(c) = level.measured_costs {
            eprintln!(
                "      costs: --batch-costs {:.4e},{:.4e},{:.4e},{:.4e},{:.4e},{:.4e}",
                c.pass, c.row, c.follow, c.follow_row, c.head_pass, c.head_step
            );
        }
        out.push(level);
    }
    Ok(out)
}

/// One level: the requests through the batch, at most `n` at once. Returns its figures and each
/// request's tokens.
async fn level(
    engine: &mut Engine,
    requests: &[(Vec<u32>, Request)],
    n: usize,
    costs: Option<FixedCosts>,
) -> Result<(Level, Vec<Vec<u32>>)> {
    let before = engine.batch_status();
    let mut tokens = vec![Vec::new(); requests.len()];
    let (mut ttft, mut tpot) = (Vec::new(), Vec::new());
    let mut accepted_drafts = 0;
    // request index of each id, its submission time and its first token's
    let mut live: HashMap<SeqId, (usize, Instant, Option<Instant>)> = HashMap::new();
    let mut next = 0;
    let t0 = Instant::now();
    loop {
        while live.len() < n && next < requests.len() {
            let (prompt, req) = &requests[next];
            live.insert(engine.batch_submit(prompt.clone(), req)?, (next, Instant::now(), None));
            next += 1;
        }
        if live.is_empty() {
            break;
        }
        for (id, ev) in engine.batch_step().await? {
            let Some(entry) = live.get_mut(&id) else { continue };
            match ev {
                BatchEvent::Token(t) => {
                    if let Some(tok) = t.id {
                        tokens[entry.0].push(tok);
                        entry.2.get_or_insert_with(Instant::now);
                    }
                }
                BatchEvent::Done(c) => {
                    let (i, sent, first) = entry.to_owned();
                    accepted_drafts += c.from_draft.iter().filter(|&&d| d).count();
                    live.remove(&id);
                    if let Some(first) = first {
                        ttft.push((first - sent).as_secs_f64() * 1e3);
                        if c.tokens.len() > 1 {
                            tpot.push(first.elapsed().as_secs_f64() * 1e3 / (c.tokens.len() - 1) as f64);
                        }
                    }
                    tokens[i] = c.tokens;
                }
                BatchEvent::Failed(e) => return Err(e),
            }
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let after = engine.batch_status();
    let output_tokens = tokens.iter().map(Vec::len).sum();
    let passes = after.passes - before.passes;
    let (level_follows, level_steps) =
        (after.head_follows - before.head_follows, after.head_step_rows - before.head_step_rows);
    let follow_rows = after.head_follow_rows - before.head_follow_rows;
    let step_passes = after.head_step_passes - before.head_step_passes;
    let level = Level {
        concurrency: n,
        requests: requests.len(),
        output_tokens,
        seconds,
        output_tokens_per_second: output_tokens as f64 / seconds,
        ttft_ms: (percentile(&ttft, 50.0), percentile(&ttft, 99.0)),
        tpot_ms: (percentile(&tpot, 50.0), percentile(&tpot, 99.0)),
        passes,
        rows_per_pass: (after.rows - before.rows) as f64 / passes.max(1) as f64,
        draft_rows: after.drafts - before.drafts,
        accepted_drafts,
        trees: after.trees - before.trees,
        drafts_cut: after.drafts_cut - before.drafts_cut,
        head_follows: level_follows,
        head_step_rows: level_steps,
        head_follow_rows: follow_rows,
        head_step_passes: step_passes,
        preemptions: after.preemptions - before.preemptions,
        cached_tokens: after.cached_tokens - before.cached_tokens,
        differ: Vec::new(),
        measured_costs: after.measured_costs,
        modelled_tokens_per_second: costs.map(|c| {
            let rows = after.rows - before.rows;
            let seconds = passes as f64 * (c.pass - c.row)
                + rows as f64 * c.row
                + level_follows as f64 * c.follow
                + follow_rows as f64 * c.follow_row
                + step_passes as f64 * c.head_pass
                + level_steps as f64 * c.head_step;
            output_tokens as f64 / seconds.max(1e-12)
        }),
    };
    Ok((level, tokens))
}
