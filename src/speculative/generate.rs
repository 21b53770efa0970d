//! The speculative generation loop: draft, verify, accept, roll back — with explicit state, as
//! llama.cpp's `speculative-simple`:
//!
//! ```text
//!   tokens   prompt + generated so far (all final)
//!   n_past   positions in the target's KV cache = tokens.len() - 1
//!   id_last  tokens[n_past], the last token, which the target has not run yet
//!   draft    x1..xK proposed to follow tokens
//!
//!   verify : target.forward([id_last, x1..xK], n_past) -> K+1 rows (argmax ids when greedy)
//!   accept : verify::{verify_greedy, verify_sampled} -> a accepted + 1 recovered/bonus token
//!   commit : target.truncate(n_past + 1 + a); n_past += 1 + a; id_last = recovered/bonus
//! ```
//!
//! The draft's own cache is rolled back inside the draft (see [`DraftModel`](super::DraftModel)),
//! which catches up on the one token it has not seen in its next first step. Stop conditions
//! (stop tokens, `max_tokens`, the callback, the context end) are checked after every emitted
//! token, also in the middle of an accepted run.

use serde::Serialize;
use web_time::Instant;

use super::cycle::GreedyCycle;
use super::draft::{Draft, DraftBudget};
use super::sampled::{gpu_samples, SampledCycle, SampledOutcome};
use super::schedule::{KPolicy, Schedule};
use super::spec::DraftKind;
use super::tree::TokenTree;
use super::verify::{verify_greedy, verify_sampled, Dist, NextKind, Verdict};
use crate::error::{Error, Result};
use crate::model::{Model, MAX_BATCH};
use crate::sampling::{Rng, SamplingParams};
use crate::session::{FinishReason, GenerateOptions, Stats};

/// Counters and timings of one speculative generation.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SpecStats {
    /// Prompt and generated token counts, target forwards (prefill included), timings, tokens/s.
    #[serde(flatten)]
    pub base: Stats,
    /// The draft that proposed (`"none"` for plain decoding).
    pub draft: DraftKind,
    /// Target passes in the decode loop (one per cycle).
    pub verify_forwards: usize,
    /// Draft model forward passes (0 for n-gram lookup).
    pub draft_steps: usize,
    /// Draft tokens proposed and accepted.
    pub drafted: usize,
    pub accepted: usize,
    /// accepted / drafted.
    pub acceptance_rate: f64,
    /// Per draft position (a tree's depth) i: how often it was verified (reached) and
    /// accepted, and the ratio.
    pub reached_by_position: Vec<usize>,
    pub accepted_by_position: Vec<usize>,
    pub acceptance_by_position: Vec<f64>,
    /// τ: tokens produced per verify pass (1 for plain decoding).
    pub tokens_per_target_forward: f64,
    /// Mean K asked for per cycle.
    pub mean_k: f64,
    /// Decode time spent in the draft and in verify passes. A GPU-resident cycle is one
    /// submission: its time is split between the two by the schedule's measured costs.
    pub draft_seconds: f64,
    pub verify_seconds: f64,
    /// Cycles run GPU-resident with a draft model (its K steps, the verify pass and the
    /// acceptance: one submission, one read-back each), greedy or sampled.
    pub gpu_cycles: usize,
    /// Verify passes (sampling) whose draws and acceptance ran on the GPU, reading back a few
    /// words instead of logits rows (plain sampled decoding steps and token trees included).
    pub gpu_sampled: usize,
    /// Cycles that verified a token tree (several continuations in one pass).
    pub tree_cycles: usize,
    /// Cycles with a draft at hand that drafted nothing because the adaptive K judged a plain
    /// step faster, or timed one (see [`Schedule`](super::Schedule)).
    pub plain_cycles: usize,
    /// Command submissions and read-backs during decoding (the round trips).
    pub submits: u64,
    pub readbacks: u64,
    /// Bytes those read-backs returned (a logits row is 4 x vocabulary bytes; a GPU-resident
    /// or GPU-sampled cycle reads back a few words).
    pub readback_bytes: u64,
    /// Submissions per generated token.
    pub submits_per_token: f64,
    /// Compute dispatches encoded on the target's GPU during decoding (verify passes, the
    /// acceptance, and the drafts of a draft or head on that GPU), and per cycle (a cycle: one
    /// target pass, `verify_forwards`).
    pub dispatches: u64,
    pub dispatches_per_cycle: f64,
    /// Host time spent encoding those dispatches and submitting them, in all and per cycle in
    /// microseconds (on a GPU, time it may wait for the host between cycles).
    pub host_encode_seconds: f64,
    pub host_us_per_cycle: f64,
    /// The last cycle that drafted: the tokens its verify pass checked, as a tree (a chain is a
    /// tree too), and the path it accepted (what the demo page draws).
    pub last_cycle: Option<CycleTrace>,
}

/// One verify pass's tokens as a tree: node 0 is the last committed token (the root), every other
/// node a drafted token below its parent.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CycleTrace {
    pub tokens: Vec<u32>,
    /// `parents[i]` for every node (the root's is 0).
    pub parents: Vec<usize>,
    /// The accepted root-to-node path, as node indices (`[0]`: no draft token accepted).
    pub accepted: Vec<usize>,
    /// Each node's text, when a front end with a tokenizer filled it in (else empty).
    pub texts: Vec<String>,
}

impl CycleTrace {
    /// A chain `[root, drafts..]` of which `accepted` drafts were kept.
    fn chain(root: u32, drafts: &[u32], accepted: usize) -> CycleTrace {
        CycleTrace {
            tokens: std::iter::once(root).chain(drafts.iter().copied()).collect(),
            parents: (0..=drafts.len()).map(|i| i.saturating_sub(1)).collect(),
            accepted: (0..=accepted).collect(),
            texts: Vec::new(),
        }
    }
}

/// The result of [`generate`].
#[derive(Clone, Debug)]
pub struct SpecGeneration {
    pub tokens: Vec<u32>,
    /// Per generated token: whether it was a draft token the target accepted (else the target
    /// produced it: recovered or bonus).
    pub from_draft: Vec<bool>,
    pub finish: FinishReason,
    pub stats: SpecStats,
}

/// Generates up to `opts.max_tokens` tokens after `prompt` with `target`, speculating with
/// `draft` and K chosen by `k`; without a draft, plain decoding (one target step per token; the
/// same loop, so plain and speculative runs count and time alike). Greedy speculative output
/// equals greedy plain output token for token; sampled output has the target's sampling
/// distribution. `on_token` is called for every token as it is committed, with whether it was an
/// accepted draft token (return false to stop).
pub async fn generate(
    target: &mut Model,
    draft: Option<&mut dyn Draft>,
    prompt: &[u32],
    opts: &GenerateOptions,
    k: KPolicy,
    on_token: &mut dyn FnMut(u32, bool) -> bool,
) -> Result<SpecGeneration> {
    generate_with(target, draft, prompt, opts, k, &mut Schedule::new(k), on_token).await
}

/// [`generate`] with a schedule that outlives the generation: it starts from the costs and
/// acceptance `schedule` measured before (in earlier requests with the same target and draft)
/// and leaves this run's measurements in it; K is chosen by `k` ([`Schedule::start`]).
pub async fn generate_with(
    target: &mut Model,
    mut draft: Option<&mut dyn Draft>,
    prompt: &[u32],
    opts: &GenerateOptions,
    k: KPolicy,
    schedule: &mut Schedule,
    on_token: &mut dyn FnMut(u32, bool) -> bool,
) -> Result<SpecGeneration> {
    opts.sampling.validate()?;
    if prompt.is_empty() {
        return Err(Error::InvalidArgument("the prompt has no tokens".into()));
    }
    let context = target.context();
    if prompt.len() >= context {
        return Err(Error::ContextOverflow { needed: prompt.len() + 1, context });
    }
    let params = opts.sampling;
    let greedy = params.is_greedy();
    let mut rng = Rng::new(params.seed);
    schedule.start(k);
    let adaptive = matches!(k, KPolicy::Adaptive { .. });
    let kind = draft.as_ref().map_or(DraftKind::None, |d| d.kind());
    let mut stats = SpecStats { draft: kind, ..SpecStats::default() };
    stats.base.prompt_tokens = prompt.len();

    // Prefill all but the last prompt token; the last one is the first cycle's id_last.
    let t0 = Instant::now();
    let mut tokens = prompt.to_vec();
    let mut n_past = 0;
    for chunk in prompt[..prompt.len() - 1].chunks(MAX_BATCH) {
        target.prefill(chunk, n_past)?;
        if let Some(d) = draft.as_deref_mut() {
            // heads take the chunk's hidden states before the next pass overwrites them
            let rows: Vec<usize> = (0..chunk.len()).collect();
            stats.draft_steps += d.target_pass(prompt, n_past, &rows).await?;
        }
        n_past += chunk.len();
        stats.base.target_forwards += 1;
    }
    target.truncate(n_past);
    if let Some(d) = draft.as_deref_mut() {
        stats.draft_steps += d.prefill(prompt).await?;
    }
    // (prefill passes are submitted without read-backs: their time ends when the GPU is done)
    target.sync().await?;
    // The rows of the last verify pass that hold the kept positions' hidden states, and the
    // first of those positions: drafts that read hidden states get them before the next pass.
    let mut kept_rows: Option<(usize, Vec<usize>)> = None;
    stats.base.prefill_seconds = t0.elapsed().as_secs_f64();

    // Greedy cycles with a draft model on the target's GPU run GPU-resident, except the first
    // two and every 16th: those run CPU-driven, timing the verify pass apart for the schedule's
    // cost model. A GPU-resident cycle (greedy, or sampled on the GPU) times both as one
    // submission: what the pass leaves of it is the draft's cost. Where such cycles run, the
    // CPU-driven drafts (a read-back per step) are timed only until two timings exist.
    let gpu_cycle = match draft.as_deref_mut().and_then(|d| d.gpu_draft()) {
        Some(d) if greedy && std::sync::Arc::ptr_eq(d.model().gpu(), target.gpu()) => {
            Some(GreedyCycle::new(target))
        }
        _ => None,
    };
    // Sampling that the GPU draws from (a top-k of at most 16): the verify pass's draws and the
    // acceptance run on the GPU (and a draft model's draws, past the same calibrating cycles).
    let sampled = if gpu_samples(&params) {
        let dm = draft
            .as_deref_mut()
            .and_then(|d| d.gpu_draft())
            .filter(|d| std::sync::Arc::ptr_eq(d.model().gpu(), target.gpu()));
        Some(SampledCycle::new(target, dm.map(|d| d.model()), &params)?)
    } else {
        None
    };
    // drafting cycles so far, the draft timings recorded, and whether the last cycle was a plain
    // step (a draft model's next proposal then catches up on it: no draft token's cost)
    let (mut drafting, mut timed, mut after_plain) = (0usize, 0usize, false);
    let has_model = draft.as_deref_mut().and_then(|d| d.gpu_draft()).is_some();
    let resident = has_model && (gpu_cycle.is_some() || sampled.as_ref().is_some_and(|s| s.has_draft()));
    let trips0 = target.gpu().round_trips();

    let t1 = Instant::now();
    let mut generated = Vec::new();
    let mut from_draft = Vec::new();
    let mut k_sum = 0usize;
    let finish = 'cycles: loop {
        let remaining = opts.max_tokens - generated.len().min(opts.max_tokens);
        if remaining == 0 {
            break FinishReason::Length;
        }
        if n_past >= context {
            break FinishReason::Length;
        }
        let id_last = tokens[n_past];

        if let (Some(d), Some((first, rows))) = (draft.as_deref_mut(), kept_rows.take()) {
            let td = Instant::now();
            stats.draft_steps += d.target_pass(&tokens, first, &rows).await?;
            stats.draft_seconds += td.elapsed().as_secs_f64();
        }

        // Draft: K from the schedule, capped by the context and the tokens still wanted.
        let cap = (context - n_past - 1).min(remaining - 1);
        let k = if draft.is_some() { schedule.pick(cap) } else { 0 };
        if draft.is_some() && k == 0 && cap > 0 && adaptive {
            stats.plain_cycles += 1;
        }
        k_sum += k;
        let calibrate = timed < 2 || drafting.is_multiple_of(16);
        let catching_up = std::mem::replace(&mut after_plain, k == 0) && has_model;
        if k > 0 {
            drafting += 1;
        }
        let gpu_draft = draft.as_deref_mut().and_then(|d| d.gpu_draft());
        let Checked { xs, verdict, drafted, depth, rows, trace } = match (&gpu_cycle, &sampled, gpu_draft) {
            (Some(cycle), _, Some(dm)) if k > 0 && !calibrate => {
                let tc = Instant::now();
                let out = cycle.run(target, dm, &tokens, n_past, k).await?;
                let out = SampledOutcome {
                    drafts: out.drafts,
                    accepted: out.accepted,
                    next: out.next,
                    draft_steps: out.draft_steps,
                };
                // (after plain steps too: the catch-up on them rides in the first draft step's pass
                // as extra rows, about free on a GPU, past MAX_BATCH of them in passes of its own;
                // and a probe is then the only timing there is)
                let seconds = tc.elapsed().as_secs_f64();
                schedule.observe_cycle(out.drafts.len(), seconds);
                gpu_cycle_checked(&mut stats, schedule, out, id_last, seconds)
            }
            (_, Some(sc), Some(dm)) if k > 0 && !calibrate && sc.has_draft() => {
                let tc = Instant::now();
                let out = sc.run(target, dm, &tokens, n_past, k, &mut rng).await?;
                stats.gpu_sampled += 1;
                let seconds = tc.elapsed().as_secs_f64();
                schedule.observe_cycle(out.drafts.len(), seconds);
                gpu_cycle_checked(&mut stats, schedule, out, id_last, seconds)
            }
            _ => {
                let td = Instant::now();
                let proposal = match draft.as_deref_mut() {
                    Some(d) if k > 0 => {
                        let room = context - n_past - 1;
                        let costs = schedule.tree_costs(room);
                        // under an adaptive K, the whole tree (sized below)
                        let nodes = costs.map_or(schedule.tree_nodes(k), |c| c.max_nodes).min(room);
                        let budget = DraftBudget { depth: k, nodes, costs };
                        d.propose(&tokens, budget, &params, &mut rng).await?
                    }
                    _ => Default::default(),
                };
                let draft_time = td.elapsed().as_secs_f64();
                let mut xs = proposal.tokens;
                xs.truncate(k);
                stats.draft_steps += proposal.steps;
                stats.draft_seconds += draft_time;
                // (not after a plain step: a draft model's catch-up on it is no draft token's cost;
                // nor once GPU-resident cycles time the draft)
                if !catching_up && !xs.is_empty() && (timed < 2 || !resident) {
                    schedule.observe_draft(xs.len(), draft_time);
                    timed += 1;
                }

                // A tree (sampling: deterministic drafts only) whose rows fit the context and
                // whose longest path fits the tokens still wanted, cut to what the measured costs
                // make worth verifying (a chain when that is all); else the chain.
                let deterministic = greedy || proposal.q.is_none();
                let fits = |t: TokenTree| match n_past + t.len() <= context {
                    true => t,
                    // its first nodes (each parent before its children) in the rows left
                    false => t.subtree(&(0..t.len()).map(|i| n_past + i < context).collect::<Vec<_>>()),
                };
                let tree = proposal
                    .tree
                    .map(fits)
                    .filter(|t| deterministic && t.tokens().first() == Some(&id_last) && t.max_depth() <= cap)
                    .map(|t| match proposal.sized {
                        true => {
                            let slots = t.rank_paths();
                            (t, slots)
                        }
                        false => schedule.size_tree(&t, draft_time),
                    });
                let (tree, slots) = match tree {
                    Some((t, slots)) if t.is_chain() => {
                        xs = t.tokens()[1..].to_vec();
                        (None, Some(slots))
                    }
                    Some((t, slots)) => (Some(t), Some(slots)),
                    None => (None, None),
                };
                let tv = Instant::now();
                let (checked, rows) = match (tree, &sampled) {
                    (Some(tree), sc) => {
                        stats.tree_cycles += 1;
                        // (sampling the GPU draws from: a draw per node, 4n + 1 words read back)
                        let (checked, on_gpu) =
                            check_tree(target, &tree, n_past, &params, sc.as_ref(), &mut rng).await?;
                        stats.gpu_sampled += on_gpu as usize;
                        (checked, tree.len())
                    }
                    // deterministic drafts (or none) under sampling the GPU draws from
                    (None, Some(sc)) if proposal.q.is_none() => {
                        let rows = xs.len() + 1;
                        let out = sc.check(target, id_last, &xs, n_past, &mut rng).await?;
                        stats.gpu_sampled += 1;
                        (checked_chain(id_last, out), rows)
                    }
                    (None, _) => {
                        let rows = xs.len() + 1;
                        (check_chain(target, id_last, xs, proposal.q, n_past, &params, &mut rng).await?, rows)
                    }
                };
                let verify_time = tv.elapsed().as_secs_f64();
                stats.verify_seconds += verify_time;
                schedule.observe_verify(rows, verify_time);
                if let Some(slots) = slots {
                    // (a chain's nodes are its positions)
                    schedule.observe_tree(&slots, &checked.trace.accepted);
                }
                checked
            }
        };
        stats.verify_forwards += 1;
        stats.base.target_forwards += 1;
        kept_rows = Some((n_past, rows));
        if drafted > 0 {
            stats.last_cycle = Some(trace);
        }
        schedule.observe_acceptance(depth, verdict.accepted);
        stats.drafted += drafted;
        stats.accepted += verdict.accepted;
        let reached = (verdict.accepted + 1).min(depth);
        if stats.reached_by_position.len() < depth {
            stats.reached_by_position.resize(depth, 0);
            stats.accepted_by_position.resize(depth, 0);
        }
        for i in 0..reached {
            stats.reached_by_position[i] += 1;
            if i < verdict.accepted {
                stats.accepted_by_position[i] += 1;
            }
        }

        // Commit: the target keeps id_last and the accepted drafts; the new token is next id_last.
        n_past += 1 + verdict.accepted;
        target.truncate(n_past);
        let new = xs[..verdict.accepted].iter().map(|&x| (x, true)).chain([(verdict.next, false)]);
        debug_assert!(verdict.accepted <= xs.len());
        for (tok, drafted) in new {
            tokens.push(tok);
            generated.push(tok);
            from_draft.push(drafted);
            if !on_token(tok, drafted) {
                break 'cycles FinishReason::Cancelled;
            }
            if opts.stop_tokens.contains(&tok) {
                break 'cycles FinishReason::Stop;
            }
            if generated.len() >= opts.max_tokens {
                break 'cycles FinishReason::Length;
            }
        }
    };

    let s = &mut stats;
    let trips = target.gpu().round_trips() - trips0;
    s.submits = trips.submits;
    s.readbacks = trips.readbacks;
    s.readback_bytes = trips.readback_bytes;
    s.submits_per_token =
        if generated.is_empty() { 0.0 } else { trips.submits as f64 / generated.len() as f64 };
    s.dispatches = trips.dispatches;
    s.host_encode_seconds = trips.host_nanos as f64 * 1e-9;
    let cycles = s.verify_forwards.max(1) as f64;
    s.dispatches_per_cycle = trips.dispatches as f64 / cycles;
    s.host_us_per_cycle = s.host_encode_seconds * 1e6 / cycles;
    s.base.generated_tokens = generated.len();
    s.base.decode_seconds = t1.elapsed().as_secs_f64();
    s.base.tokens_per_second =
        if s.base.decode_seconds > 0.0 { generated.len() as f64 / s.base.decode_seconds } else { 0.0 };
    s.acceptance_rate = if s.drafted > 0 { s.accepted as f64 / s.drafted as f64 } else { 0.0 };
    s.acceptance_by_position = s
        .reached_by_position
        .iter()
        .zip(&s.accepted_by_position)
        .map(|(&r, &a)| if r > 0 { a as f64 / r as f64 } else { 0.0 })
        .collect();
    s.tokens_per_target_forward =
        if s.verify_forwards > 0 { generated.len() as f64 / s.verify_forwards as f64 } else { 0.0 };
    s.mean_k = if s.verify_forwards > 0 { k_sum as f64 / s.verify_forwards as f64 } else { 0.0 };
    Ok(SpecGeneration { tokens: generated, from_draft, finish, stats })
}

/// The target's sampling distribution of every row of `logits` (`[rows, vocab]`, a pass at
/// `n_past`); a non-finite logit is an error naming it.
fn distributions(logits: &[f32], vocab: usize, params: &SamplingParams, n_past: usize) -> Result<Vec<Dist>> {
    if let Some(i) = logits.iter().position(|v| !v.is_finite()) {
        return Err(Error::NonFinite(format!(
            "logit {} of row {} at position {n_past} is {}",
            i % vocab,
            i / vocab,
            logits[i]
        )));
    }
    Ok(logits.chunks_exact(vocab).map(|row| Dist::from_logits(row, params)).collect())
}

/// A GPU-resident cycle's outcome as a verify pass's decision; its time (one submission) split
/// between the draft and the verify pass by the schedule's measured costs.
fn gpu_cycle_checked(
    stats: &mut SpecStats,
    schedule: &Schedule,
    out: SampledOutcome,
    id_last: u32,
    seconds: f64,
) -> Checked {
    let k = out.drafts.len();
    let (d, v) = (k as f64 * schedule.draft_seconds(), schedule.verify_seconds(k + 1));
    let draft_share = if d + v > 0.0 { d / (d + v) } else { 0.0 };
    stats.draft_steps += out.draft_steps;
    stats.draft_seconds += seconds * draft_share;
    stats.verify_seconds += seconds * (1.0 - draft_share);
    stats.gpu_cycles += 1;
    checked_chain(id_last, out)
}

/// A chain's decision from a GPU verdict.
fn checked_chain(id_last: u32, out: SampledOutcome) -> Checked {
    let k = out.drafts.len();
    let kind = if out.accepted == k { NextKind::Bonus } else { NextKind::Recovered };
    let verdict = Verdict { accepted: out.accepted, next: out.next, kind };
    let rows = (0..=out.accepted).collect();
    let trace = CycleTrace::chain(id_last, &out.drafts, out.accepted);
    Checked { xs: out.drafts, verdict, drafted: k, depth: k, rows, trace }
}

/// What one verify pass decided.
struct Checked {
    /// The drafted tokens whose first `verdict.accepted` are kept (a tree's accepted path).
    xs: Vec<u32>,
    verdict: Verdict,
    /// Draft tokens the pass verified.
    drafted: usize,
    /// The longest run of drafts it could have accepted.
    depth: usize,
    /// The rows of the pass that hold the kept positions (id_last and the accepted drafts): the
    /// last one's logits gave `verdict.next`.
    rows: Vec<usize>,
    /// The pass's tokens as a tree and its accepted path.
    trace: CycleTrace,
}

/// One target pass over `[id_last, xs..]` at `n_past` and the chain's rule: greedy, or
/// speculative sampling against the draft's `q` (one-hot when the draft gave none).
async fn check_chain(
    target: &mut Model,
    id_last: u32,
    xs: Vec<u32>,
    q: Option<Vec<Dist>>,
    n_past: usize,
    params: &SamplingParams,
    rng: &mut Rng,
) -> Result<Checked> {
    let mut batch = Vec::with_capacity(xs.len() + 1);
    batch.push(id_last);
    batch.extend_from_slice(&xs);
    let verdict = if params.is_greedy() {
        let ids = target.forward_argmax(&batch, n_past).await?;
        verify_greedy(&xs, &ids)?
    } else {
        let logits = target.forward(&batch, n_past).await?;
        let p = distributions(&logits, target.config.vocab_size, params, n_past)?;
        let q: Vec<Dist> = match q {
            Some(q) if q.len() >= xs.len() => q.into_iter().take(xs.len()).collect(),
            _ => xs.iter().map(|&x| Dist::one_hot(x)).collect(),
        };
        verify_sampled(&xs, &q, &p, rng)?
    };
    let k = xs.len();
    let rows = (0..=verdict.accepted).collect();
    let trace = CycleTrace::chain(id_last, &xs, verdict.accepted);
    Ok(Checked { xs, verdict, drafted: k, depth: k, rows, trace })
}

/// One tree pass over `tree` at `n_past`, the greedy or multi-candidate rule down the tree (its
/// draws on the GPU with `sampled`), and the accepted path kept in the target's cache; and
/// whether the GPU drew (sampling read back a few words, not the nodes' logits rows).
async fn check_tree(
    target: &mut Model,
    tree: &TokenTree,
    n_past: usize,
    params: &SamplingParams,
    sampled: Option<&SampledCycle>,
    rng: &mut Rng,
) -> Result<(Checked, bool)> {
    let ancestors = tree.ancestors();
    let (v, on_gpu) = if params.is_greedy() {
        let ids = target.forward_tree_argmax(tree.tokens(), &ancestors, n_past).await?;
        (tree.verify_greedy(&ids)?, false)
    } else if let Some(sc) = sampled {
        (sc.check_tree(target, tree, n_past, rng).await?, true)
    } else {
        let logits = target.forward_tree(tree.tokens(), &ancestors, n_past).await?;
        let p = distributions(&logits, target.config.vocab_size, params, n_past)?;
        (tree.verify_sampled(&p, rng)?, false)
    };
    target.keep_path(n_past, &v.path)?;
    let xs: Vec<u32> = v.path[1..].iter().map(|&i| tree.tokens()[i]).collect();
    let leaf = v.path.last().is_some_and(|&l| tree.children(l).next().is_none());
    let kind = if leaf { NextKind::Bonus } else { NextKind::Recovered };
    let verdict = Verdict { accepted: xs.len(), next: v.next, kind };
    let trace = CycleTrace {
        tokens: tree.tokens().to_vec(),
        parents: tree.parents().to_vec(),
        accepted: v.path.clone(),
        texts: Vec::new(),
    };
    let checked =
        Checked { xs, verdict, drafted: tree.len() - 1, depth: tree.max_depth(), rows: v.path, trace };
    Ok((checked, on_gpu))
}
