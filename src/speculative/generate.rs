//! The speculative generation loop: draft, verify, accept, roll back — with explicit state, as
//! llama.cpp's `speculative-simple`:
//!
//! ```text
//!   tokens   prompt + generated so far (all final)
//!   n_past   positions in the target's KV cache = tokens.len() - 1
//!   id_last  tokens[n_past], the last token, which the target has not run yet
//!   draft    x1..xK proposed to follow tokens (a chain), or a token tree below id_last
//!
//!   verify : target.forward([id_last, x1..xK], n_past) -> K+1 rows (argmax ids when greedy)
//!   accept : greedy: verify::verify_greedy; sampled: drafts kept while the GPU's draws are
//!            them (super::sampled) -> a accepted + 1 recovered/bonus token
//!   commit : target.truncate(n_past + 1 + a); n_past += 1 + a; id_last = recovered/bonus
//! ```
//!
//! How the verify pass runs is chosen once per generation (`Verifier`: greedy, or sampled on the
//! GPU); a draft model on the target's GPU runs whole cycles GPU-resident
//! there, but for calibrating cycles timed apart. The draft's own cache is rolled back inside the
//! draft (see [`DraftModel`]), which catches up on the one token it has not seen in its next
//! first step. Stop conditions (stop tokens, `max_tokens`, the callback, the
//! context end) are checked after every emitted token, also in the middle of an accepted run.

use serde::Serialize;
use web_time::Instant;

use super::cycle::CycleAt;
use super::draft::{Ask, DraftBudget, DraftModel, Drafter, Kept, Proposal};
use super::schedule::{KPolicy, Schedule};
use super::spec::DraftKind;
use super::tree::TokenTree;
use super::verifier::{Checked, Verifier};
use crate::error::{Error, Result};
use crate::generation::{FinishReason, GenerateOptions, Stats};
use crate::gpu::RoundTrips;
use crate::model::{Model, MAX_BATCH};

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
    /// step faster, or timed one (see [`Schedule`]).
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
    pub(crate) fn chain(root: u32, drafts: &[u32], accepted: usize) -> CycleTrace {
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
    draft: Drafter<'_>,
    prompt: &[u32],
    opts: &GenerateOptions,
    k: KPolicy,
    on_token: &mut dyn FnMut(u32, bool) -> bool,
) -> Result<SpecGeneration> {
    generate_with(target, draft, prompt, opts, &mut Schedule::new(k), on_token).await
}

/// [`generate`] with a schedule that outlives the generation: it starts from the costs and
/// acceptance `schedule` measured before (in earlier requests with the same target and draft)
/// and leaves this run's measurements in it; K is chosen by its policy (a caller that keeps a
/// schedule across requests starts each one with [`Schedule::start`]).
pub async fn generate_with(
    target: &mut Model,
    mut draft: Drafter<'_>,
    prompt: &[u32],
    opts: &GenerateOptions,
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
    let mut run = Loop::new(prompt, opts, draft.kind());
    run.prefill(target, &mut draft, prompt).await?;
    let verifier = Verifier::new(target, draft.resident().map(|d| &*d), &opts.sampling)?;
    let trips0 = target.gpu().round_trips();
    let t1 = Instant::now();
    let finish = loop {
        if let Some(finish) = run.cycle(target, &mut draft, &verifier, schedule, on_token).await? {
            break finish;
        }
    };
    let trips = target.gpu().round_trips() - trips0;
    let Loop { generated, from_draft, mut stats, k_sum, .. } = run;
    stats.close(&trips, generated.len(), t1.elapsed().as_secs_f64(), k_sum);
    Ok(SpecGeneration { tokens: generated, from_draft, finish, stats })
}

/// The loop's state between cycles (the names of the module's box).
struct Loop<'o> {
    opts: &'o GenerateOptions,
    /// The prompt and every token generated so far (all final).
    tokens: Vec<u32>,
    /// Positions in the target's KV cache: `tokens[n_past]` is id_last, which it has not run.
    n_past: usize,
    /// The tokens generated, and per token whether it was an accepted draft.
    generated: Vec<u32>,
    from_draft: Vec<bool>,
    /// The first position and the rows of the last target pass that hold the kept positions'
    /// hidden states: drafts that read hidden states get them before the next pass.
    kept_rows: Option<(usize, Vec<usize>)>,
    /// Cycles that drafted so far: the first two and every 16th calibrate (run CPU-driven, the
    /// verify pass timed apart for the schedule's cost model) where cycles run GPU-resident.
    drafting: usize,
    /// CPU-driven draft timings given to the schedule (where GPU-resident cycles run, until two
    /// exist: those cycles time the draft then, as what the verify pass leaves of them).
    timed: usize,
    /// Whether the last cycle was a plain step: a draft model's next proposal catches up on it,
    /// which is no draft token's cost.
    after_plain: bool,
    /// The K asked for, summed over cycles (the stats' mean K).
    k_sum: usize,
    stats: SpecStats,
}

/// What a cycle verifies: a chain, or a token tree; and, for a tree the loop sized or a draft
/// sized (a chain when that is all it kept), its nodes' rank paths for the schedule.
enum Planned {
    Chain { xs: Vec<u32>, slots: Option<Vec<Vec<u8>>> },
    Tree { tree: TokenTree, slots: Vec<Vec<u8>> },
}

impl<'o> Loop<'o> {
    fn new(prompt: &[u32], opts: &'o GenerateOptions, draft: DraftKind) -> Loop<'o> {
        let mut stats = SpecStats { draft, ..SpecStats::default() };
        stats.base.prompt_tokens = prompt.len();
        Loop {
            opts,
            tokens: prompt.to_vec(),
            n_past: 0,
            generated: Vec::new(),
            from_draft: Vec::new(),
            kept_rows: None,
            drafting: 0,
            timed: 0,
            after_plain: false,
            k_sum: 0,
            stats,
        }
    }

    /// Prefills all but the last prompt token (the first cycle's id_last), the draft seeing each
    /// chunk's hidden states and then the prompt.
    async fn prefill(&mut self, target: &mut Model, draft: &mut Drafter<'_>, prompt: &[u32]) -> Result<()> {
        let t0 = Instant::now();
        for chunk in prompt[..prompt.len() - 1].chunks(MAX_BATCH) {
            target.prefill(chunk, self.n_past)?;
            if let Some(d) = draft.draft() {
                // heads take the chunk's hidden states before the next pass overwrites them
                let rows: Vec<usize> = (0..chunk.len()).collect();
                self.stats.draft_steps +=
                    d.target_pass(Kept { context: prompt, first: self.n_past, rows: &rows }).await?;
            }
            self.n_past += chunk.len();
            self.stats.base.target_forwards += 1;
        }
        target.truncate(self.n_past);
        if let Some(d) = draft.draft() {
            self.stats.draft_steps += d.prefill(prompt).await?;
        }
        // (prefill passes are submitted without read-backs: their time ends when the GPU is done)
        target.sync().await?;
        self.stats.base.prefill_seconds = t0.elapsed().as_secs_f64();
        Ok(())
    }

    /// One cycle: the draft sees the last pass's hidden states, proposes up to K (GPU-resident,
    /// or on the CPU), the verifier decides, the loop commits. Returns why generation ends, if it
    /// does.
    async fn cycle(
        &mut self,
        target: &mut Model,
        draft: &mut Drafter<'_>,
        verifier: &Verifier,
        schedule: &mut Schedule,
        on_token: &mut dyn FnMut(u32, bool) -> bool,
    ) -> Result<Option<FinishReason>> {
        let (context, max_tokens) = (target.context(), self.opts.max_tokens);
        let remaining = max_tokens - self.generated.len().min(max_tokens);
        if remaining == 0 || self.n_past >= context {
            return Ok(Some(FinishReason::Length));
        }
        if let (Some(d), Some((first, rows))) = (draft.draft(), self.kept_rows.take()) {
            let td = Instant::now();
            self.stats.draft_steps +=
                d.target_pass(Kept { context: &self.tokens, first, rows: &rows }).await?;
            self.stats.draft_seconds += td.elapsed().as_secs_f64();
        }
        // K from the schedule, capped by the context and the tokens still wanted
        let cap = (context - self.n_past - 1).min(remaining - 1);
        let drafts = !matches!(draft, Drafter::None);
        let k = if drafts { schedule.pick(cap) } else { 0 };
        if drafts && k == 0 && cap > 0 && matches!(schedule.policy(), KPolicy::Adaptive { .. }) {
            self.stats.plain_cycles += 1;
        }
        self.k_sum += k;
        let calibrate = self.timed < 2 || self.drafting.is_multiple_of(16);
        let catching_up =
            std::mem::replace(&mut self.after_plain, k == 0) && matches!(draft, Drafter::Model(_));
        if k > 0 {
            self.drafting += 1;
        }
        let checked = match draft {
            Drafter::Model(dm) if k > 0 && !calibrate && verifier.resident() => {
                self.resident(target, dm, verifier, schedule, k).await?
            }
            d => {
                // (not after a plain step; nor once GPU-resident cycles time the draft)
                let time_draft = !catching_up && (self.timed < 2 || !verifier.resident());
                self.host_cycle(target, d, verifier, schedule, (k, cap), time_draft).await?
            }
        };
        Ok(self.commit(target, checked, schedule, on_token))
    }

    /// A GPU-resident cycle of `k` drafts; its time (one submission) split between the draft and
    /// the verify pass by the schedule's measured costs.
    async fn resident(
        &mut self,
        target: &mut Model,
        dm: &mut DraftModel,
        verifier: &Verifier,
        schedule: &mut Schedule,
        k: usize,
    ) -> Result<Checked> {
        let id_last = self.tokens[self.n_past];
        let tc = Instant::now();
        let at = CycleAt { target, draft: dm, context: &self.tokens, n_past: self.n_past, k };
        let (out, drew) = verifier.cycle(at).await?;
        // (after plain steps too: the catch-up on them rides in the first draft step's pass as
        // extra rows, about free on a GPU, past MAX_BATCH of them in passes of its own; and a
        // probe is then the only timing there is)
        let seconds = tc.elapsed().as_secs_f64();
        let k = out.drafts.len();
        schedule.observe_cycle(k, seconds);
        let (d, v) = (k as f64 * schedule.draft_seconds(), schedule.verify_seconds(k + 1));
        let draft_share = if d + v > 0.0 { d / (d + v) } else { 0.0 };
        let s = &mut self.stats;
        s.draft_steps += out.draft_steps;
        s.draft_seconds += seconds * draft_share;
        s.verify_seconds += seconds * (1.0 - draft_share);
        s.gpu_cycles += 1;
        Ok(Checked::from_outcome(id_last, out, drew))
    }

    /// A CPU-driven cycle: the draft proposes up to `k` (`bounds`: K and the deepest path the
    /// context and the tokens still wanted allow), timed for the schedule when `time_draft`; the
    /// verify pass checks the chain or tree the proposal becomes ([`plan`]).
    async fn host_cycle(
        &mut self,
        target: &mut Model,
        draft: &mut Drafter<'_>,
        verifier: &Verifier,
        schedule: &mut Schedule,
        (k, cap): (usize, usize),
        time_draft: bool,
    ) -> Result<Checked> {
        let (context, n_past) = (target.context(), self.n_past);
        let id_last = self.tokens[n_past];
        let td = Instant::now();
        let proposal = match draft.draft() {
            Some(d) if k > 0 => {
                let room = context - n_past - 1;
                let costs = schedule.tree_costs(room);
                // under an adaptive K, the whole tree (sized below)
                let nodes = costs.map_or(schedule.tree_nodes(k), |c| c.max_nodes).min(room);
                let budget = DraftBudget { depth: k, nodes, costs };
                d.propose(Ask { context: &self.tokens, budget, sampling: &self.opts.sampling }).await?
            }
            _ => Proposal::default(),
        };
        let draft_time = td.elapsed().as_secs_f64();
        self.stats.draft_steps += proposal.steps();
        self.stats.draft_seconds += draft_time;
        let drafted = proposal.tokens().len().min(k);
        if time_draft && drafted > 0 {
            schedule.observe_draft(drafted, draft_time);
            self.timed += 1;
        }
        let plan = plan(proposal, (id_last, n_past, context), (k, cap), schedule, draft_time);
        let tv = Instant::now();
        let (checked, rows, slots) = match plan {
            Planned::Tree { tree, slots } => {
                self.stats.tree_cycles += 1;
                (verifier.tree(target, &tree, n_past).await?, tree.len(), Some(slots))
            }
            Planned::Chain { xs, slots } => {
                let rows = xs.len() + 1;
                (verifier.chain(target, id_last, xs, n_past).await?, rows, slots)
            }
        };
        let verify_time = tv.elapsed().as_secs_f64();
        self.stats.verify_seconds += verify_time;
        schedule.observe_verify(rows, verify_time);
        if let Some(slots) = slots {
            // (a chain's nodes are its positions)
            schedule.observe_tree(&slots, &checked.trace.accepted);
        }
        Ok(checked)
    }

    /// Counts what the verify pass decided and commits it: the target keeps id_last and the
    /// accepted drafts, the new token is the next id_last; each emitted token may end generation.
    fn commit(
        &mut self,
        target: &mut Model,
        checked: Checked,
        schedule: &mut Schedule,
        on_token: &mut dyn FnMut(u32, bool) -> bool,
    ) -> Option<FinishReason> {
        let Checked { xs, verdict, drafted, depth, rows, trace, drew_on_gpu } = checked;
        let s = &mut self.stats;
        s.verify_forwards += 1;
        s.base.target_forwards += 1;
        s.gpu_sampled += drew_on_gpu as usize;
        if drafted > 0 {
            s.last_cycle = Some(trace);
        }
        schedule.observe_acceptance(depth, verdict.accepted);
        s.drafted += drafted;
        s.accepted += verdict.accepted;
        let reached = (verdict.accepted + 1).min(depth);
        if s.reached_by_position.len() < depth {
            s.reached_by_position.resize(depth, 0);
            s.accepted_by_position.resize(depth, 0);
        }
        for i in 0..reached {
            s.reached_by_position[i] += 1;
            if i < verdict.accepted {
                s.accepted_by_position[i] += 1;
            }
        }
        self.kept_rows = Some((self.n_past, rows));
        self.n_past += 1 + verdict.accepted;
        target.truncate(self.n_past);
        debug_assert!(verdict.accepted <= xs.len());
        let new = xs[..verdict.accepted].iter().map(|&x| (x, true)).chain([(verdict.next, false)]);
        for (tok, drafted) in new {
            self.tokens.push(tok);
            self.generated.push(tok);
            self.from_draft.push(drafted);
            if !on_token(tok, drafted) {
                return Some(FinishReason::Cancelled);
            }
            if self.opts.stop_tokens.contains(&tok) {
                return Some(FinishReason::Stop);
            }
            if self.generated.len() >= self.opts.max_tokens {
                return Some(FinishReason::Length);
            }
        }
        None
    }
}

/// What a proposal is verified as. A chain, its first K tokens. A tree (deterministic drafts
/// only: sampling verifies it with the multi-candidate rule) whose rows fit the context and whose
/// longest path fits the tokens still wanted (`cap`), cut to what the measured costs make worth
/// verifying (a chain when that is all) unless the draft sized it; else its first branch.
fn plan(
    proposal: Proposal,
    (id_last, n_past, context): (u32, usize, usize),
    (k, cap): (usize, usize),
    schedule: &Schedule,
    draft_time: f64,
) -> Planned {
    let (tree, sized) = match proposal {
        Proposal::Chain { mut tokens, .. } => {
            tokens.truncate(k);
            return Planned::Chain { xs: tokens, slots: None };
        }
        Proposal::Tree { tree, sized, .. } => (tree, sized),
    };
    let tree = match n_past + tree.len() <= context {
        true => tree,
        // its first nodes (each parent before its children) in the rows left
        false => tree.subtree(&(0..tree.len()).map(|i| n_past + i < context).collect::<Vec<_>>()),
    };
    if tree.tokens().first() != Some(&id_last) || tree.max_depth() > cap {
        let mut xs = tree.first_branch();
        xs.truncate(k);
        return Planned::Chain { xs, slots: None };
    }
    let (tree, slots) = match sized {
        true => {
            let slots = tree.rank_paths();
            (tree, slots)
        }
        false => schedule.size_tree(&tree, draft_time),
    };
    match tree.is_chain() {
        true => Planned::Chain { xs: tree.tokens()[1..].to_vec(), slots: Some(slots) },
        false => Planned::Tree { tree, slots },
    }
}

impl SpecStats {
    /// The totals of a generation of `generated` tokens decoded in `decode_seconds` with the
    /// round trips `trips`, K summing to `k_sum` over its cycles.
    fn close(&mut self, trips: &RoundTrips, generated: usize, decode_seconds: f64, k_sum: usize) {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        self.submits = trips.submits;
        self.readbacks = trips.readbacks;
        self.readback_bytes = trips.readback_bytes;
        self.submits_per_token = ratio(trips.submits as f64, generated as f64);
        self.dispatches = trips.dispatches;
        self.host_encode_seconds = trips.host_nanos as f64 * 1e-9;
        let cycles = self.verify_forwards.max(1) as f64;
        self.dispatches_per_cycle = trips.dispatches as f64 / cycles;
        self.host_us_per_cycle = self.host_encode_seconds * 1e6 / cycles;
        self.base.generated_tokens = generated;
        self.base.decode_seconds = decode_seconds;
        self.base.tokens_per_second = ratio(generated as f64, decode_seconds);
        self.acceptance_rate = ratio(self.accepted as f64, self.drafted as f64);
        self.acceptance_by_position = (self.reached_by_position.iter().zip(&self.accepted_by_position))
            .map(|(&r, &a)| ratio(a as f64, r as f64))
            .collect();
        let verifies = self.verify_forwards as f64;
        self.tokens_per_target_forward = ratio(generated as f64, verifies);
        self.mean_k = ratio(k_sum as f64, verifies);
    }
}
