//! Continuous batching: requests share every forward pass of the target (Orca's iteration-level
//! scheduling over vLLM's paged KV cache).
//!
//! ```text
//!   waiting   requests not yet admitted (or preempted), oldest first
//!   running   sequences with pages of the target's KV cache pool, in arrival order
//!   a pass    1. each decoding sequence: its last token (1 row)
//!             2. sequences still prefilling: a chunk of their prompt, within the pass's rows
//!             3. rows left: drafts after decoding sequences' newest tokens, where the
//!                measured costs say they pay (below): n-gram drafts (a chain, or with the
//!                continuations of several matches a token tree), the draft model's chains,
//!                made by its passes over the sequences drafting with it, the EAGLE head's
//!                chains with each depth's next likeliest ids beside them, made by its passes
//!                over theirs, or the Medusa heads' trees of their ranked guesses, from each
//!                one's last row of the pass before (`propose`); an ensemble's with the
//!                n-gram's continuations merged beside them (one tree)
//!             one target pass over all of them (Model::encode_pages: a tree's nodes see their
//!             ancestors alone), the argmax of each row that wants logits (a newest token's and
//!             its drafts', never a prompt chunk's before its last token, whose rows run for
//!             their keys and values only), and each sampled request's draws from its rows (its
//!             seed, its rows' positions: a tree node's, its root's plus its depth)
//!   commit    per sequence: the drafts its rows' choices (argmax or draw) agree with (a tree:
//!             the path they follow from the root), then the choice after them; a tree's path
//!             moved to its positions in the sequence's pages (Model::keep_paths_in_pages);
//!             finished sequences return their pages before the next pass
//!   follow    one EAGLE head pass over the kept rows of the sequences it follows (the
//!             target's features of the pass, each row's next token): its cache follows theirs,
//!             and each one's last row ranks its next first draft, read with the head's
//!             probability of it (its record) before the next plan; timed one in 16
//!             ([`FOLLOW_TIMED`], [`EAGLE_PATIENCE`], [`Batch::head_follows`])
//! ```
//!
//! Drafts take the rows left where they pay for themselves: one more draft after a sequence's
//! i drafts adds the expected tokens α^(i+1) (α: a lower bound of its measured acceptance,
//! counted after its drafter's over the batch's sequences, 1/2 before any, its mean while
//! young: [`Seq::chances`], [`Tally::young`];
//! an n-gram's apart by the words its match has, an EAGLE head's by its confidence in its first
//! draft, [`Drafting::record`], a sibling beside it by its own probability, [`sibling_record`];
//! once the head has drafted, each node is judged again by the head's probability of it, and
//! stays where it still pays, [`confident_nodes`];
//! a tree's node its chance, [`node_chances`], from a first child's acceptance α and a later
//! sibling's, each measured apart ([`Tally`]), its nodes taken likeliest first, each after its
//! parent) and costs the marginal seconds of its row, S(R + 1) - S(R): a pass's seconds by its
//! rows R are measured (passes whose rows all want logits, as a draft's does: a prompt chunk's
//! skip the output projection) and fitted as S(R) = a + b R + c G(R) (b: the median of the
//! marginal rows measured between consecutive passes, [`PassCosts::paired`]), G(R) the target's
//! matmul row groups in it ([`Gpu::matmul_row_groups`](crate::gpu::Gpu::matmul_row_groups): each reads every
//! weight once, so the row that starts a group costs c more; a line where the passes measured
//! do not tell c apart; a row count not measured in the latest 16 passes, as drafting in every
//! pass leaves the count without drafts, is refreshed by a pass without adaptive drafts). It is
//! added, the likeliest first, where α^(i+1) over its seconds is at
//! least the pass's expected tokens per second T / S(R) (S(R) as measured where R was). So drafting shrinks by itself where rows
//! cost what serving more requests does (never into a group of its own: on lavapipe a ninth row
//! after 8 decoding ones cost 40% of the pass), and grows where rows are nearly free (a GPU's
//! few-row passes).
//! A draft model's draft costs its share of a draft pass too (its first one also the draft's
//! catch-up on the tokens it has not seen), an EAGLE draft its share of the
//! head's measured chains (their seconds by drafts), and a request's first Medusa draft its row
//! of the heads' measured runs (their seconds by rows: every head runs over each row); such a
//! fixed cost of a first draft is paid where it and the drafts after it together pay (a tree's
//! node that needs no step of its drafter beyond those taken, an EAGLE sibling or an ensemble's
//! n-gram node, costs its target row alone), and a
//! sequence whose next draft does not pay leaves the others drafting. Nothing is free before it is
//! measured: until two row counts are, a pass of a count measured already takes one draft (the
//! probe that measures another) and the others none; a drafter not run yet lets each sequence
//! draft one (its probe). A request that fixes K (`draft_k`) drafts that many where the rows
//! allow (a tree: the one-sequence loop's nodes for that K, in the tree's order).
//!
//! A sequence is admitted when the pool has pages for its tokens and it has a place (`max_seqs`,
//! and no more than a pass has rows: each running sequence takes one); its first whole pages
//! that the prefix cache holds are found computed (`super::pool`). A decoding sequence that
//! needs a new page and finds none preempts the youngest running sequence: its pages return to
//! the pool and it waits at the head of the queue (in arrival order), to run its tokens (prompt and generated)
//! again when admitted, but those the prefix cache still holds. Every row of a pass reads only
//! the keys of its own sequence's tokens (in its own pages, or in cached pages that hold the same
//! tokens' keys, bit for bit) and the kernels are batch-invariant, so a request's tokens are, bit for bit,
//! those of its run alone ([`Engine::generate`](super::Engine::generate)) whatever shares its
//! passes, in whatever order requests arrive, preempted or not: greedy, and sampled too, whose
//! draws are keyed by the request's seed and each row's position (the noise of plain sampled
//! decoding; deterministic drafts are kept where the row drew them, so drafting never changes
//! the tokens).

use std::collections::VecDeque;

use serde::Serialize;
use web_time::Instant;

use super::pool::Pool;

mod propose;
use super::prompt::TextStream;
use super::request::{Completion, Request, TokenEvent};
use crate::error::{Error, Result};
use crate::generation::FinishReason;
use crate::gpu::{sample_scratch_len, GpuBuffer, Op, SampleSeed, KV_PAGE, MAX_TREE};
use crate::model::{EagleHead, Model, Ranked, SeqRows, MAX_BATCH, MAX_EAGLE_DEPTH, MAX_MEDUSA_HEADS};
use crate::sampling::SamplingParams;
use crate::speculative::sampled::target_draws;
use crate::speculative::schedule::tree_nodes;
use crate::speculative::{DraftBudget, DraftKind, Medusa, NGram, SpecStats, TokenTree, TREE_BRANCHES};
use crate::tokenizer::Tokenizer;

/// A request in the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SeqId(pub u64);

/// What a pass tells about one request: its committed tokens as they come, then how it ended.
#[derive(Debug)]
pub enum BatchEvent {
    /// A committed token (or, `id: None`, the text held back until the end).
    Token(TokenEvent),
    /// The generation ended (a stop token or string, `max_tokens`, the context's end).
    Done(Box<Completion>),
    /// The request failed alone (its text could not be decoded); the others go on.
    Failed(Error),
}

/// How much one pass takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Most sequences running at once (1..=[`MAX_BATCH`]: each needs a row of every pass).
    pub max_seqs: usize,
    /// Most rows of one pass: decoding tokens, prompt chunks and drafts (1..=[`MAX_BATCH`]).
    pub max_rows: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits { max_seqs: MAX_BATCH, max_rows: MAX_BATCH }
    }
}

/// Costs the batch's plans take as measured, fixed until
/// [`Engine::set_batch_costs`](super::Engine::set_batch_costs) is given none: for tests that
/// need the plan's choices made (the measured ones come from timings), and plans reproduced
/// from a run's figures ([`BatchStatus::measured_costs`]: another adapter's, a GPU's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct FixedCosts {
    /// Seconds of a target pass of one row, and of each row more.
    pub pass: f64,
    pub row: f64,
    /// Seconds of the EAGLE head's follow (its pass over the kept rows and its first drafts),
    /// shared by the sequences it follows, and of each row it runs.
    pub follow: f64,
    pub follow_row: f64,
    /// Seconds of a submission of the EAGLE head's chains' steps (every chain drafting past its
    /// first draft in a pass: their fixed seconds, shared), and of each row of those steps.
    pub head_pass: f64,
    pub head_step: f64,
}

/// The batch in figures (the server's `/metrics`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct BatchStatus {
    pub running: usize,
    pub waiting: usize,
    /// Pages of the pool held by running sequences, and those a sequence can take (free, or
    /// cached and held by none).
    pub pages_used: usize,
    pub pages_free: usize,
    /// Pages whose keys and values the prefix cache keeps (held or not).
    pub pages_cached: usize,
    /// Positions found in the prefix cache at admissions, since the engine was made.
    pub cached_tokens: u64,
    /// Passes run, rows they held (prompt chunks, decoding tokens, drafts), drafts among them
    /// and sequences preempted, since the engine was made.
    pub passes: u64,
    pub rows: u64,
    pub drafts: u64,
    pub preemptions: u64,
    /// Drafts an adaptive K's proposal lost once its drafter ranked them, below a step too
    /// unsure to pay for them (the EAGLE head's: EAGLE-2's dynamic depth), since the engine was
    /// made.
    pub drafts_cut: u64,
    /// The EAGLE head's follows (its passes over the kept rows of the sequences it follows) and
    /// the rows of its chains' steps (a chain's drafts after the first), since the engine was
    /// made.
    pub head_follows: u64,
    pub head_step_rows: u64,
    /// The rows of those follows (the kept rows the head ran: a followed prompt's too), and the
    /// submissions of those steps, since the engine was made.
    pub head_follow_rows: u64,
    pub head_step_passes: u64,
    /// The costs the plans take now, as [`FixedCosts`]: the target's pass of one row and its
    /// marginal row (the fit's mean over the row counts measured), the head's follow and its
    /// steps (0 where not measured: no EAGLE head); none before two row counts are measured.
    /// Given to `--batch-costs`, this machine replays another adapter's plans (a GPU's).
    pub measured_costs: Option<FixedCosts>,
    /// Sequences whose drafts in a pass were a token tree (n-gram continuations of several
    /// matches, an EAGLE chain with siblings, Medusa's tree, an ensemble's), since the engine
    /// was made.
    pub trees: u64,
    /// `k[i]`: how often a sequence's newest token went into a pass with i drafts after it
    /// (the last: 8 or more), since the engine was made: K per sequence.
    pub k: [u64; 9],
}

/// The head's passes over a sequence's kept rows (its follows) that its drafts have not paid
/// for, net, after which a sequence's adaptive K stops drafting with the EAGLE head for the rest
/// of its run (a preempted one starts over): that pass, which every pass pays to keep the head's
/// cache whole, no longer runs. Each pass where the measured costs chose (rows were left, or it
/// drafted) adds one, less the surplus of its drafts (their expected tokens at the pass's
/// tokens per second, less their seconds) in follows' measured seconds ([`draft`]). Where rows
/// cost what serving more requests does, or the head guesses its text badly, the follows are
/// all the head would cost: on lavapipe a few marginal drafts a request kept the head following
/// every pass (4-7 ms of a 60-90 ms pass at N = 1), 5-20 % below plain decoding.
const EAGLE_PATIENCE: usize = 8;

/// Drafts of a record across the batch (its drafter's, of one confidence or match length)
/// below which it is judged by its mean, not its lower bound ([`Tally::young`]).
const YOUNG: usize = 8;

/// The head's follows timed (their first drafts read back at once, waiting for the GPU; the
/// others' are read before the next plan, the GPU running the follow meanwhile): every one
/// until two row counts are measured, then one in this many.
const FOLLOW_TIMED: u64 = 16;

/// The records of a sequence's drafts and of its drafter's ([`Drafting::record`]): an n-gram's
/// drafts after a match of 1, 2, and 3 or more words are tallied apart (on SmolLM2-135M a first
/// draft after each was kept 24 %, 41 % and 84 % of the time: the mean of all, below what a row
/// costs on lavapipe, kept every one from drafting); the EAGLE head's by its probability of its
/// draft at each depth ([`EAGLE_CONFIDENCE`]), its siblings' by its probability of each
/// ([`SIBLING_CONFIDENCE`]); another drafter's are one record.
const RECORDS: usize = 3;

/// The head's probabilities of its draft from which an EAGLE draft goes to records 1 and 2
/// (below the first: record 0), a sequence's plan by its first draft's, each depth's outcomes
/// by its own step's. EAGLE-2's finding: a draft head's confidence tells how often the target
/// takes its draft, at any depth. SmolLM2-135M's head over the bench's prompts (584 first
/// drafts, each pass drafting): below 0.3, 67 % of them, 21 % kept; 0.3-0.6, 23 %, 40 % kept;
/// from 0.6 on, 10 %, 72 % kept. Its second drafts whose first was kept (163, K = 4 at 4
/// requests): below 0.3, 11 % kept (135); 0.3-0.6, 73 % (26); from 0.6 on, 2 of 2.
const EAGLE_CONFIDENCE: [f32; RECORDS - 1] = [0.3, 0.6];

/// The record of an EAGLE draft the head ranked with log-probability `log_prob`
/// ([`EAGLE_CONFIDENCE`]).
fn confident(log_prob: f32) -> usize {
    EAGLE_CONFIDENCE.iter().filter(|&&p| log_prob >= p.ln()).count()
}

/// The head's probabilities of a later sibling (one of a step's next likeliest ids beside its
/// draft) from which it goes to records 1 and 2 (below the first: record 0), each sibling judged
/// by its own probability and its outcome tallied there ([`Tally::later`] of the EAGLE head's
/// records). SmolLM2-135M's head over the bench's prompts (`--draft-k 4`, 4 requests), siblings
/// kept where those before them were rejected: below 0.02, 7 %; 0.02-0.05, 10 %; 0.05-0.1, 11 %;
/// 0.1-0.2, 27 %; 0.2-0.3, 38 %; 0.3-0.6, 50 %. By rank alone: 15 %, 15 %, 12 %.
const SIBLING_CONFIDENCE: [f32; RECORDS - 1] = [0.1, 0.2];

/// The record of an EAGLE sibling the head ranked with log-probability `log_prob`
/// ([`SIBLING_CONFIDENCE`]).
fn sibling_record(log_prob: f32) -> usize {
    SIBLING_CONFIDENCE.iter().filter(|&&p| log_prob >= p.ln()).count()
}

/// The acceptances each node of an EAGLE proposal's `shape` is judged by ([`node_chances`]), by
/// the head's probability of it (`log_probs`, per node; none: not known, a step not run yet or
/// an ensemble's n-gram node): a first child by its record's ([`confident`]; unknown: its depth's
/// record, `depth_record(depth)`), a later sibling by its sibling record's ([`sibling_record`];
/// unknown: every sibling record's together), each from `s`'s tallies counted after its
/// drafter's (`pooled`: [`Seq::chances`]).
fn eagle_acceptances(
    s: &Seq,
    pooled: &[Tally; RECORDS],
    shape: &TokenTree,
    log_probs: &[Option<f32>],
    depth_record: impl Fn(usize) -> usize,
) -> Vec<(f64, f64)> {
    let at = |n: usize| {
        let log_prob = log_probs.get(n).copied().flatten();
        let first = log_prob.map_or_else(|| depth_record(shape.depth(n)), confident);
        let later = log_prob.map_or(0..RECORDS, |p| sibling_record(p)..sibling_record(p) + 1);
        (s.chances(first, &pooled[first]).0, s.sibling_chance(later, pooled))
    };
    // (the root is no one's sibling: never judged)
    std::iter::once((1.0, 1.0)).chain((1..shape.len()).map(at)).collect()
}

/// Which nodes of an adaptive EAGLE proposal stay once the head has drafted them, by each
/// step's confidence (EAGLE-2's dynamic depth). The plan took them (`taken`, nodes of `shape` in
/// the order taken, each at its price in tokens: `prices`, [`add_adaptive`]'s) at the chances
/// of its first draft's record below depth 1; drafted, a node's chance is taken with the
/// acceptances of its own probability (`at(node)`: [`eagle_acceptances`]; [`node_chances`]),
/// and a node stays where that is still its price or more and its parent stayed. Depth 1's all
/// stay (the plan judged them by their own probabilities, from the head's follow).
fn confident_nodes(
    shape: &TokenTree,
    taken: &[usize],
    prices: &[f64],
    at: impl Fn(usize) -> (f64, f64),
) -> Vec<bool> {
    let chance = node_chances(shape, at);
    let mut stays = vec![false; shape.len()];
    stays[0] = true;
    for (&n, &price) in taken.iter().zip(prices) {
        stays[n] = stays[shape.parents()[n]] && (shape.depth(n) == 1 || chance[n] >= price);
    }
    taken.iter().map(|&n| stays[n]).collect()
}

/// A row count of the target's passes is stale once this many passes of other counts have been
/// measured since its latest: a plan of that many rows whose drafts are all adaptive runs
/// without them, and its pass refreshes the count ([`PassCosts::stale`]).
const STALE_PASSES: u64 = 16;

/// The marginal rows measured between consecutive passes that the target's fit takes its b
/// from (their median, once there are [`MIN_PAIRS`]; [`PassCosts::fit`]): the latest this many.
const PAIRS: usize = 15;
const MIN_PAIRS: usize = 5;

/// The prefix cache's root of a request that finds only its own pages: this bit and the id of
/// its first choice (the pool's entries count up from 1, never reaching it).
const OWN_ROOT: u64 = 1 << 63;

/// One request's state.
struct Seq {
    id: SeqId,
    /// The prompt and every committed token; positions `..n_past` are in its pages.
    tokens: Vec<u32>,
    prompt_len: usize,
    n_past: usize,
    pages: Vec<u32>,
    /// Its first pages that are in the prefix cache (found at admission, or cached since), and
    /// the entry of the last of them (`root`: none).
    cached_pages: usize,
    entry: u64,
    /// The entry its first page follows in the prefix cache: 0, shared by every request, or
    /// its request's own ([`OWN_ROOT`]: requests do not share prefixes).
    root: u64,
    /// Prompt tokens found in the prefix cache at its first admission.
    cached_tokens: Option<usize>,
    /// The first choice of its request (OpenAI's `n`), whose computed prompt it waits for.
    after: Option<SeqId>,
    max_tokens: usize,
    /// End-of-generation tokens do not end it ([`Request::ignore_eos`]).
    ignore_eos: bool,
    /// Per generated token: whether it was an accepted draft.
    from_draft: Vec<bool>,
    text: TextStream,
    /// Its drafting (none: plain decoding).
    drafting: Option<Drafting>,
    /// Its drafts' outcomes per record ([`Drafting::record`]), for its acceptance
    /// ([`Seq::chances`]).
    tally: [Tally; RECORDS],
    /// Its sampling, and a sampled request's draws once admitted (none: greedy, the argmax):
    /// from the target's rows, and (drafting with the draft model) from the draft's rows, with
    /// the same noise.
    sampling: SamplingParams,
    draw: Option<Draw>,
    draft_draw: Option<Draw>,
    stats: SpecStats,
    /// When it was first admitted, and when its first token came.
    admitted: Option<Instant>,
    first_token: Option<Instant>,
}

/// A sequence's drafting: where its drafts come from (an ensemble's: with the n-gram's
/// continuations merged beside them), the most a pass verifies, and whether the request fixed
/// that K (else the measured costs choose, up to it).
struct Drafting {
    source: Source,
    ngram: Option<NGram>,
    k_max: usize,
    fixed: bool,
}

/// Where a sequence's drafts come from.
enum Source {
    /// The n-gram of its own tokens.
    NGram(NGram),
    /// The engine's draft model ([`propose`]): the sequence's pages of the draft's pool, and its
    /// positions `..past` that the draft has computed (its tokens').
    Model { pages: Vec<u32>, past: usize },
    /// The engine's EAGLE head ([`propose`]): its positions `..past` the head has run (the
    /// target's features of each, and the next token; in the head's pages of the same ids as the
    /// sequence's target pages), its last row in the head's latest pass with its first draft
    /// ranked there (none: that pass was not its, or its ranks are not read yet: it cannot draft;
    /// [`EagleHead::run_pages`], [`propose::take_firsts`]), and the head's passes over its rows
    /// that its adaptive K's drafts have not paid for, net (at [`EAGLE_PATIENCE`] the head stops
    /// following it: it decodes plainly for the rest of its run).
    Eagle { past: usize, row: Option<(usize, Ranked)>, idle: f64 },
    /// The engine's Medusa heads ([`propose`]): the sequence's row of the last pass at the
    /// position before its newest token (whose hidden state the heads read: head i guesses the
    /// token i + 1 places after the newest; none: that pass had no row of it).
    Medusa { row: Option<usize> },
}

/// The drafters the engine has loaded, for the batch's passes.
pub(super) struct Drafters<'a> {
    pub model: Option<&'a mut Model>,
    pub eagle: Option<&'a mut EagleHead>,
    pub medusa: Option<&'a Medusa>,
    /// Siblings beside each depth of the EAGLE head's chains
    /// ([`crate::speculative::Eagle::batch_siblings`]).
    pub eagle_siblings: usize,
}

impl Drafting {
    fn is_model(&self) -> bool {
        matches!(self.source, Source::Model { .. })
    }

    fn is_eagle(&self) -> bool {
        matches!(self.source, Source::Eagle { .. })
    }

    /// Whether it drafts with the EAGLE head and the head follows it ([`EAGLE_PATIENCE`]).
    fn is_followed(&self) -> bool {
        matches!(self.source, Source::Eagle { idle, .. } if idle < EAGLE_PATIENCE as f64)
    }

    fn is_medusa(&self) -> bool {
        matches!(self.source, Source::Medusa { .. })
    }

    /// The record its drafts after `tokens` go to and are judged by (an index of
    /// [`Seq::tally`] and of its drafter's [`Batch::acceptance`]): an n-gram's by the words of
    /// its match, 1, 2, and 3 or more ([`NGram::matched`]; [`RECORDS`]); the EAGLE head's (an
    /// ensemble's too) by the head's probability of its first draft ([`EAGLE_CONFIDENCE`]; once
    /// drafted, each depth's by its own step's: [`Rows::records`]); another drafter's the first.
    fn record(&self, tokens: &[u32]) -> usize {
        match &self.source {
            Source::NGram(ngram) => ngram.matched(tokens).clamp(1, RECORDS) - 1,
            Source::Eagle { row: Some((_, first)), .. } => confident(first.confidence()),
            _ => 0,
        }
    }

    /// Its drafter's index in [`Batch::acceptance`] (an ensemble's: its drafter's).
    fn drafter(&self) -> usize {
        match self.source {
            Source::NGram(_) => 0,
            Source::Model { .. } => 1,
            Source::Eagle { .. } => 2,
            Source::Medusa { .. } => 3,
        }
    }
}

impl Seq {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Its acceptances as drafts of `record` are judged by ([`node_chances`]): a first child's
    /// (a chain's next draft's) once its parent is kept, and a later sibling's once those before
    /// it are rejected, from its own tally counted after its drafter's across the batch's
    /// sequences (`pooled`, of that record), each a lower bound ([`Tally::bound`]).
    fn chances(&self, record: usize, pooled: &Tally) -> (f64, f64) {
        let own = &self.tally[record];
        (Tally::bound(own.first, pooled.first), Tally::bound(own.later, pooled.later))
    }

    /// An EAGLE sibling's acceptance from the `records` together (their later siblings'
    /// tallies, its own counted after its drafter's, `pooled`: [`Tally::pooled_bound`]).
    fn sibling_chance(&self, records: std::ops::Range<usize>, pooled: &[Tally; RECORDS]) -> f64 {
        let later =
            |tallies: &[Tally]| tallies.iter().fold((0, 0), |(k, r), t| (k + t.later.0, r + t.later.1));
        Tally::pooled_bound(later(&self.tally[records.clone()]), later(&pooled[records]))
    }

    /// Whether it drafts with the EAGLE head and can now: decoding, the head has run its
    /// positions up to its newest token's, the last in the head's latest pass.
    fn eagle_ready(&self) -> bool {
        match &self.drafting {
            Some(Drafting { source: Source::Eagle { past, row: Some(_), .. }, .. }) => {
                *past == self.n_past && self.n_past + 1 == self.tokens.len()
            }
            _ => false,
        }
    }

    /// Pages its positions `..end` take.
    fn pages_for(end: usize) -> usize {
        end.div_ceil(KV_PAGE)
    }
}

/// A sampled request's draws on the GPU: its seed and the uniform keying them (with the row its
/// rows start at among the pass's rows with logits: a row of [`Model::logits_step_buffer`]), its
/// non-finite flag, the ops drawing from its rows into the batch's shared words.
struct Draw {
    seed: u64,
    uniform: wgpu::Buffer,
    status: GpuBuffer<u32>, // [1] 1 + its last row with a non-finite logit, or 0
    ops: Vec<Op>,
}

/// What a batched pass reads back: each row's argmax, each row's draw, each sequence's
/// non-finite flag (sampled ones); and the scratch every sampled request's draws share (they
/// run one after another).
struct Readback {
    draws: GpuBuffer<u32>,   // [MAX_BATCH] the sampled rows' draws
    result: GpuBuffer<u32>,  // [MAX_BATCH argmax | MAX_BATCH draws | MAX_BATCH flags]
    scratch: GpuBuffer<u32>, // the draws' (sample_scratch_len of the model's logits rows)
}

/// Where the draws and the flags start in a [`Readback`]'s result words, and their number.
const DRAWS_AT: usize = MAX_BATCH;
const FLAGS_AT: usize = 2 * MAX_BATCH;
const RESULT_WORDS: usize = 3 * MAX_BATCH;

impl Readback {
    fn new(target: &Model) -> Readback {
        let g = &**target.gpu();
        let cfg = target_draws(&SamplingParams::default(), target.config.vocab_size);
        let words = sample_scratch_len(target.logits_buffer(), cfg);
        Readback {
            draws: GpuBuffer::<u32>::zeros(g, "batch draws", MAX_BATCH),
            result: GpuBuffer::<u32>::zeros(g, "batch result", RESULT_WORDS),
            scratch: GpuBuffer::<u32>::zeros(g, "batch sample scratch", words),
        }
    }
}

/// The rows one sequence has in a pass: its tokens `n_past..n_past + run` (`pending`: all it has
/// not run, the last of them its newest token), then `drafts`: a chain after the newest token,
/// or the nodes of `tree` after its root, the newest token.
struct Rows {
    seq: usize,
    run: usize,
    pending: bool,
    drafts: Vec<u32>,
    /// The K asked of the drafter (a fixed K capped by the context and the tokens still
    /// wanted, as the one-sequence loop asks it; the drafts may be fewer).
    asked: usize,
    /// While planned, a token tree's proposal ([`Proposed`]), `drafts` holding as many
    /// placeholders as nodes are taken (its first ones in its order). Once the drafts are placed
    /// ([`place_drafts`]) it is gone, and `tree` is the tree of the nodes taken (none: they are a
    /// chain), `drafts` its nodes after the root.
    proposed: Option<Proposed>,
    tree: Option<TokenTree>,
    /// The record its drafts go to ([`Drafting::record`]), and once the EAGLE head has drafted
    /// them, each depth's own (by the confidence of its step: [`confident`]; none, or deeper
    /// than its steps: `record`).
    record: usize,
    records: Vec<usize>,
    /// Once placed, per node of `tree`, the EAGLE head's log-probability of it where the head
    /// ranked it (none: another drafter's node, or an ensemble's n-gram node): a node's outcome
    /// goes to the record of its own probability ([`Rows::tallies`]).
    log_probs: Vec<Option<f32>>,
    /// The tokens each adaptive draft had to be worth to be taken ([`add_adaptive`]; 0: a probe
    /// or a fixed cost's bundle); none for a fixed K.
    prices: Vec<f64>,
}

impl Rows {
    /// `run` of the sequence's tokens not run yet, no drafts.
    fn new(seq: usize, run: usize, pending: bool) -> Rows {
        let (drafts, records, log_probs, prices) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (proposed, tree) = (None, None);
        Rows { seq, run, pending, drafts, asked: 0, proposed, tree, record: 0, records, log_probs, prices }
    }

    /// The records its drafts' outcomes by `v` go to, each with its tally: once the EAGLE head
    /// has drafted them, each node tried by the head's probability of it (a chain's drafts kept
    /// and its first rejected, a tree's children of its path's nodes: [`Tally::tried`]), a first
    /// child's [`confident`], a later sibling's [`sibling_record`] ([`Rows::log_probs`]; unknown:
    /// a first child's by its depth's record, [`Rows::records`], a sibling's nowhere: it is
    /// judged as the head's siblings together are), or all to [`Rows::record`].
    fn tallies(&self, v: &Verdict) -> Vec<(usize, Tally)> {
        if self.records.is_empty() {
            return vec![(self.record, v.tally)];
        }
        let record = |depth: usize| self.records.get(depth - 1).copied().unwrap_or(self.record);
        let (Some(tree), Some(path)) = (&self.tree, &v.path) else {
            let kept = v.kept.len();
            let outcome =
                |j: usize| Tally { first: ((j < kept) as usize, (j == kept) as usize), later: (0, 0) };
            return (0..self.drafts.len().min(kept + 1)).map(|j| (record(j + 1), outcome(j))).collect();
        };
        let own = |n: usize| self.log_probs.get(n).copied().flatten();
        (Tally::tried(tree, path).into_iter())
            .filter_map(|(n, first, t)| match (own(n), first) {
                (Some(p), true) => Some((confident(p), t)),
                (Some(p), false) => Some((sibling_record(p), t)),
                (None, true) => Some((record(tree.depth(n)), t)),
                (None, false) => None,
            })
            .collect()
    }
}

/// The engine's batch of requests ([`Engine::batch_submit`](super::Engine::batch_submit)).
pub(super) struct Batch {
    /// The pages of the target's pool, and the prefix cache in them.
    pool: Pool,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    next_id: u64,
    pub(super) limits: BatchLimits,
    /// The n-gram's continuations per proposal of the requests submitted from now on: drafting
    /// alone (1: the latest match's chain; more: a token tree), and beside an ensemble's draft.
    pub(super) ngram_branches: (usize, usize),
    /// Whether the requests submitted from now on find other requests' pages in the prefix
    /// cache ([`Engine::set_prefix_sharing`](super::Engine::set_prefix_sharing)).
    pub(super) share_prefixes: bool,
    status: BatchStatus,
    costs: PassCosts,
    /// Per drafter ([`Drafting::drafter`]: the n-gram, the draft model, the EAGLE head, the
    /// Medusa heads) and record ([`Drafting::record`]), its sequences' drafts' outcomes: where
    /// a new sequence's acceptance starts ([`Seq::chances`]).
    acceptance: [[Tally; RECORDS]; 4],
    /// The pages of the draft model's pool (no prefix cache: a sequence's own), the costs of its
    /// passes, and whether a pass of it ran since the one-sequence loop last drafted with it.
    draft_pool: Pool,
    draft_costs: PassCosts,
    pub(super) draft_used: bool,
    /// The EAGLE head's costs of its chains' steps (by step rows: a chain's drafts after the
    /// first, which the head's follow ranked), and whether a pass of it ran since the
    /// one-sequence loop last drafted with it. (Its pool has the target's pages: a sequence's
    /// head part is in the head's pages of the same ids as its target pages.)
    head_costs: PassCosts,
    pub(super) head_used: bool,
    /// The seconds of the head's passes over the kept rows of the sequences it follows, with
    /// their first drafts read back (by rows; [`FOLLOW_TIMED`]), and the passes it ran; the
    /// sequences of the latest whose first drafts are not read yet, each with its last row
    /// ([`propose::take_firsts`]).
    follow_costs: PassCosts,
    follows: u64,
    firsts_pending: Vec<(SeqId, usize)>,
    /// How often a first draft of a sequence ready to draft fell in each record
    /// ([`EAGLE_CONFIDENCE`]): a new sequence is followed where the drafts it can expect pay
    /// for its follows ([`Batch::head_follows`]).
    eagle_records: [u64; RECORDS],
    /// The Medusa heads' costs (by rows), and their number (the most drafts they guess; 0:
    /// none loaded).
    medusa_costs: PassCosts,
    medusa_heads: usize,
    /// Their tree's paths (ranks per head: [`Medusa::choices`]; none: first guesses alone).
    medusa_choices: Vec<Vec<usize>>,
    /// Siblings beside each depth of the EAGLE head's chains (0: chains alone).
    eagle_siblings: usize,
    /// (made with the first sampled request: the target's; the draft model's with the first
    /// that drafts with it)
    readback: Option<Readback>,
    draft_readback: Option<Readback>,
    /// Events not yet returned by [`step`].
    events: Vec<(SeqId, BatchEvent)>,
}

impl Batch {
    pub(super) fn new(pool: usize) -> Batch {
        Batch {
            pool: Pool::new(pool),
            draft_pool: Pool::new(0),
            draft_costs: PassCosts::default(),
            draft_used: false,
            head_costs: PassCosts::default(),
            head_used: false,
            follow_costs: PassCosts::default(),
            follows: 0,
            firsts_pending: Vec::new(),
            eagle_records: [0; RECORDS],
            medusa_costs: PassCosts::default(),
            medusa_heads: 0,
            medusa_choices: Vec::new(),
            eagle_siblings: 0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 0,
            limits: BatchLimits::default(),
            ngram_branches: (1, TREE_BRANCHES),
            share_prefixes: true,
            status: BatchStatus::default(),
            costs: PassCosts::default(),
            acceptance: [[Tally::default(); RECORDS]; 4],
            readback: None,
            draft_readback: None,
            events: Vec::new(),
        }
    }

    /// A pool of `pool` pages, all free (while no sequence runs: none holds any).
    pub(super) fn resize(&mut self, pool: usize) {
        debug_assert!(self.running.is_empty());
        self.pool = Pool::new(pool);
    }

    /// Forgets the prefix cache: a one-sequence pass is about to write the pool's first pages
    /// as its own cache (only while no sequence runs: their pages would be written too).
    pub(super) fn forget_prefixes(&mut self) {
        self.pool.forget_all();
    }

    /// A drafter changes (the batch idle: `kind`'s base, the draft model, the EAGLE head or the
    /// Medusa heads): what was measured of the old one goes with it, its acceptance records
    /// across requests and its costs (fixed ones stay: [`FixedCosts`]), and the draft model's
    /// read-back words. (A head is judged by its own drafts: one that guessed badly kept the
    /// next from drafting at all.)
    pub(super) fn forget_drafter(&mut self, kind: DraftKind) {
        debug_assert!(self.is_idle());
        // (its index in `acceptance`: Drafting::drafter's)
        let drafter = match kind.base() {
            DraftKind::Model => {
                self.draft_readback = None;
                self.draft_costs.forget();
                1
            }
            DraftKind::Eagle => {
                self.head_costs.forget();
                self.follow_costs.forget();
                self.eagle_records = [0; RECORDS];
                2
            }
            DraftKind::Medusa => {
                self.medusa_costs.forget();
                3
            }
            _ => return,
        };
        self.acceptance[drafter] = Default::default();
    }

    /// Whether no request is waiting or running.
    pub(super) fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Fixes the target's and the EAGLE head's costs the plans take ([`FixedCosts`]), or
    /// (none) has them measured again from the next pass.
    pub(super) fn fix_costs(&mut self, costs: Option<FixedCosts>) {
        self.costs.fix(costs.map(|c| (c.pass - c.row, c.row)));
        self.head_costs.fix(costs.map(|c| (c.head_pass, c.head_step)));
        self.follow_costs.fix(costs.map(|c| (c.follow, c.follow_row)));
    }

    pub(super) fn status(&self) -> BatchStatus {
        BatchStatus {
            running: self.running.len(),
            waiting: self.waiting.len(),
            pages_used: self.pool.held(),
            pages_free: self.pool.available(),
            pages_cached: self.pool.cached(),
            head_follows: self.follows,
            measured_costs: self.measured_costs(),
            ..self.status
        }
    }

    /// The costs the plans take now, as [`FixedCosts`] ([`BatchStatus::measured_costs`]).
    fn measured_costs(&self) -> Option<FixedCosts> {
        let fit = self.costs.fit()?;
        let most = self.costs.by_rows.iter().rposition(Option::is_some).filter(|&r| r > 1)?;
        let row = (fit.seconds(most) - fit.seconds(1)) / (most - 1) as f64;
        let (follow, follow_row) = self.follow_costs.estimate().unwrap_or_default();
        let (head_pass, head_step) = self.head_costs.estimate().unwrap_or_default();
        Some(FixedCosts { pass: fit.seconds(1), row, follow, follow_row, head_pass, head_step })
    }

    /// Queues a request whose prompt and parameters are checked
    /// ([`Engine::batch_submit`](super::Engine::batch_submit)).
    /// (`after`: the first choice of its request, whose prompt it waits for.)
    pub(super) fn submit(
        &mut self,
        prompt: Vec<u32>,
        req: &Request,
        draft: DraftKind,
        after: Option<SeqId>,
    ) -> SeqId {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        let ngram = |branches: usize| NGram { branches, ..NGram::default() };
        let source = match draft.base() {
            DraftKind::Ngram => Some(Source::NGram(ngram(self.ngram_branches.0))),
            DraftKind::Model => Some(Source::Model { pages: Vec::new(), past: 0 }),
            DraftKind::Eagle => Some(Source::Eagle { past: 0, row: None, idle: 0.0 }),
            DraftKind::Medusa => Some(Source::Medusa { row: None }),
            _ => None,
        };
        // (an EAGLE chain is at most its deepest tree; Medusa guesses a token per head)
        let most = match draft.base() {
            DraftKind::Eagle => MAX_EAGLE_DEPTH,
            DraftKind::Medusa => MAX_MEDUSA_HEADS,
            _ => MAX_BATCH - 1,
        };
        let drafting = source.map(|source| Drafting {
            source,
            ngram: draft.is_ensemble().then(|| ngram(self.ngram_branches.1)),
            k_max: req.draft_k.unwrap_or(req.max_draft_k).min(most),
            fixed: req.draft_k.is_some(),
        });
        let stats = SpecStats { draft, base: crate::generation::Stats::default(), ..SpecStats::default() };
        let root = if self.share_prefixes { 0 } else { OWN_ROOT | after.unwrap_or(id).0 };
        let text = TextStream::new(&req.stop, &prompt);
        self.waiting.push_back(Seq {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            n_past: 0,
            pages: Vec::new(),
            cached_pages: 0,
            entry: root,
            root,
            cached_tokens: None,
            after,
            max_tokens: req.max_tokens,
            ignore_eos: req.ignore_eos,
            from_draft: Vec::new(),
            text,
            drafting,
            tally: [Tally::default(); RECORDS],
            sampling: req.sampling(),
            draw: None,
            draft_draw: None,
            stats,
            admitted: None,
            first_token: None,
        });
        id
    }

    /// Takes a request out, waiting or running, its pages back to the pool; false if it is not
    /// there (it ended).
    pub(super) fn cancel(&mut self, id: SeqId) -> bool {
        if let Some(mut s) = self.waiting.iter().position(|s| s.id == id).and_then(|i| self.waiting.remove(i))
        {
            self.leave(&mut s);
            return true;
        }
        match self.running.iter().position(|s| s.id == id) {
            Some(i) => {
                let mut s = self.running.remove(i);
                self.leave(&mut s);
                true
            }
            None => false,
        }
    }

    /// A sequence leaves the batch for good: its pages go back, and with the last sequence of a
    /// request's own root (`--no-prefix-sharing`) the pages cached from that root, which nothing
    /// else can find, are forgotten (free, not idle).
    fn leave(&mut self, s: &mut Seq) {
        self.give_back(s);
        if s.root != 0 && !self.running.iter().chain(&self.waiting).any(|o| o.root == s.root) {
            self.pool.forget_from(s.root);
        }
    }

    /// One sequence's share of a follow shared by `followed` sequences, in seconds: the follow's
    /// fixed seconds shared, and a row's (none: not measured yet).
    fn follow_seconds(&self, followed: f64) -> Option<f64> {
        self.follow_costs.estimate().map(|(a, b)| a / followed + b)
    }

    /// What a new sequence's following would be paid in and cost, in tokens, in a decoding
    /// pass of the running sequences and the new one (its tokens per second the exchange
    /// rate): a first EAGLE draft's row (the head's follow ranked it), the sequence's share of
    /// a follow (as if the head followed every EAGLE sequence running: shared by the followed
    /// ones alone, one the head stopped following left the next request the whole follow to
    /// pay, and it went unfollowed too), and a row of the head's pass (over its prompt); none:
    /// not measured yet. (The prices of the latest pass, a prompt's included, decided it
    /// before: a pass of 20 prompt rows priced a draft at a fifth of a decoding pass's price,
    /// and the head followed a request for 21 passes whose drafts did not pay.)
    fn follow_prices(&self) -> Option<(f64, f64, f64)> {
        let fit = self.costs.fit()?;
        let (_, follow_row) = self.follow_costs.estimate()?;
        let n = self.running.len() + 1;
        let pace = n as f64 / fit.seconds(n);
        let eagle = self.running.iter().filter(|s| s.drafting.as_ref().is_some_and(Drafting::is_eagle));
        let follow = self.follow_seconds(eagle.count() as f64 + 1.0)?;
        Some(((fit.seconds(n + 1) - fit.seconds(n)) * pace, follow * pace, follow_row * pace))
    }

    /// Whether the EAGLE head should follow a new sequence drafting with it, which wants
    /// `wanted` tokens more and whose `prompt` rows the head would run first: a fixed K's
    /// always; an adaptive one's where the first drafts it can expect pay for its follows
    /// ([`Batch::follow_prices`]): per pass, the surplus over a draft's price of each record's
    /// acceptance across the batch, weighed by how often first drafts fell in it, reaches the
    /// price of a follow and of the prompt's rows spread over a pass a token; nothing priced or
    /// measured yet: it follows, and measures. Each record's acceptance is what a new
    /// sequence's first draft is judged by ([`Tally::bound`], its mean while the record is
    /// young): judged by the mean of a grown record, a sequence was followed where its drafts
    /// were never taken (at a row of 22 % of a pass, its bound below the price and the mean
    /// above: every request paid 7 follows for nothing). (A young record's mean keeps a few early
    /// rejected drafts from leaving every later sequence unfollowed, and from measuring more.)
    /// Followed, it pays the head's pass over its prompt and over its kept rows each pass; on
    /// lavapipe each pass's ranking of the first draft costs a fifth of a target pass, and with
    /// SmolLM2-135M's head one first draft in ten was likely enough to pay a row.
    fn head_follows(&self, d: &Drafting, (wanted, prompt): (usize, usize)) -> bool {
        let seen = self.eagle_records.iter().sum::<u64>();
        let (Some((price, follow, row)), false, 1..) = (self.follow_prices(), d.fixed, seen) else {
            return true;
        };
        let follow = follow + row * prompt as f64 / wanted.max(1) as f64;
        let surplus: f64 = (self.acceptance[d.drafter()].iter().zip(&self.eagle_records))
            .map(|(t, &n)| n as f64 / seen as f64 * (Tally::bound((0, 0), t.first) - price).max(0.0))
            .sum();
        surplus >= follow
    }

    /// Admits waiting sequences, oldest first, while there is a place (each running sequence
    /// has a row of every pass) and the pool holds their tokens and the position after them
    /// (within the context): in arrival order among the running ones, so a preempted sequence
    /// comes back older than those that arrived after it. A later choice of a request whose
    /// first choice's prompt is not computed yet lets those after it pass. The whole pages of its
    /// tokens before the newest that the prefix cache holds are its first pages, already computed
    /// (for a sequence drafting with the EAGLE head, those whose head part is computed too: the
    /// head runs on the target's features of every position).
    fn admit(&mut self, context: usize) {
        // (a sequence the EAGLE head will not follow decodes plainly: its whole prompt runs, any
        // cached page serves it)
        let places = self.limits.max_seqs.min(self.limits.max_rows).clamp(1, MAX_BATCH);
        let mut at = 0;
        while self.running.len() < places {
            let Some(s) = self.waiting.get(at) else { break };
            // (a later choice of a request whose prompt is being computed lets others pass)
            if s.after.is_some_and(|first| self.prompt_pending(first)) {
                at += 1;
                continue;
            }
            let mut found = self.pool.lookup(s.root, &s.tokens, (s.tokens.len() - 1) / KV_PAGE);
            // (found pages lie below the newest token: the token after each is known)
            let with_head = (found.iter().enumerate())
                .take_while(|&(i, &(page, _))| self.pool.head_found(page, s.tokens[(i + 1) * KV_PAGE]))
                .count();
            // (a waiting sequence's follows start afresh; the head's prompt rows: those before
            // its newest token that the cache has no head part of)
            let head_rows = (s.tokens.len() - 1).saturating_sub(with_head * KV_PAGE);
            let wanted = s.max_tokens.saturating_sub(s.generated());
            let eagle = s
                .drafting
                .as_ref()
                .is_some_and(|d| d.is_eagle() && self.head_follows(d, (wanted, head_rows)));
            if eagle {
                found.truncate(with_head);
            }
            let need = Seq::pages_for((s.tokens.len() + 1).min(context)).saturating_sub(found.len());
            let idle_found = found.iter().filter(|&&(p, _)| self.pool.is_idle(p)).count();
            if need > self.pool.available() - idle_found {
                break;
            }
            let Some(mut s) = self.waiting.remove(at) else { break };
            for &(page, _) in &found {
                self.pool.hold(page);
            }
            s.pages = found.iter().map(|&(page, _)| page).collect();
            s.pages.extend((0..need).filter_map(|_| self.pool.take()));
            (s.cached_pages, s.entry) = (found.len(), found.last().map_or(s.root, |&(_, e)| e));
            s.n_past = found.len() * KV_PAGE;
            if let Some(Drafting { source: Source::Eagle { past, idle, .. }, .. }) = &mut s.drafting {
                *past = s.n_past;
                if !eagle {
                    *idle = EAGLE_PATIENCE as f64;
                }
            }
            self.status.cached_tokens += s.n_past as u64;
            s.cached_tokens.get_or_insert(s.n_past.min(s.prompt_len));
            s.admitted.get_or_insert_with(Instant::now);
            let at = self.running.partition_point(|r| r.id < s.id);
            self.running.insert(at, s);
        }
    }

    /// Whether request `id` waits, or runs with prompt positions (but its newest) not computed.
    fn prompt_pending(&self, id: SeqId) -> bool {
        self.waiting.iter().any(|s| s.id == id)
            || self.running.iter().any(|s| s.id == id && s.n_past + 1 < s.prompt_len)
    }

    /// Makes the draws of running sampled sequences that have none yet (at their admission: a
    /// waiting request holds no GPU memory), on the draft model too where they draft with it.
    fn make_draws(&mut self, target: &Model, draft: Option<&Model>) {
        for s in self.running.iter_mut().filter(|s| !s.sampling.is_greedy()) {
            if s.draw.is_none() {
                let readback = self.readback.get_or_insert_with(|| Readback::new(target));
                s.draw = Some(draw_ops(target, readback, &s.sampling));
            }
            let model = matches!(s.drafting, Some(Drafting { source: Source::Model { .. }, .. }));
            if let (Some(dm), true, None) = (draft, model, &s.draft_draw) {
                let readback = self.draft_readback.get_or_insert_with(|| Readback::new(dm));
                s.draft_draw = Some(draw_ops(dm, readback, &s.sampling));
            }
        }
    }

    /// Gives running sequence `i` pages up to position `end` (exclusive), preempting the
    /// youngest others while the pool has none left; false if it could not (then it holds what
    /// it had).
    fn grow(&mut self, i: usize, end: usize) -> bool {
        while self.running[i].pages.len() < Seq::pages_for(end) {
            match self.pool.take() {
                Some(p) => self.running[i].pages.push(p),
                None if self.running.len() > i + 1 => self.preempt_youngest(),
                None => return false,
            }
        }
        true
    }

    /// Gives running sequence `i` free pages up to position `end` (exclusive), as far as there
    /// are free ones.
    fn take_free(&mut self, i: usize, end: usize) {
        while self.running[i].pages.len() < Seq::pages_for(end) {
            let Some(p) = self.pool.take() else { return };
            self.running[i].pages.push(p);
        }
    }

    /// The youngest running sequence gives its pages back and waits in the queue ahead of every
    /// younger one (at its head, but for a later choice of an older request still waiting for
    /// its first's prompt), to run all its tokens again.
    fn preempt_youngest(&mut self) {
        if let Some(mut s) = self.running.pop() {
            self.give_back(&mut s);
            (s.n_past, s.cached_pages, s.entry) = (0, 0, s.root);
            // (ahead of every younger one: a later choice that waited may be older)
            let at = self.waiting.partition_point(|w| w.id < s.id);
            self.waiting.insert(at, s);
            self.status.preemptions += 1;
        }
    }

    /// A sequence leaving the running ones gives its pages back: the target's, and the draft
    /// model's or the EAGLE head's (which then holds none of its positions).
    fn give_back(&mut self, s: &mut Seq) {
        self.pool.release(&mut s.pages);
        match s.drafting.as_mut().map(|d| &mut d.source) {
            Some(Source::Model { pages, past }) => {
                self.draft_pool.release(pages);
                *past = 0;
            }
            Some(Source::Eagle { past, row, idle }) => (*past, *row, *idle) = (0, None, 0.0),
            Some(Source::Medusa { row }) => *row = None,
            _ => {}
        }
    }
}

/// Runs one pass of the batch on `target`: admits what fits, ends the sequences that are done,
/// plans every running sequence's rows, runs them, commits. Returns each request's events since
/// the last call, in order (nothing when the batch is idle). An error of the pass itself (the
/// GPU) is returned before anything is committed: every running sequence stays where it was,
/// and the events made before the pass come with the next call.
pub(super) async fn step(
    batch: &mut Batch,
    target: &mut Model,
    drafters: Drafters<'_>,
    tokenizer: &Tokenizer,
) -> Result<Vec<(SeqId, BatchEvent)>> {
    let Drafters { model: draft, eagle: mut head, medusa, eagle_siblings } = drafters;
    batch.eagle_siblings = eagle_siblings;
    if batch.costs.groups.is_empty() {
        // (G(R) of the passes' costs: the target's matmul row groups; its device never changes)
        let gpu = target.gpu();
        batch.costs.groups = (0..=MAX_BATCH).map(|n| gpu.matmul_row_groups(n) as f64).collect();
    }
    let draft_pages = draft.as_ref().map_or(0, |d| d.kv_pages());
    let pages = target.kv_pages();
    batch.medusa_heads = medusa.map_or(0, |m| m.heads().config.heads);
    if medusa.map_or(&[][..], Medusa::choices) != batch.medusa_choices {
        batch.medusa_choices = medusa.map_or(Vec::new(), |m| m.choices().to_vec());
    }
    let head_pages = head.as_ref().map_or(pages, |h| h.kv_pages());
    if batch.pool.len() != pages || batch.draft_pool.len() != draft_pages || head_pages != pages {
        // (waiting sequences hold no pages)
        if !batch.running.is_empty() {
            return Err(Error::InvalidArgument("a KV cache pool changed under a running batch".into()));
        }
        batch.resize(pages);
        batch.draft_pool = Pool::new(draft_pages);
        // (the head's pool follows the target's: page ids are shared)
        if let Some(h) = head.as_deref_mut().filter(|h| h.kv_pages() != pages) {
            h.set_kv_pages(target, pages)?;
        }
    }
    // (the first drafts of the head's latest follow, before anything is admitted or planned)
    match head.as_deref() {
        Some(h) => propose::take_firsts(batch, h).await,
        None => batch.firsts_pending.clear(),
    }
    let context = target.context();
    batch.admit(context);
    end_spent(batch, context, tokenizer);
    batch.admit(context);
    batch.make_draws(target, draft.as_deref());
    let mut plan = plan(batch, context);
    if let Some(d) = draft {
        propose::propose(batch, d, &mut plan).await?;
    }
    if let Some(h) = head.as_deref_mut() {
        propose::propose_eagle(batch, h, &mut plan).await?;
    }
    if let Some(m) = medusa {
        propose::propose_medusa(batch, m, &mut plan).await?;
    }
    place_drafts(batch, &mut plan);
    if !plan.is_empty() {
        // (a pass that fails has written over the target's hidden states, which the Medusa
        // heads read)
        let checked = match run(batch, target, &plan).await {
            Ok(out) => outcomes(batch, &plan, &out, target.config.vocab_size),
            Err(e) => Err(e),
        };
        let outcomes =
            checked.inspect_err(|_| propose::forget_rows(batch, |d| d.is_medusa() || d.is_eagle()))?;
        let before = propose::before_commit(batch, &plan, &outcomes);
        let kept = apply(batch, &plan, outcomes, tokenizer);
        let trees: Vec<(&[u32], usize, &[usize])> =
            kept.iter().map(|(pages, root, path)| (&pages[..], *root, &path[..])).collect();
        target.keep_paths_in_pages(&trees)?;
        if let Some(h) = head {
            // (timed by reading its first drafts at once; a failure shows in the next pass)
            let timed = batch.follows.is_multiple_of(FOLLOW_TIMED) || batch.follow_costs.line().is_none();
            let t0 = Instant::now();
            let rows = propose::follow(batch, h, &before);
            if rows > 0 {
                batch.follows += 1;
                batch.status.head_follow_rows += rows as u64;
                if timed {
                    propose::take_firsts(batch, h).await;
                    batch.follow_costs.observe(rows, t0.elapsed().as_secs_f64());
                }
            }
        }
        propose::medusa_rows(batch, &before);
    }
    Ok(std::mem::take(&mut batch.events))
}

/// Ends the running sequences that have their tokens (`max_tokens`, which may be 0) or reached
/// the context's end (a preempted one may come back there), as the one-sequence loop does before
/// a cycle.
fn end_spent(batch: &mut Batch, context: usize, tokenizer: &Tokenizer) {
    let mut i = 0;
    while i < batch.running.len() {
        let s = &batch.running[i];
        let decoding = s.n_past + 1 == s.tokens.len();
        if s.generated() >= s.max_tokens || (decoding && s.n_past >= context) {
            let s = batch.running.remove(i);
            finish(batch, s, FinishReason::Length, tokenizer);
            continue;
        }
        i += 1;
    }
}

/// Records and runs the pass of `plan` and reads back what the commits need; counts it.
async fn run(batch: &mut Batch, target: &mut Model, plan: &[Rows]) -> Result<Readout> {
    // each sequence's rows: its tokens not yet run, then its drafts
    let rows: Vec<Vec<u32>> = (plan.iter())
        .map(|r| {
            let s = &batch.running[r.seq];
            s.tokens[s.n_past..s.n_past + r.run].iter().chain(&r.drafts).copied().collect()
        })
        .collect();
    let masks: Vec<Option<Vec<u32>>> =
        plan.iter().map(|r| r.tree.as_ref().map(TokenTree::ancestors)).collect();
    let seqs: Vec<SeqRows> = (plan.iter().zip(&rows).zip(&masks))
        .map(|((r, tokens), tree)| {
            let s = &batch.running[r.seq];
            // (a pending sequence's newest token and drafts want logits, a prompt's chunk none)
            let logits = if r.pending { 1 + r.drafts.len() } else { 0 };
            SeqRows { pages: &s.pages, start_pos: s.n_past, tokens, tree: tree.as_deref(), logits }
        })
        .collect();
    let enc = target.encode_pages(&seqs, true)?;
    let n = rows.iter().map(Vec::len).sum::<usize>();
    let logits = seqs.iter().map(|s| s.logits).sum::<usize>();
    let t0 = Instant::now();
    let out = run_pass(batch, target, enc, plan).await?;
    // (the costs drafts are judged by: passes whose rows all want logits, as a draft's row does;
    // a prompt chunk's rows skip the output projection, and their cheaper passes made a draft's
    // row look cheaper than it is)
    if logits == n {
        batch.costs.observe(n, t0.elapsed().as_secs_f64());
    }
    batch.status.passes += 1;
    batch.status.rows += n as u64;
    batch.status.drafts += plan.iter().map(|r| r.drafts.len() as u64).sum::<u64>();
    for r in plan.iter().filter(|r| r.pending) {
        batch.status.k[r.drafts.len().min(8)] += 1;
        batch.status.trees += r.tree.is_some() as u64;
    }
    Ok(out)
}

/// What a pass gave one sequence.
enum Outcome {
    /// A prompt chunk ran: nothing to commit.
    Prefilled,
    /// Its drafts verified by the choices (argmax, or draws) of its newest token's row and its
    /// drafts' rows.
    Chosen(Verdict),
    /// A logit of its row at this position is not finite (a sampled request: it fails alone).
    NonFinite(usize),
}

/// What a sequence's choices keep of its drafts: the drafts accepted (a chain's first ones, or
/// the nodes of its tree's accepted path after the root), the choices along them (the newest
/// token's row's, then each accepted draft's: the last is the token after them), the drafts'
/// outcomes ([`Tally`]), and a tree's accepted
/// path (node indices from the root) to keep in its pages.
#[derive(Debug)]
struct Verdict {
    kept: Vec<u32>,
    choices: Vec<u32>,
    tally: Tally,
    path: Option<Vec<usize>>,
}

/// Drafts' outcomes as the costs judge them: each first child of a node reached (a chain's
/// next draft) kept or rejected, and each later sibling tried where those before it were
/// rejected, kept or rejected. (A tree's depth counted kept where any of its nodes was would
/// credit a first child with its siblings' acceptance, and its siblings again.)
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Tally {
    first: (usize, usize),
    later: (usize, usize),
}

impl Tally {
    /// The tally of a tree's verified `path` (from its root; the nodes after it rejected).
    fn of_path(tree: &TokenTree, path: &[usize]) -> Tally {
        let mut t = Tally::default();
        Tally::tried(tree, path).iter().for_each(|(_, _, one)| t.add(one));
        t
    }

    /// [`Tally::of_path`] by node: each child of the path's nodes tried (in the tree's order, up
    /// to the one kept), whether it is its parent's first, and its outcome.
    fn tried(tree: &TokenTree, path: &[usize]) -> Vec<(usize, bool, Tally)> {
        let mut tried = Vec::new();
        for (i, &n) in path.iter().enumerate() {
            for (rank, child) in tree.children(n).enumerate() {
                let kept = path.get(i + 1) == Some(&child);
                let outcome = (kept as usize, !kept as usize);
                let t = match rank {
                    0 => Tally { first: outcome, later: (0, 0) },
                    _ => Tally { first: (0, 0), later: outcome },
                };
                tried.push((child, rank == 0, t));
                if kept {
                    break;
                }
            }
        }
        tried
    }

    fn add(&mut self, other: &Tally) {
        self.first = (self.first.0 + other.first.0, self.first.1 + other.first.1);
        self.later = (self.later.0 + other.later.0, self.later.1 + other.later.1);
    }

    /// A lower bound (the mean less one standard deviation) of the share kept among `own`'s
    /// (kept, rejected) counted after `pooled`'s (its drafter's across the batch; from 1/2
    /// before any), which weigh as 2 and up to 16 more as they are measured. A mean from a few
    /// dozen drafts, taken where it looks best, overstated what drafts kept. While the record
    /// counts fewer than [`YOUNG`] drafts, the mean ([`Tally::young`]).
    fn bound(own: (usize, usize), pooled: (usize, usize)) -> f64 {
        let (mean, reached) = Tally::mean(own, pooled);
        if Tally::young(own, pooled) {
            return mean;
        }
        (mean - (mean * (1.0 - mean) / (reached + 1.0)).sqrt()).max(0.0)
    }

    /// Whether a record's drafts across the batch are too few to bound it below: its drafts
    /// are then judged by their mean, so that they get tried. (Bounded from nothing, 0.21, a
    /// draft never paid a row of 22 % of a pass, as on lavapipe: no record ever grew, and the
    /// EAGLE head, whose follows are judged by the same records, followed requests that it
    /// never drafted for.)
    fn young(own: (usize, usize), pooled: (usize, usize)) -> bool {
        // (the batch's counts a sequence's own: the larger of the two)
        (own.0 + own.1).max(pooled.0 + pooled.1) < YOUNG
    }

    /// [`Tally::bound`] of a record whose drafts a sequence tries few of, judged mostly by its
    /// drafter's across the batch (an EAGLE sibling's by its probability, [`sibling_record`]):
    /// less one standard deviation of a share of all the drafts `pooled` counts, not of their
    /// capped weight. (With that weight, siblings of 0.02-0.1, kept 9 % of the time, counted as
    /// 2 %: none was taken where a row cost 2 % of a pass, and SmolLM2's head at 1 request kept
    /// fewer drafts than judging all siblings as one.)
    fn pooled_bound(own: (usize, usize), pooled: (usize, usize)) -> f64 {
        let (mean, _) = Tally::mean(own, pooled);
        if Tally::young(own, pooled) {
            return mean;
        }
        let drafts = (pooled.0 + pooled.1) as f64 + 2.0;
        (mean - (mean * (1.0 - mean) / (drafts + 1.0)).sqrt()).max(0.0)
    }

    /// The share kept among `own`'s (kept, rejected) counted after `pooled`'s, as
    /// [`Tally::bound`] weighs them, and the drafts it weighs as.
    fn mean((kept, rejected): (usize, usize), (p_kept, p_rejected): (usize, usize)) -> (f64, f64) {
        let prior = (p_kept as f64 + 1.0) / ((p_kept + p_rejected) as f64 + 2.0);
        let weight = ((p_kept + p_rejected).min(16) + 2) as f64;
        let reached = (kept + rejected) as f64 + weight;
        ((kept as f64 + weight * prior) / reached, reached)
    }
}

impl Verdict {
    /// The verdict of `choices` (one per row from the newest token's) on `r`'s drafts: a chain's
    /// drafts the choices agree with, a tree's path by the greedy rule (given draws, the sampling
    /// rule for deterministic drafts: [`TokenTree::verify_greedy`]).
    fn of(r: &Rows, choices: &[u32]) -> Result<Verdict> {
        let Some(tree) = &r.tree else {
            let accepted = r.drafts.iter().zip(choices).take_while(|(d, o)| d == o).count();
            let first = (accepted, (accepted < r.drafts.len()) as usize);
            return Ok(Verdict {
                kept: r.drafts[..accepted].to_vec(),
                choices: choices[..=accepted].to_vec(),
                tally: Tally { first, later: (0, 0) },
                path: None,
            });
        };
        let v = tree.verify_greedy(choices)?;
        Ok(Verdict {
            kept: v.path[1..].iter().map(|&n| tree.tokens()[n]).collect(),
            choices: v.path.iter().map(|&n| choices[n]).collect(),
            tally: Tally::of_path(tree, &v.path),
            path: Some(v.path),
        })
    }
}

/// Every plan entry's outcome, checked before anything is committed: a choice outside the
/// vocabulary is the GPU's error.
fn outcomes(batch: &Batch, plan: &[Rows], out: &Readout, vocab: usize) -> Result<Vec<Outcome>> {
    // (the pass's rows with logits: each pending sequence's newest token's and drafts')
    let mut at = 0;
    let mut all = Vec::with_capacity(plan.len());
    for (i, r) in plan.iter().enumerate() {
        let s = &batch.running[r.seq];
        if !r.pending {
            all.push(Outcome::Prefilled);
            continue;
        }
        let rows = at..at + 1 + r.drafts.len();
        at = rows.end;
        let choices: Vec<u32> = match (&s.draw, out) {
            (Some(_), Readout::Draws(w)) => {
                // (the flag: 1 + the last row with logits with a non-finite one; at its
                // sequence's newest token's row plus)
                if let Some(row) = w[FLAGS_AT + i].checked_sub(1) {
                    let mut at = r.run - 1 + (row as usize).saturating_sub(rows.start);
                    // (a tree's node: at its root's position plus its depth)
                    if let Some(t) = r.tree.as_ref().filter(|_| at >= r.run) {
                        at = r.run - 1 + t.depth(at + 1 - r.run);
                    }
                    all.push(Outcome::NonFinite(s.n_past + at));
                    continue;
                }
                w[DRAWS_AT + rows.start..DRAWS_AT + rows.end].to_vec()
            }
            (_, Readout::Draws(w)) => w[rows].to_vec(),
            (_, Readout::Argmax(a)) => a[rows].to_vec(),
        };
        if let Some(&bad) = choices.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Gpu(format!("the GPU chose token {bad} of a vocabulary of {vocab}")));
        }
        all.push(Outcome::Chosen(Verdict::of(r, &choices)?));
    }
    Ok(all)
}

/// A tree's accepted path to keep in its sequence's pages: the pages, the root's position, the
/// path ([`Model::keep_paths_in_pages`]).
type Kept = (Vec<u32>, usize, Vec<usize>);

/// Commits each sequence's outcome and ends the sequences that are done. Returns the trees'
/// paths to keep (a pass's rows read the sequences' pages only after they are kept).
fn apply(batch: &mut Batch, plan: &[Rows], outcomes: Vec<Outcome>, tokenizer: &Tokenizer) -> Vec<Kept> {
    let mut ended = Vec::new();
    let mut kept = Vec::new();
    for (r, outcome) in plan.iter().zip(outcomes) {
        let s = &mut batch.running[r.seq];
        s.stats.base.target_forwards += 1;
        let end = match outcome {
            Outcome::Prefilled => {
                s.n_past += r.run;
                None
            }
            Outcome::NonFinite(pos) => {
                let e = Error::NonFinite(format!("a logit of the row at position {pos} is not finite"));
                batch.events.push((s.id, BatchEvent::Failed(e)));
                Some(FinishReason::Cancelled)
            }
            Outcome::Chosen(v) => {
                if let Some(d) = s.drafting.as_ref().filter(|_| !r.drafts.is_empty()) {
                    for (record, t) in r.tallies(&v) {
                        batch.acceptance[d.drafter()][record].add(&t);
                    }
                }
                if let Some(path) = &v.path {
                    kept.push((s.pages.clone(), s.n_past + r.run - 1, path.clone()));
                }
                commit(s, r, &v, tokenizer, &mut batch.events)
            }
        };
        if !matches!(end, Some(FinishReason::Cancelled)) {
            cache_pages(&mut batch.pool, s);
        }
        if let Some(reason) = end {
            ended.push((r.seq, reason));
        }
    }
    // (the plan's sequences ascend: removing from the last keeps the others' indices)
    for &(i, reason) in ended.iter().rev() {
        let s = batch.running.remove(i);
        finish(batch, s, reason, tokenizer);
    }
    kept
}

/// Caches the sequence's whole pages of committed positions not cached yet.
fn cache_pages(pool: &mut Pool, s: &mut Seq) {
    while (s.cached_pages + 1) * KV_PAGE <= s.n_past {
        let first = s.cached_pages * KV_PAGE;
        s.entry = pool.cache(s.pages[s.cached_pages], s.entry, &s.tokens[first..first + KV_PAGE]);
        s.cached_pages += 1;
    }
}

/// What a pass read back: every row's argmax alone (no sampled request ran), or the batch's
/// result words ([`Readback`]: argmax, draws, flags).
enum Readout {
    Argmax(Vec<u32>),
    Draws(Vec<u32>),
}

impl Readout {
    /// Row `row`'s argmax.
    fn argmax(&self, row: usize) -> u32 {
        match self {
            Readout::Argmax(a) | Readout::Draws(a) => a[row],
        }
    }

    /// Row `row`'s draw (a row some request's draws ran over).
    fn draw(&self, row: usize) -> Option<u32> {
        match self {
            Readout::Draws(w) => Some(w[DRAWS_AT + row]),
            Readout::Argmax(_) => None,
        }
    }
}

/// Runs the pass recorded in `enc`, each pending sampled request's draws from its newest
/// token's row and its drafts' rows after it, and reads back what the commits need in one
/// read-back.
async fn run_pass(
    batch: &Batch,
    target: &Model,
    enc: wgpu::CommandEncoder,
    plan: &[Rows],
) -> Result<Readout> {
    // (rows with logits: each pending sequence's newest token's and drafts')
    let mut first = 0;
    let mut draws = Vec::new();
    for (i, r) in plan.iter().enumerate().filter(|(_, r)| r.pending) {
        let rows = 1 + r.drafts.len();
        if let Some(d) = &batch.running[r.seq].draw {
            draws.push(DrawAt { draw: d, row0: first, rows, slot: i });
        }
        first += rows;
    }
    read_pass(target, batch.readback.as_ref(), enc, &draws, first).await
}

/// Where one request's draws run in a pass: its draws, its first row and rows (of the rows with
/// logits), its flag's slot.
struct DrawAt<'a> {
    draw: &'a Draw,
    row0: usize,
    rows: usize,
    slot: usize,
}

/// Records `draws` (each request's, over its rows of the pass recorded in `enc` on `model`,
/// whose `n` rows with logits they index, into `readback`'s words: the model's) and runs the
/// pass: one read-back of those rows' argmax (none: the pass is waited for), and with draws of
/// their words and each request's non-finite flag (at its slot).
async fn read_pass(
    model: &Model,
    readback: Option<&Readback>,
    mut enc: wgpu::CommandEncoder,
    draws: &[DrawAt<'_>],
    n: usize,
) -> Result<Readout> {
    let g = model.gpu().clone();
    if n == 0 {
        g.submit(enc);
        return model.sync().await.map(|_| Readout::Argmax(Vec::new()));
    }
    let Some(rb) = readback.filter(|_| !draws.is_empty()) else {
        let raw = g.submit_and_read(enc, &model.argmax_buffer().raw, 0, 4 * n as u64).await?;
        return Ok(Readout::Argmax(bytemuck::pod_collect_to_vec(&raw)));
    };
    for &DrawAt { draw: d, row0, rows, slot } in draws {
        g.queue.write_buffer(&d.uniform, 0, bytemuck::bytes_of(&SampleSeed::at(d.seed, row0)));
        g.queue.write_buffer(&d.status.raw, 0, bytemuck::bytes_of(&0u32));
        g.encode(&mut enc, &d.ops, rows as u32);
        enc.copy_buffer_to_buffer(&d.status.raw, 0, &rb.result.raw, 4 * (FLAGS_AT + slot) as u64, 4);
    }
    let word = 4u64;
    enc.copy_buffer_to_buffer(&model.argmax_buffer().raw, 0, &rb.result.raw, 0, n as u64 * word);
    enc.copy_buffer_to_buffer(&rb.draws.raw, 0, &rb.result.raw, DRAWS_AT as u64 * word, n as u64 * word);
    let raw = g.submit_and_read(enc, &rb.result.raw, 0, RESULT_WORDS as u64 * word).await?;
    Ok(Readout::Draws(bytemuck::pod_collect_to_vec(&raw)))
}

/// A sampled request's draws (see [`Draw`]), into `readback`'s shared words.
fn draw_ops(target: &Model, readback: &Readback, params: &SamplingParams) -> Draw {
    let g = &**target.gpu();
    let vocab = target.config.vocab_size;
    let uniform = g.uniform("batch sample seed", bytemuck::bytes_of(&SampleSeed::new(params.seed)));
    let status = GpuBuffer::<u32>::zeros(g, "batch sample status", 1);
    let cfg = target_draws(params, vocab);
    let outs = (&readback.draws, &status);
    let logits = target.logits_buffer();
    let ops = g.sample_into(target.logits_step_buffer(), &uniform, logits, outs, &readback.scratch, cfg);
    Draw { seed: params.seed, uniform, status, ops }
}

/// The rows of the next pass: every decoding sequence's newest token (a new page taken, or the
/// youngest preempted, where it needs one), prompt chunks of sequences still prefilling, then
/// drafts in the rows left. Sequences in running order.
fn plan(batch: &mut Batch, context: usize) -> Vec<Rows> {
    let mut budget = batch.limits.max_rows.clamp(1, MAX_BATCH);
    let mut plan: Vec<Rows> = Vec::new();
    // 1. decoding sequences: one row each (a preemption removes the youngest, so walk by index)
    let mut i = 0;
    while i < batch.running.len() && budget > 0 {
        let s = &batch.running[i];
        if s.n_past + 1 == s.tokens.len() {
            let end = s.n_past + 1;
            if !batch.grow(i, end) {
                // (the youngest itself, and no other to preempt: it waits for pages)
                batch.preempt_youngest();
                break;
            }
            plan.push(Rows::new(i, 1, true));
            budget -= 1;
        }
        i += 1;
    }
    // 2. prompt chunks (their pages were taken at admission); a fixed K's sequence that the
    // EAGLE head follows leaves its newest token to run as a decoding one, with drafts after it
    // (the head drafts from its rows up to the token before), as the one-sequence loop does.
    // (An adaptive K's runs its whole prompt: its first token comes a pass earlier, and the
    // head's pass over the prompt's rows, the token after the last one included, lets it draft
    // from the next; on lavapipe at 8 requests that extra pass was another prompt's 64-row
    // chunk, and the time to the first token of an EAGLE request twice plain's.)
    for (i, s) in batch.running.iter().enumerate() {
        let left = s.tokens.len() - s.n_past;
        if left > 1 && budget > 0 {
            let eagle = s.drafting.as_ref().is_some_and(|d| d.fixed && d.is_followed());
            let run = (left - eagle as usize).min(budget);
            budget -= run;
            plan.push(Rows::new(i, run, run == left));
        }
    }
    draft(batch, &mut plan, budget, context);
    plan.sort_by_key(|r| r.seq);
    plan
}

/// Step 3 of [`plan`]: drafts after the newest tokens in at most `budget` rows, as far as each
/// sequence's pages, the context and its tokens still wanted go: a fixed K's, then one at a time
/// the likeliest where it pays (see the module's doc).
fn draft(batch: &mut Batch, plan: &mut [Rows], mut budget: usize, context: usize) {
    // A draft model's draft costs a target row and its share of a draft pass (the pass's fixed
    // seconds shared by the sequences drafting with it, and a row), its first one also the rows
    // of the tokens the draft has not seen; its proposals are made after this plan (`propose`):
    // placeholders until then.
    // An EAGLE head's draft costs a target row, and past the first (ranked in the head's follow)
    // its share of the head's steps (their fixed seconds shared alike, and a step row's), where
    // the head has run the sequence's last rows.
    // Medusa's: a target row, the first also its row of the heads' runs (every head runs over the
    // rows of the sequences drafting, however many drafts each takes: their line is by rows).
    // (Each share: the fixed seconds of the drafter's line shared by the sequences that can
    // draft with it this pass, and a draft's, or for Medusa a row's.)
    // A drafter that has not run yet costs nothing, but its sequences' adaptive K draft one at
    // most (a probe that measures it); one measured at one count only is taken as all fixed
    // (`PassCosts::estimate`).
    let rooms: Vec<(usize, bool)> = plan.iter().map(|r| room(batch, r, context)).collect();
    let each = |costs: &PassCosts, is: fn(&Drafting) -> bool| {
        let with = |(r, room): &(&Rows, &(usize, bool))| {
            r.pending && room.0 > 0 && room.1 && batch.running[r.seq].drafting.as_ref().is_some_and(is)
        };
        let drafting = plan.iter().zip(&rooms).filter(with).count().max(1) as f64;
        costs.estimate().map(|(a, b)| a / drafting + b)
    };
    let model_draft = each(&batch.draft_costs, Drafting::is_model);
    let head_draft = each(&batch.head_costs, Drafting::is_eagle);
    let medusa_row = each(&batch.medusa_costs, Drafting::is_medusa);
    let bd = batch.draft_costs.estimate().map_or(0.0, |(_, b)| b);
    let mut adaptive: Vec<Candidate> = Vec::new();
    // the pass's expected tokens: each newest token's, each fixed draft's; the drafters' seconds
    let (mut tokens, mut drafting) = (0.0, 0.0);
    let mut eagle_records = [0; RECORDS];
    for (i, r) in plan.iter_mut().enumerate().filter(|(_, r)| r.pending) {
        tokens += 1.0;
        let s = &batch.running[r.seq];
        let Some(d) = &s.drafting else { continue };
        let (k, ready) = rooms[i];
        if k == 0 {
            continue;
        }
        // (a fixed K's tree: the one-sequence loop's nodes; an adaptive one's: as many as pay)
        let room = room_for_nodes(s, r, context);
        let nodes = if d.fixed { tree_nodes(k).min(room) } else { room };
        // (a drafter's proposal: a chain, or a tree's shape; an ensemble's with the n-gram's
        // continuations beside it)
        let ((shape, cost, first), merged) = match &d.source {
            // (an ensemble whose drafter cannot draft yet drafts the n-gram's continuations)
            _ if !ready => {
                let shape = d
                    .ngram
                    .as_ref()
                    .map_or(Shape::Chain(Vec::new()), |ngram| ngram_alone(ngram, &s.tokens, k, nodes));
                ((shape, Some(0.0), 0.0), None)
            }
            Source::NGram(ngram) => ((ngram_shape(ngram, &s.tokens, k, nodes), Some(0.0), 0.0), None),
            Source::Model { past, .. } => {
                // (all of them: spread over the tokens still wanted, the draft caught up for a
                // few drafts cost more than plain batching on lavapipe's Qwen pair at 4 requests)
                let unseen = s.tokens.len() - (*past).min(s.tokens.len() - 1);
                ((Shape::Chain(vec![0; k]), model_draft, bd * (unseen - 1) as f64), d.ngram.as_ref())
            }
            Source::Eagle { .. } => {
                ((eagle_shape(k, batch.eagle_siblings, nodes), head_draft, 0.0), d.ngram.as_ref())
            }
            Source::Medusa { .. } => {
                let shape = medusa_shape(&batch.medusa_choices, k, nodes);
                ((shape, medusa_row.map(|_| 0.0), medusa_row.unwrap_or(0.0)), d.ngram.as_ref())
            }
        };
        let shape = match merged {
            Some(ngram) => shape.with_ngram(ngram, &s.tokens, (k, nodes), room),
            None => shape,
        };
        r.record = d.record(&s.tokens);
        if ready && d.is_eagle() {
            eagle_records[r.record] += 1;
        }
        let alpha = s.chances(r.record, &batch.acceptance[d.drafter()][r.record]);
        let (mut proposal, gains) = match shape {
            Shape::Chain(chain) => {
                let gains = (1..=chain.len()).map(|i| alpha.0.powi(i as i32)).collect::<Vec<f64>>();
                (chain, gains)
            }
            Shape::Tree(shape) => {
                // (an EAGLE tree's nodes each by the head's probability of it where known: depth
                // 1's from the follow's ranking; deeper, its first draft's record)
                let at = match (&d.source, ready) {
                    (Source::Eagle { row: Some((_, first)), .. }, true) => {
                        let log_probs = Proposed::ranked_log_probs(&shape, std::slice::from_ref(first));
                        let pooled = &batch.acceptance[d.drafter()];
                        eagle_acceptances(s, pooled, &shape, &log_probs, |_| r.record)
                    }
                    _ => vec![alpha; shape.len()],
                };
                let chance = node_chances(&shape, |n| at[n]);
                let p = Proposed::new(shape, (!d.fixed).then_some(&chance[..]));
                let gains = p.order.iter().map(|&n| chance[n]).collect();
                let placeholders = vec![0; p.order.len()];
                r.proposed = Some(p);
                (placeholders, gains)
            }
        };
        // (the drafter's steps the first i + 1 drafts need: a chain's each, a tree's deepest
        // ranked node; an EAGLE sibling or an n-gram node beside a drafter's costs a row alone,
        // and the head's first draft none: its follow ranked it)
        let ranked = usize::from(d.is_eagle());
        let steps: Vec<usize> = match &r.proposed {
            Some(p) => (1..=proposal.len()).map(|i| p.steps(i).saturating_sub(ranked)).collect(),
            None => (1..=proposal.len()).map(|i| i - ranked).collect(),
        };
        // (a drafter not measured yet: an adaptive K's drafts up to the first that needs a step,
        // the probe that measures it)
        if cost.is_none() && !d.fixed {
            proposal.truncate(steps.iter().position(|&n| n > 0).map_or(proposal.len(), |i| i + 1));
        }
        let cost = cost.unwrap_or(0.0);
        if d.fixed {
            r.asked = k;
            r.drafts = proposal.into_iter().take(budget).collect();
            budget -= r.drafts.len();
            tokens += gains[..r.drafts.len()].iter().sum::<f64>();
            if let Some(&n) = r.drafts.len().checked_sub(1).and_then(|last| steps.get(last)) {
                drafting += cost * n as f64 + first;
            }
        } else if !proposal.is_empty() {
            adaptive.push(Candidate { entry: i, proposal, gains, steps, each: cost, first });
        }
    }
    (batch.eagle_records.iter_mut().zip(eagle_records)).for_each(|(seen, n)| *seen += n);
    let rows = plan.iter().map(|r| r.run + r.drafts.len()).sum::<usize>() as f64;
    // (until two row counts are measured the marginal row is unknown: a pass of a count measured
    // already takes one draft, the probe that measures another; the others none)
    let fit = batch.costs.fit();
    let probes = (fit.is_none() && batch.costs.measured(rows as usize)) as usize;
    let known = fit.is_some();
    let planned = Planned { rows, tokens, drafting, measured: batch.costs.average(rows as usize) };
    // (a pass whose row count without its adaptive drafts is stale, measured as every row
    // wants logits, runs without them: it refreshes the count the drafts' costs are told from)
    let refresh = batch.costs.stale(rows as usize) && plan.iter().all(|r| r.pending);
    let adaptive_budget = if refresh { 0 } else { budget };
    let (budget, surplus) = add_adaptive(plan, &adaptive, adaptive_budget, (fit, probes), planned);
    follow_paid(batch, plan, &adaptive, &surplus, (known, budget > 0));
}

/// Counts each EAGLE sequence's follow of this pass against its adaptive K's drafts
/// ([`EAGLE_PATIENCE`]): one follow more, less its drafts' `surplus` (seconds) in a follow's
/// measured seconds (its row's, and its share of a pass's fixed seconds; not measured yet: its
/// drafts pay for them all). Passes whose costs are unknown (`known`), or that drafted nothing
/// where no rows were left or a count was refreshed (`rows_left`), do not count.
fn follow_paid(
    batch: &mut Batch,
    plan: &[Rows],
    adaptive: &[Candidate],
    surplus: &[f64],
    (known, rows_left): (bool, bool),
) {
    let is_eagle =
        |c: &&Candidate| batch.running[plan[c.entry].seq].drafting.as_ref().is_some_and(Drafting::is_eagle);
    let followed = adaptive.iter().filter(is_eagle).count().max(1) as f64;
    let follow = batch.follow_seconds(followed).filter(|&f| f > 0.0);
    for (c, &gained) in adaptive.iter().zip(surplus) {
        let drafted = !plan[c.entry].drafts.is_empty();
        let Some(Drafting { source: Source::Eagle { idle, .. }, .. }) =
            &mut batch.running[plan[c.entry].seq].drafting
        else {
            continue;
        };
        if !(known && (rows_left || drafted)) {
            continue;
        }
        let paid = match follow {
            Some(f) => gained / f,
            None if drafted => EAGLE_PATIENCE as f64,
            None => 0.0,
        };
        *idle = (*idle + 1.0 - paid).max(0.0);
    }
}

/// The most drafts plan entry `r`'s sequence asks after its newest token this pass (its K, as
/// far as the context and its tokens still wanted go; a Medusa one a guess per head), and whether
/// its drafter can draft now (an EAGLE head that has run its last rows; the Medusa heads, its row
/// of the last pass, the position before its newest token).
fn room(batch: &Batch, r: &Rows, context: usize) -> (usize, bool) {
    let s = &batch.running[r.seq];
    let Some(d) = &s.drafting else { return (0, false) };
    let last = s.n_past + r.run; // the position after the newest token
    let remaining = s.max_tokens.saturating_sub(s.generated());
    let k = d.k_max.min(context.saturating_sub(last)).min(remaining.saturating_sub(1));
    match &d.source {
        Source::NGram(_) | Source::Model { .. } => (k, true),
        Source::Eagle { .. } => (k, s.eagle_ready()),
        Source::Medusa { row } => (k.min(batch.medusa_heads), row.is_some() && r.run == 1),
    }
}

/// An adaptive K's sequence in [`draft`]: its plan entry, its proposal, each draft's chance of
/// being accepted (a chain's α^(i+1); see [`node_chances`] for a tree's), the drafter's steps
/// its first i + 1 drafts need, a step's own seconds and its first draft's more (a fixed cost: a
/// draft model's catch-up, a Medusa row).
struct Candidate {
    entry: usize,
    proposal: Vec<u32>,
    gains: Vec<f64>,
    steps: Vec<usize>,
    each: f64,
    first: f64,
}

impl Candidate {
    /// The drafter's seconds of its first `m` drafts (none: 0).
    fn drafting(&self, m: usize) -> f64 {
        let steps = m.checked_sub(1).and_then(|last| self.steps.get(last)).copied().unwrap_or(0);
        self.each * steps as f64 + if m > 0 { self.first } else { 0.0 }
    }
}

/// The most nodes a token tree of plan entry `r`'s sequence may hold after its root: a tree's
/// (its rows' ancestors are one word) within the context (its nodes' keys go to the positions
/// after the root's).
fn room_for_nodes(s: &Seq, r: &Rows, context: usize) -> usize {
    (MAX_TREE - 1).min(context.saturating_sub(s.n_past + r.run))
}

/// A sequence's n-gram proposal below its newest token (the last of `tokens`): with the
/// continuations of several matches (`ngram.branches` > 1) a token tree, `depth` deep and
/// `nodes` nodes after the root at most; with one (or one found) a chain ([`NGram::lookup`]'s).
fn ngram_shape(ngram: &NGram, tokens: &[u32], depth: usize, nodes: usize) -> Shape {
    if ngram.branches < 2 || depth == 0 {
        return Shape::Chain(ngram.lookup(tokens, depth));
    }
    let tree = ngram.lookup_tree(tokens, DraftBudget::tree(depth, nodes.max(depth).min(MAX_TREE - 1)));
    match tree.is_chain() {
        true => Shape::Chain(ngram.lookup(tokens, depth)),
        false => Shape::Tree(tree),
    }
}

/// An ensemble's proposal while its drafter cannot draft (an EAGLE head that has not followed
/// its sequence's last rows, Medusa heads without its row of the last pass): the n-gram's
/// continuations alone (see [`ngram_shape`]), planned as a tree's shape (its tokens known, so
/// the drafter's proposing leaves them).
fn ngram_alone(ngram: &NGram, tokens: &[u32], depth: usize, nodes: usize) -> Shape {
    match ngram_shape(ngram, tokens, depth, nodes) {
        Shape::Chain(chain) if chain.is_empty() => Shape::Chain(chain),
        Shape::Chain(chain) => Shape::Tree(TokenTree::chain(0, &chain[..chain.len().min(nodes)])),
        tree => tree,
    }
}

/// A drafter's proposal as planned: a chain (an n-gram's tokens, or as many placeholders as
/// drafts its drafter makes), or a tree's shape ([`Proposed`]).
enum Shape {
    Chain(Vec<u32>),
    Tree(TokenTree),
}

impl Shape {
    /// An ensemble's proposal (a drafter that ranks ids, and the n-gram): the drafter's chain or
    /// tree with the n-gram's continuations of `tokens` beside it (breadth first, `k` deep), up to
    /// `k` nodes more or `nodes` in all, as the one-sequence loop's
    /// [`crate::speculative::Ensemble`] merges them, `room` nodes after the root at most. (A
    /// continuation whose tokens the drafter proposes too shares its nodes once both ran: the
    /// rows planned for it go unused, where alone the loop merges first and fills them.)
    fn with_ngram(self, ngram: &NGram, tokens: &[u32], (k, nodes): (usize, usize), room: usize) -> Shape {
        let mut tree = match self {
            Shape::Chain(chain) => TokenTree::chain(0, &vec![ranked(0); chain.len().min(MAX_TREE - 1)]),
            Shape::Tree(tree) => tree,
        };
        let budget = (tree.len() + k).max(nodes + 1).min(MAX_TREE).min(room + 1);
        crate::speculative::ngram::add_breadth_first(&mut tree, &ngram.continuations(tokens, k), budget);
        match tree.is_chain() {
            true => Shape::Chain(vec![0; tree.len() - 1]),
            false => Shape::Tree(tree),
        }
    }
}

/// A token tree planned before its drafter ran ([`Rows::proposed`]): its shape, whose tokens are
/// known (an n-gram's) or ranks among the ids its drafter ranks at the node's depth ([`ranked`]:
/// a Medusa head's, an EAGLE or draft model step's), its nodes in the order drafts are taken
/// ([`take_order`]), and each node's token once the drafter ran, with the EAGLE head's
/// log-probability of it where the head ranked it (none: not yet, or another drafter's).
struct Proposed {
    shape: TokenTree,
    order: Vec<usize>,
    ids: Vec<u32>,
    log_probs: Vec<Option<f32>>,
}

/// A rank's token in a [`Proposed`] shape (beyond every vocabulary).
fn ranked(rank: usize) -> u32 {
    u32::MAX - rank as u32
}

/// The rank a [`Proposed`] shape's token stands for (none: a known token).
fn rank_of(token: u32) -> Option<usize> {
    (token > u32::MAX - MAX_TREE as u32 * 64).then(|| (u32::MAX - token) as usize)
}

impl Proposed {
    /// Its nodes taken by their `chance`s (an adaptive K's; none: as the tree has them).
    fn new(shape: TokenTree, chance: Option<&[f64]>) -> Proposed {
        let order = take_order(&shape, chance);
        let ids = shape.tokens().to_vec();
        let log_probs = vec![None; shape.len()];
        Proposed { shape, order, ids, log_probs }
    }

    /// The EAGLE head's log-probabilities of the nodes that stand for its ranked ids
    /// (`top[depth - 1]`, of the steps that ran: depth 1's ranked in its follow), per node.
    fn ranked_log_probs(shape: &TokenTree, top: &[Ranked]) -> Vec<Option<f32>> {
        let at = |n: usize| {
            let ranked = top.get(shape.depth(n).checked_sub(1)?)?;
            ranked.log_probs.get(rank_of(shape.tokens()[n])?).copied()
        };
        (0..shape.len()).map(at).collect()
    }

    /// The drafter's ranked ids `top[depth - 1][rank]` into the nodes that stand for them.
    fn fill(&mut self, top: &[Vec<u32>]) {
        for n in 1..self.shape.len() {
            let rank = rank_of(self.shape.tokens()[n]);
            let ids = top.get(self.shape.depth(n) - 1);
            if let Some(&id) = rank.and_then(|rank| ids.and_then(|ids| ids.get(rank))) {
                self.ids[n] = id;
            }
        }
    }

    /// Of its first nodes taken, those that `stays` (one per node) keeps first, in their order,
    /// then the others: returns how many stay (the nodes to take now).
    fn keep(&mut self, stays: &[bool]) -> usize {
        let n = stays.len().min(self.order.len());
        let rest = self.order.split_off(n);
        let (kept, dropped): (Vec<(usize, bool)>, _) =
            self.order.iter().copied().zip(stays.iter().copied()).partition(|&(_, stays)| stays);
        self.order = kept.iter().chain(&dropped).map(|&(node, _)| node).chain(rest).collect();
        kept.len()
    }

    /// The drafter's steps its first `taken` nodes need: their deepest ranked node's depth.
    fn steps(&self, taken: usize) -> usize {
        let ranked = |&&n: &&usize| rank_of(self.shape.tokens()[n]).is_some();
        let first = &self.order[..taken.min(self.order.len())];
        first.iter().filter(ranked).map(|&n| self.shape.depth(n)).max().unwrap_or(0)
    }

    /// The tree below `root` of its first `taken` nodes with their tokens (a drafter's id equal
    /// to a known token beside it shares that node; a node whose drafter did not run ends the
    /// nodes taken), and per node of it the head's log-probability of it, where known.
    fn tree(&self, root: u32, taken: usize) -> (TokenTree, Vec<Option<f32>>) {
        let filled = |&n: &usize| rank_of(self.ids[n]).is_none();
        let taken = self.order.iter().take(taken).take_while(|n| filled(n)).count();
        let mut keep = vec![false; self.shape.len()];
        for &n in &self.order[..taken] {
            keep[n] = true;
        }
        let mut tree = TokenTree::new(root);
        let mut log_probs = vec![None];
        let mut at: Vec<Option<usize>> = vec![Some(0); self.shape.len()];
        for n in 1..self.shape.len() {
            at[n] = match (keep[n], at[self.shape.parents()[n]]) {
                (true, Some(p)) => tree.child(p, self.ids[n]),
                _ => None,
            };
            if let Some(node) = at[n] {
                log_probs.resize(tree.len(), None);
                log_probs[node] = log_probs[node].or(self.log_probs[n]);
            }
        }
        (tree, log_probs)
    }
}

/// The EAGLE head's proposal: its chain `k` deep with up to `siblings` of each depth's next
/// likeliest ids beside it, `nodes` nodes after the root at most
/// ([`TokenTree::chain_with_siblings`]).
fn eagle_shape(k: usize, siblings: usize, nodes: usize) -> Shape {
    let ranks: Vec<Vec<u32>> = vec![(1..=siblings).map(ranked).collect(); k];
    let shape = TokenTree::chain_with_siblings(0, &vec![ranked(0); k], &ranks, nodes + 1);
    match shape.is_chain() {
        true => Shape::Chain(vec![0; k]),
        false => Shape::Tree(shape),
    }
}

/// A token tree's nodes after its root in the order drafts are taken: with their `chance`s (an
/// adaptive K's, [`node_chances`]: a parent's above its children's) the likeliest first, the
/// earlier first among equals; without (a fixed K) as the tree has them.
fn take_order(tree: &TokenTree, chance: Option<&[f64]>) -> Vec<usize> {
    let mut order: Vec<usize> = (1..tree.len()).collect();
    if let Some(chance) = chance {
        order.sort_by(|&a, &b| chance[b].total_cmp(&chance[a]).then(a.cmp(&b)));
    }
    order
}

/// The Medusa heads' proposal: their tree of `choices` (their paths: [`Medusa::tree`]) at most
/// `depth` deep and `nodes` nodes after the root (each node a rank among its head's ids), or
/// without paths the heads' first guesses (a chain).
fn medusa_shape(choices: &[Vec<usize>], depth: usize, nodes: usize) -> Shape {
    let ranks = choices.iter().flatten().max().map_or(0, |&r| r + 1);
    let top = vec![(0..ranks).map(ranked).collect::<Vec<u32>>(); depth];
    let shape = Medusa::tree_of(choices, 0, &top, DraftBudget::tree(depth, nodes.min(MAX_TREE - 1)));
    match shape.is_chain() {
        true => Shape::Chain(vec![0; depth]),
        false => Shape::Tree(shape),
    }
}

/// Each node's chance of being accepted under a sequence's acceptances `(α, β)` of it
/// (`at(node)`; the root's 1): its parent's times α for a first child, and for a later one times
/// the chance the siblings before it were rejected, and it kept (with one α and β for all:
/// (1 - α)(1 - β)^(r-1) β at rank r): an alternative continuation is tried where the ones
/// before it failed, each with its own measured acceptance ([`Tally`]). Below its parent's, so
/// taking nodes by chance takes parents first.
fn node_chances(tree: &TokenTree, at: impl Fn(usize) -> (f64, f64)) -> Vec<f64> {
    let mut chance = vec![1.0; tree.len()];
    // (per node, the chance its children so far were all rejected)
    let mut missed = vec![1.0; tree.len()];
    for (n, &p) in tree.parents().iter().enumerate().skip(1) {
        let (alpha, beta) = at(n);
        let accept = if tree.children(p).next() == Some(n) { alpha } else { beta };
        chance[n] = chance[p] * missed[p] * accept;
        missed[p] *= 1.0 - accept;
    }
    chance
}

/// The pass [`draft`] plans, as the costs see it: its rows, its expected tokens, the drafters'
/// seconds of its drafts, and the measured seconds of a pass of its rows before the adaptive
/// drafts (none: not measured).
struct Planned {
    rows: f64,
    tokens: f64,
    drafting: f64,
    measured: Option<f64>,
}

impl Planned {
    /// The target's seconds of the pass: its rows' before the adaptive drafts (`before` of
    /// them) as measured, where they are, and the fit's for the rows after.
    fn seconds(&self, fit: &Fit<'_>, before: usize) -> f64 {
        let measured = self.measured.map_or(0.0, |m| m - fit.seconds(before));
        (fit.seconds(self.rows as usize) + measured).max(1e-9)
    }
}

/// [`draft`]'s adaptive drafts in at most `budget` rows, one at a time the likeliest (its next
/// draft's chance) while its tokens per marginal second are at least the pass's tokens per
/// second (the marginal seconds by the passes' fit; the pass's own by its row count's measured
/// average where there is one, which a fit pinned by other counts can miss by half; unknown, as
/// many drafts as the probes given). A first
/// draft with a fixed cost is worth it where it and the drafts after it together are; a
/// sequence whose next draft is not worth it drafts no more this pass, the others go on.
/// Returns the rows left, and each candidate's surplus: its drafts' expected tokens at the
/// pass's tokens per second less their seconds (0 where the costs are unknown).
fn add_adaptive(
    plan: &mut [Rows],
    cands: &[Candidate],
    mut budget: usize,
    (fit, mut probes): (Option<Fit<'_>>, usize),
    mut p: Planned,
) -> (usize, Vec<f64>) {
    let mut done = vec![false; cands.len()];
    let mut surplus = vec![0.0; cands.len()];
    let before = p.rows as usize;
    while budget > 0 {
        let best = (cands.iter().enumerate())
            .filter(|(j, c)| !done[*j] && plan[c.entry].drafts.len() < c.proposal.len())
            .map(|(j, c)| (j, c.gains[plan[c.entry].drafts.len()]))
            .max_by(|x, y| x.1.total_cmp(&y.1));
        let Some((j, gain)) = best else { break };
        let c = &cands[j];
        let n = plan[c.entry].drafts.len();
        let cost = c.drafting(n + 1) - c.drafting(n);
        let mut price = 0.0;
        match &fit {
            None if probes == 0 => break,
            None => probes -= 1,
            Some(fit) => {
                // (the pass's seconds; of m more rows in it)
                let rows = p.rows as usize;
                let pass = p.seconds(fit, before);
                let rows_cost = |m: usize| fit.seconds(rows + m) - fit.seconds(rows);
                let pays = |g: f64, secs: f64| g * (pass + p.drafting) >= secs * p.tokens;
                // (a fixed cost shared by the drafts it buys)
                let bundle = |m: usize| pays(c.gains[..m].iter().sum(), rows_cost(m) + c.drafting(m));
                let more = c.proposal.len().min(budget);
                let shared = n == 0 && c.first > 0.0 && (2..=more).any(bundle);
                let alone = pays(gain, rows_cost(1) + cost);
                if !(alone || shared) {
                    done[j] = true;
                    continue;
                }
                surplus[j] += gain * (pass + p.drafting) / p.tokens - (rows_cost(1) + cost);
                price = if alone { (rows_cost(1) + cost) * p.tokens / (pass + p.drafting) } else { 0.0 };
            }
        }
        let r = &mut plan[c.entry];
        r.prices.push(price);
        r.drafts.push(c.proposal[n]);
        r.asked = r.drafts.len();
        budget -= 1;
        p.rows += 1.0;
        p.tokens += gain;
        p.drafting += cost;
    }
    (budget, surplus)
}

/// The drafts' positions in the target's pages: free ones taken, never a preemption (drafts
/// past the pages held are dropped); a tree proposal becomes the tree of the nodes taken.
fn place_drafts(batch: &mut Batch, plan: &mut [Rows]) {
    for r in plan.iter_mut().filter(|r| !r.drafts.is_empty()) {
        let last = batch.running[r.seq].n_past + r.run;
        batch.take_free(r.seq, last + r.drafts.len());
        r.drafts.truncate(batch.running[r.seq].pages.len() * KV_PAGE - last);
    }
    for r in plan.iter_mut() {
        let Some(p) = r.proposed.take() else { continue };
        let root = batch.running[r.seq].tokens.last().copied().unwrap_or(0);
        let (taken, log_probs) = p.tree(root, r.drafts.len());
        r.drafts = taken.tokens()[1..].to_vec();
        r.tree = (!taken.is_chain()).then_some(taken);
        r.log_probs = log_probs;
    }
}

/// Seconds of the batch's passes by their rows: an average per row count (recent passes
/// weigh more), and the line a + b R through them (a drafter's), or (the target's, with its
/// matmul row groups) a + b R + c G(R) ([`PassCosts::fit`]).
#[derive(Default)]
struct PassCosts {
    by_rows: Vec<Option<f64>>,
    /// The passes measured, and per row count the number of its latest one.
    passes: u64,
    latest: Vec<u64>,
    /// The latest pass (rows, seconds), and the seconds a row took between consecutive passes
    /// of different row counts in the same row groups (the target's; the latest [`PAIRS`]).
    last: Option<(usize, f64)>,
    pairs: VecDeque<f64>,
    /// `groups[R]`: the target's matmul row groups in a pass of R rows (G(R):
    /// [`Gpu::matmul_row_groups`](crate::gpu::Gpu::matmul_row_groups)); empty for a drafter's.
    groups: Vec<f64>,
    /// Whether the seconds are fixed ([`PassCosts::fix`]): passes do not change them.
    fixed: bool,
}

/// A pass's seconds by its rows R: a + b R + c G(R) (c = 0: a line).
struct Fit<'a> {
    a: f64,
    b: f64,
    c: f64,
    groups: &'a [f64],
}

impl Fit<'_> {
    fn seconds(&self, rows: usize) -> f64 {
        // (a pass never takes more rows than the table's; past it, a group per row: the dearest)
        let g = self.groups.get(rows).copied().unwrap_or(rows as f64);
        self.a + self.b * rows as f64 + self.c * g
    }
}

impl PassCosts {
    /// A pass of `rows` rows took `seconds`: the count's average moves a fifth of the way to
    /// it, half the way where the count was stale.
    fn observe(&mut self, rows: usize, seconds: f64) {
        if self.fixed {
            return;
        }
        if self.by_rows.len() <= rows {
            self.by_rows.resize(rows + 1, None);
            self.latest.resize(rows + 1, 0);
        }
        let group = |r: usize| self.groups.get(r).copied();
        if let Some((r0, s0)) = self.last.filter(|&(r0, _)| r0 != rows && group(r0).is_some()) {
            if group(r0) == group(rows) {
                if self.pairs.len() == PAIRS {
                    self.pairs.pop_front();
                }
                self.pairs.push_back((seconds - s0) / (rows as f64 - r0 as f64));
            }
        }
        self.last = Some((rows, seconds));
        let new = if self.stale(rows) { 0.5 } else { 0.2 };
        let c = &mut self.by_rows[rows];
        *c = Some(c.map_or(seconds, |old| (1.0 - new) * old + new * seconds));
        self.passes += 1;
        self.latest[rows] = self.passes;
    }

    /// Every row count's seconds fixed at a + b R ([`FixedCosts`]), as measured, from now on;
    /// none: measured again from the next pass.
    fn fix(&mut self, fixed: Option<(f64, f64)>) {
        let groups = std::mem::take(&mut self.groups);
        *self = PassCosts { groups, ..PassCosts::default() };
        if let Some((a, b)) = fixed {
            self.by_rows = (0..=MAX_BATCH).map(|r| (r > 0).then_some(a + b * r as f64)).collect();
            self.latest = vec![0; MAX_BATCH + 1];
            self.fixed = true;
        }
    }

    /// The seconds measured forgotten, unless they are fixed.
    fn forget(&mut self) {
        if !self.fixed {
            self.fix(None);
        }
    }

    /// Whether passes of `rows` rows were measured, but not in the latest [`STALE_PASSES`].
    /// (Drafting in every pass leaves the count without drafts unmeasured while lavapipe's pass
    /// times drift between a fast and a slow regime for 8-15 passes at a time: its old average
    /// against the drafts' recent ones could make a row look nearly free: one run of the EAGLE
    /// head drafted 1,008 times at N = 1, a fifth kept, 32 % below plain.)
    fn stale(&self, rows: usize) -> bool {
        self.measured(rows) && self.passes - self.latest[rows] >= STALE_PASSES
    }

    /// The average seconds of the passes of `rows` rows measured.
    fn average(&self, rows: usize) -> Option<f64> {
        self.by_rows.get(rows).copied().flatten()
    }

    /// Whether passes of `rows` rows were measured.
    fn measured(&self, rows: usize) -> bool {
        self.average(rows).is_some()
    }

    /// The line, or before two row counts are measured all the seconds of the count measured
    /// as fixed (shared by the sequences drafting: a pass of another count gets tried, and
    /// measures the line); none before any.
    fn estimate(&self) -> Option<(f64, f64)> {
        self.line().or_else(|| Some((self.by_rows.iter().find_map(|c| *c)?, 0.0)))
    }

    /// The least-squares fit a + b R + c G(R) through the measured row counts (each once), where
    /// they tell the groups' c apart from the line (row counts in two groups or more) and give b
    /// and c at least 0; else the line's. With [`MIN_PAIRS`] marginal rows measured between
    /// consecutive passes, b is their median (at least 0), a and c fitted after it: the row
    /// counts' averages are measured at different times (the count without drafts rarely where
    /// every pass drafts), and lavapipe's pass times drift between regimes by more than a row
    /// costs, where consecutive passes mostly share theirs. None until two row counts are
    /// measured.
    fn fit(&self) -> Option<Fit<'_>> {
        let (a, b) = self.line()?;
        let line = Fit { a, b, c: 0.0, groups: &self.groups };
        let points: Vec<[f64; 3]> = (self.by_rows.iter().enumerate())
            .filter_map(|(r, c)| Some([r as f64, *self.groups.get(r)?, (*c)?]))
            .collect();
        let n = points.len() as f64;
        let mean = |i: usize| points.iter().map(|p| p[i]).sum::<f64>() / n;
        if let Some(b) = self.paired() {
            // (a and c of the seconds less b R: c by least squares where two groups are measured)
            let y = |p: &[f64; 3]| p[2] - b * p[0];
            let (mg, my) = (mean(1), points.iter().map(y).sum::<f64>() / n);
            let sgg: f64 = points.iter().map(|p| (p[1] - mg) * (p[1] - mg)).sum();
            let sgy: f64 = points.iter().map(|p| (p[1] - mg) * (y(p) - my)).sum();
            let c = if sgg > 0.0 { (sgy / sgg).max(0.0) } else { 0.0 };
            return Some(Fit { a: (my - c * mg).max(1e-9), b, c, groups: &self.groups });
        }
        let m = [mean(0), mean(1), mean(2)];
        // (the centred normal equations of b and c)
        let s = |i: usize, j: usize| points.iter().map(|p| (p[i] - m[i]) * (p[j] - m[j])).sum::<f64>();
        let (srr, sgg, srg, sry, sgy) = (s(0, 0), s(1, 1), s(0, 1), s(0, 2), s(1, 2));
        let det = srr * sgg - srg * srg;
        if points.len() < 3 || det <= 1e-9 * srr * sgg {
            return Some(line);
        }
        let (b, c) = ((sgg * sry - srg * sgy) / det, (srr * sgy - srg * sry) / det);
        if b < 0.0 || c <= 0.0 {
            return Some(line);
        }
        Some(Fit { a: (m[2] - b * m[0] - c * m[1]).max(1e-9), b, c, groups: &self.groups })
    }

    /// The median of the marginal rows measured between consecutive passes (at least 0), once
    /// there are [`MIN_PAIRS`].
    fn paired(&self) -> Option<f64> {
        let mut v: Vec<f64> = self.pairs.iter().copied().collect();
        if v.len() < MIN_PAIRS {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 };
        Some(median.max(0.0))
    }

    /// (a, b) of the least-squares line through the measured row counts (each once), b at least
    /// 0; none until two row counts are measured.
    fn line(&self) -> Option<(f64, f64)> {
        let points: Vec<(f64, f64)> =
            (self.by_rows.iter().enumerate()).filter_map(|(r, c)| c.map(|c| (r as f64, c))).collect();
        if points.len() < 2 {
            return None;
        }
        let n = points.len() as f64;
        let (mx, my) = points.iter().fold((0.0, 0.0), |(x, y), p| (x + p.0 / n, y + p.1 / n));
        let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
        let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let b = (sxy / sxx).max(0.0);
        Some(((my - b * mx).max(1e-9), b))
    }
}

/// Commits a sequence's pass by its verdict `v`: the drafts kept, then the choice after them;
/// each token checked as the one-sequence loop checks it. Returns why the sequence ends, if it
/// does.
fn commit(
    s: &mut Seq,
    r: &Rows,
    v: &Verdict,
    tokenizer: &Tokenizer,
    events: &mut Vec<(SeqId, BatchEvent)>,
) -> Option<FinishReason> {
    let accepted = v.kept.len();
    for (record, t) in r.tallies(v) {
        s.tally[record].add(&t);
    }
    let st = &mut s.stats;
    st.verify_forwards += 1;
    st.drafted += r.drafts.len();
    st.accepted += accepted;
    // (a sum until the end)
    st.mean_k += r.asked as f64;
    // (the draft model's positions past the accepted drafts of its chain held rejected ones: in
    // an ensemble's tree its chain is the first branch, the n-gram's nodes after it)
    let chain = match &r.tree {
        Some(t) => v.kept.iter().zip(t.first_branch()).take_while(|(a, b)| **a == *b).count(),
        None => accepted,
    };
    if let Some(Drafting { source: Source::Model { past, .. }, .. }) = &mut s.drafting {
        *past = (*past).min(s.tokens.len() + chain);
    }
    s.n_past = s.tokens.len() + accepted;
    let end = push_committed(s, v, tokenizer, events);
    // (an end among the accepted drafts: the positions of those after it are not the sequence's)
    s.n_past = s.n_past.min(s.tokens.len());
    end
}

/// [`commit`]'s tokens: the kept drafts, then the choice after them, each streamed and checked
/// for the end as the one-sequence loop checks it (the first that ends it is the last).
fn push_committed(
    s: &mut Seq,
    v: &Verdict,
    tokenizer: &Tokenizer,
    events: &mut Vec<(SeqId, BatchEvent)>,
) -> Option<FinishReason> {
    let now = Instant::now();
    s.first_token.get_or_insert(now);
    let after = v.choices[v.kept.len()];
    let new = v.kept.iter().map(|&x| (x, true)).chain([(after, false)]);
    for (tok, drafted) in new {
        s.tokens.push(tok);
        s.from_draft.push(drafted);
        match s.text.push(tokenizer, tok) {
            Ok(text) => events
                .push((s.id, BatchEvent::Token(TokenEvent { id: Some(tok), text, from_draft: drafted }))),
            Err(e) => {
                events.push((s.id, BatchEvent::Failed(e)));
                return Some(FinishReason::Cancelled);
            }
        }
        if s.text.stopped() || (!s.ignore_eos && tokenizer.eos_ids().contains(&tok)) {
            return Some(FinishReason::Stop);
        }
        if s.generated() >= s.max_tokens {
            return Some(FinishReason::Length);
        }
    }
    None
}

/// Ends a sequence taken out of the running ones: its pages back to the pool, its text's held
/// back tail and its completion as events (a failed one has had its event).
fn finish(batch: &mut Batch, mut s: Seq, reason: FinishReason, tokenizer: &Tokenizer) {
    batch.leave(&mut s);
    let events = &mut batch.events;
    if reason == FinishReason::Cancelled {
        return;
    }
    match s.text.finish(tokenizer) {
        Ok(tail) if !tail.is_empty() => {
            events.push((s.id, BatchEvent::Token(TokenEvent { id: None, text: tail, from_draft: false })))
        }
        Ok(_) => {}
        Err(e) => {
            events.push((s.id, BatchEvent::Failed(e)));
            return;
        }
    }
    let end = Instant::now();
    let generated = s.generated();
    let st = &mut s.stats;
    st.base.prompt_tokens = s.prompt_len;
    st.base.cached_prompt_tokens = s.cached_tokens.unwrap_or(0);
    st.base.generated_tokens = generated;
    if let (Some(a), Some(f)) = (s.admitted, s.first_token) {
        st.base.prefill_seconds = (f - a).as_secs_f64();
        st.base.decode_seconds = (end - f).as_secs_f64();
    }
    if st.base.decode_seconds > 0.0 {
        st.base.tokens_per_second = generated as f64 / st.base.decode_seconds;
    }
    st.acceptance_rate = if st.drafted > 0 { st.accepted as f64 / st.drafted as f64 } else { 0.0 };
    st.mean_k /= st.verify_forwards.max(1) as f64;
    st.tokens_per_target_forward = generated as f64 / st.verify_forwards.max(1) as f64;
    let text = s.text.text().to_string();
    let finish_reason = if s.text.stopped() { FinishReason::Stop } else { reason };
    let completion = Completion {
        prompt_tokens: s.tokens[..s.prompt_len].to_vec(),
        tokens: s.tokens[s.prompt_len..].to_vec(),
        from_draft: s.from_draft,
        text,
        finish_reason,
        stats: s.stats,
    };
    events.push((s.id, BatchEvent::Done(Box::new(completion))));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decoding sequence of `tokens` with n-gram drafting (adaptive up to 8), `accepted` of
    /// its chains' drafts kept and `rejected` passes that rejected one.
    fn seq(tokens: Vec<u32>, accepted: usize, rejected: usize) -> Seq {
        let mut s = Seq {
            id: SeqId(0),
            n_past: tokens.len() - 1,
            prompt_len: 1,
            tokens,
            pages: vec![0, 1],
            cached_pages: 0,
            entry: 0,
            root: 0,
            cached_tokens: None,
            after: None,
            max_tokens: 100,
            ignore_eos: false,
            from_draft: Vec::new(),
            text: TextStream::new(&[], &[]),
            drafting: Some(Drafting {
                source: Source::NGram(NGram::default()),
                ngram: None,
                k_max: 8,
                fixed: false,
            }),
            // (its record whatever its drafts' match)
            tally: [Tally { first: (accepted, rejected), later: (0, 0) }; RECORDS],
            sampling: SamplingParams::default(),
            draw: None,
            draft_draw: None,
            stats: SpecStats::default(),
            admitted: None,
            first_token: None,
        };
        s.stats.accepted = accepted;
        s
    }

    fn drafts(batch: &mut Batch, budget: usize) -> Vec<usize> {
        let mut plan: Vec<Rows> = (0..batch.running.len()).map(|i| Rows::new(i, 1, true)).collect();
        draft(batch, &mut plan, budget, 1024);
        plan.iter().map(|r| r.drafts.len()).collect()
    }

    #[test]
    fn an_adaptive_k_whose_eagle_drafts_do_not_pay_for_the_heads_follows_stops_following_it() {
        // (a sequence the head has followed through the token before its newest: ready to draft)
        let mut s = seq((1..20).collect(), 0, 10);
        let ready = Source::Eagle { past: s.n_past, row: Some((0, first(0.5))), idle: 0.0 };
        s.drafting = Some(Drafting { source: ready, ngram: None, k_max: 4, fixed: false });
        let mut batch = Batch::new(64);
        batch.running = vec![s];
        let idle = |b: &Batch| match &b.running[0].drafting {
            Some(Drafting { source: Source::Eagle { idle, .. }, .. }) => *idle,
            _ => unreachable!("an EAGLE sequence"),
        };
        // costs unknown: no draft, and no idle pass (not the costs' choice)
        assert_eq!(drafts(&mut batch, 24), [0]);
        assert_eq!(idle(&batch), 0.0);
        // rows free (a flat line) and the head's steps never run: two drafts, the first ranked
        // in its follow, the second the probe of a step's cost
        batch.costs.observe(4, 1.0);
        batch.costs.observe(8, 1.0);
        assert_eq!(drafts(&mut batch, 24), [2]);
        // its steps measured dear (10 s each): the first draft alone, which needs none
        batch.head_costs.observe(1, 10.0);
        assert_eq!(drafts(&mut batch, 24), [1]);
        batch.head_costs = PassCosts::default();
        // its step measured nearly free: K's drafts, and its idle passes stay 0
        batch.head_costs.observe(1, 1e-12);
        assert_eq!(drafts(&mut batch, 24), [4]);
        assert_eq!(idle(&batch), 0.0);
        // the head's follows measured: 1 s each, more than its drafts' surplus (1 in 12 drafts
        // kept, a lower bound of 0.006: 0.006 tokens of a 1 s pass): they count, drafts or not
        batch.follow_costs.observe(1, 1.0);
        batch.follow_costs.observe(2, 1.0);
        assert_eq!(drafts(&mut batch, 24), [4]);
        let unpaid = idle(&batch);
        assert!(unpaid > 0.99 && unpaid < 1.0, "a follow less its drafts' surplus: {unpaid}");
        // a microsecond each: its drafts pay for them
        batch.follow_costs = PassCosts::default();
        batch.follow_costs.observe(1, 1e-6);
        batch.follow_costs.observe(2, 1e-6);
        assert_eq!(drafts(&mut batch, 24), [4]);
        assert_eq!(idle(&batch), 0.0);
        // rows cost what serving more requests does and 1 in 12 drafts is kept: none pays
        batch.costs = PassCosts::default();
        for r in [4, 8, 16] {
            batch.costs.observe(r, 1.0 + r as f64);
        }
        for pass in 1..=EAGLE_PATIENCE {
            assert_eq!(drafts(&mut batch, 24), [0]);
            assert_eq!(idle(&batch), pass as f64, "passes in a row without a draft");
            // (a pass whose rows ran out does not count)
            assert_eq!(drafts(&mut batch, 0), [0]);
            assert_eq!(idle(&batch), pass as f64, "no rows left: not the costs' choice");
        }
        // a fixed K's passes neither count nor reset them
        if let Some(d) = &mut batch.running[0].drafting {
            (d.fixed, d.source) = (true, Source::Eagle { past: 18, row: Some((0, first(0.5))), idle: 3.0 });
        }
        assert_eq!(drafts(&mut batch, 24), [4]);
        assert_eq!(idle(&batch), 3.0);
    }

    #[test]
    fn a_new_eagle_sequence_is_followed_where_its_drafters_record_pays_for_a_draft() {
        // (a prompt of 19 tokens, `wanted` more)
        let eagle = |fixed: bool, wanted: usize| {
            let mut s = seq((1..20).collect(), 0, 0);
            (s.n_past, s.prompt_len, s.max_tokens) = (0, 19, wanted);
            let source = Source::Eagle { past: 0, row: None, idle: 0.0 };
            s.drafting = Some(Drafting { source, ngram: None, k_max: 4, fixed });
            s
        };
        // (the prompt's rows of the first pass, and whether the head follows it)
        let first_pass = |batch: &mut Batch, s: Seq| {
            batch.running.clear();
            batch.waiting.push_back(s);
            batch.admit(1024);
            let followed = batch.running[0].drafting.as_ref().is_some_and(Drafting::is_followed);
            (plan(batch, 1024)[0].run, followed)
        };
        let mut batch = Batch::new(64);
        // nothing priced yet: followed, its whole prompt runs (a fixed K's leaves its last token
        // to run with the head's drafts, as the one-sequence loop does)
        assert_eq!(first_pass(&mut batch, eagle(false, 100)), (19, true));
        assert_eq!(first_pass(&mut batch, eagle(true, 100)), (18, true));
        // a pass of one decoding row: 1 s and 0.15 s a row; its follows not measured yet:
        // followed
        batch.costs.observe(4, 1.6);
        batch.costs.observe(8, 2.2);
        batch.eagle_records = [80, 10, 10];
        assert!(batch.follow_prices().is_none());
        assert_eq!(first_pass(&mut batch, eagle(false, 100)), (19, true));
        // a follow 0.023 s; at a decoding pass's pace (one row: 1 / 1.15 tokens a second) a
        // first draft (ranked in the head's follow, no step of it) pays at an acceptance of
        // 0.15 / 1.15, the follow at 0.02 tokens
        batch.follow_costs.observe(1, 0.023);
        batch.follow_costs.observe(2, 0.023);
        batch.running.clear();
        let (price, follow, row) = batch.follow_prices().expect("priced");
        assert!((price - 0.15 / 1.15).abs() < 1e-9, "{price}");
        assert!((follow - 0.023 / 1.15).abs() < 1e-9, "{follow}");
        assert_eq!(row, 0.0);
        // first drafts seen 80 times in the least confident record, 10 in each other; the
        // head's drafts of every confidence kept 10 times in 100 across the batch (a mean of
        // 0.11): not followed; its most confident ones kept 90 times in 100 (a bound of 0.82, a
        // surplus of 0.07 tokens a pass): followed
        let kept = |k: usize| Tally { first: (k, 100 - k), later: (0, 0) };
        batch.acceptance[2] = [kept(10); RECORDS];
        assert_eq!(first_pass(&mut batch, eagle(false, 100)), (19, false));
        assert_eq!(first_pass(&mut batch, eagle(true, 100)), (18, true), "a fixed K is followed");
        batch.acceptance[2][RECORDS - 1] = kept(90);
        assert_eq!(first_pass(&mut batch, eagle(false, 100)), (19, true));
        // a record not measured yet (1/2 before any: a surplus of 0.04): followed, to measure it
        batch.acceptance[2] = [kept(10), Tally::default(), kept(10)];
        assert_eq!(first_pass(&mut batch, eagle(false, 100)), (19, true));
        // every record kept 22 times in 100, a mean (0.23) above the price and a new sequence's
        // first draft's bound (0.13) below it: that draft would never be taken, so the sequence
        // is not followed (judged by the mean, it paid its follows for nothing); 35 in 100:
        // followed
        batch.acceptance[2] = [kept(22); RECORDS];
        assert_eq!(first_pass(&mut batch, eagle(false, 100)), (19, false));
        batch.acceptance[2] = [kept(35); RECORDS];
        assert_eq!(first_pass(&mut batch, eagle(false, 100)), (19, true));
        // the prices are a decoding pass's, whatever pass came last (a pass of a prompt's 19
        // rows, whose one token cost 3.85 s, priced a draft at a quarter of that)
        batch.running.clear();
        batch.waiting.push_back(eagle(false, 100));
        batch.admit(1024);
        assert_eq!(plan(&mut batch, 1024)[0].run, 19);
        batch.acceptance[2] = [kept(22); RECORDS];
        assert_eq!(first_pass(&mut batch, eagle(false, 100)), (19, false));
        // beside a running sequence: a pass of two rows (2 / 1.3 tokens a second), and the
        // follow shared by the EAGLE sequences, followed or not (as if the head followed each:
        // shared by the followed ones alone, a request beside one the head stopped following
        // paid the whole follow and was not followed, nor the next: at two requests on the
        // GPU-like costs 337 drafts where 807 were taken, 1.98 tokens a modelled second
        // against 2.07)
        batch.running = vec![seq((1..20).collect(), 0, 0)];
        let (price, follow, _) = batch.follow_prices().expect("priced");
        assert!((price - 0.15 * 2.0 / 1.3).abs() < 1e-9 && (follow - 0.023 * 2.0 / 1.3).abs() < 1e-9);
        for idle in [0.0, EAGLE_PATIENCE as f64] {
            batch.running = vec![eagle(false, 100)];
            if let Some(Drafting { source: Source::Eagle { idle: i, .. }, .. }) =
                &mut batch.running[0].drafting
            {
                *i = idle;
            }
            let (_, follow, _) = batch.follow_prices().expect("priced");
            assert!((follow - 0.0115 * 2.0 / 1.3).abs() < 1e-9, "{follow}");
        }
        // follows ten times dearer: confident drafts one pass in ten do not pay for them
        batch.acceptance[2] = [kept(10), kept(10), kept(90)];
        batch.follow_costs = PassCosts::default();
        batch.follow_costs.observe(1, 0.23);
        batch.follow_costs.observe(2, 0.23);
        assert_eq!(first_pass(&mut batch, eagle(false, 100)), (19, false));
        // a row of the head 0.05 s (a follow of one row 0.063 s): a sequence that wants 100
        // tokens pays its prompt's 18 rows a hundredth a pass, one that wants one token all of
        // them in its one pass (0.78 tokens, above its drafts' surplus)
        batch.acceptance[2] = [kept(90); RECORDS];
        batch.follow_costs = PassCosts::default();
        batch.follow_costs.observe(1, 0.063);
        batch.follow_costs.observe(2, 0.113);
        assert_eq!(first_pass(&mut batch, eagle(false, 100)), (19, true));
        assert_eq!(first_pass(&mut batch, eagle(false, 1)), (19, false));
    }

    #[test]
    fn a_young_record_is_judged_by_its_mean_a_grown_one_by_its_bound() {
        // (a pass: 1 s and 0.25 s a row: a first draft pays at an acceptance of 0.2; the n-gram's
        // continuation "7 1 5" of the newest 5)
        let mut batch = Batch::new(64);
        batch.costs.observe(4, 1.75);
        batch.costs.observe(8, 2.75);
        let context = vec![1, 5, 7, 1, 5, 7, 1, 5];
        let mut taken = |kept: usize, rejected: usize| {
            batch.running = vec![seq(context.clone(), kept, rejected)];
            batch.acceptance[0] = [Tally { first: (kept, rejected), later: (0, 0) }; RECORDS];
            drafts(&mut batch, 24)[0]
        };
        // nothing drafted yet: 1/2, tried (bounded below from nothing, 0.21 was near the price:
        // on lavapipe's rows of 22 % of a pass no record ever grew)
        assert!(taken(0, 0) > 0);
        // 1 kept of 4: the mean (1/3) still
        assert!(taken(1, 3) > 0);
        assert_eq!(Tally::bound((1, 3), (1, 3)), Tally::mean((1, 3), (1, 3)).0);
        // 2 kept of 10 (a bound of 0.14): none
        assert_eq!(taken(2, 8), 0);
        assert!(Tally::bound((2, 8), (2, 8)) < 0.15);
        // a sequence's own drafts count with the batch's (its own 10 drafts: grown)
        assert!(Tally::bound((2, 8), (0, 0)) < Tally::mean((2, 8), (0, 0)).0);
    }

    #[test]
    fn a_new_drafter_is_judged_by_its_own_drafts() {
        // what was measured of the heads and the draft model: records across requests, costs,
        // the EAGLE head's first drafts' records and prices
        let mut batch = Batch::new(64);
        let kept = |k: usize| Tally { first: (k, 100 - k), later: (0, 0) };
        batch.acceptance = [[kept(50); RECORDS]; 4];
        for costs in
            [&mut batch.draft_costs, &mut batch.head_costs, &mut batch.follow_costs, &mut batch.medusa_costs]
        {
            costs.observe(1, 0.1);
        }
        batch.eagle_records = [1; RECORDS];
        // another EAGLE head (an ensemble's kind names it too): its measures start afresh, the
        // other drafters' stay
        batch.forget_drafter(DraftKind::EagleNgram);
        let none = [Tally::default(); RECORDS];
        assert_eq!(batch.acceptance, [[kept(50); RECORDS], [kept(50); RECORDS], none, [kept(50); RECORDS]]);
        assert!(!batch.head_costs.measured(1) && !batch.follow_costs.measured(1));
        assert!(batch.draft_costs.measured(1) && batch.medusa_costs.measured(1));
        assert_eq!(batch.eagle_records, [0; RECORDS]);
        // new Medusa heads, a new draft model alike; the n-gram's records stay
        batch.forget_drafter(DraftKind::MedusaNgram);
        batch.forget_drafter(DraftKind::Model);
        batch.forget_drafter(DraftKind::Ngram);
        assert_eq!(batch.acceptance, [[kept(50); RECORDS], none, none, none]);
        assert!(!batch.draft_costs.measured(1) && !batch.medusa_costs.measured(1));
        // fixed costs stay fixed
        batch.fix_costs(Some(fixed_costs()));
        batch.forget_drafter(DraftKind::Eagle);
        let (a, b) = batch.head_costs.estimate().expect("fixed");
        assert!(a < 1e-6 && (b - 0.3).abs() < 1e-12, "{a} {b}");
    }

    /// Costs fixed by the tests: a pass 1 s, a row 0.1 s, a follow 0.2 s, a head step row 0.3 s.
    fn fixed_costs() -> FixedCosts {
        FixedCosts { pass: 1.0, row: 0.1, follow: 0.2, head_step: 0.3, ..Default::default() }
    }

    #[test]
    fn fixed_costs_are_the_plans_measures_until_measured_again() {
        let mut batch = Batch::new(64);
        batch.costs.groups = (0..=MAX_BATCH).map(|r| r.div_ceil(8) as f64).collect();
        assert!(batch.follow_prices().is_none());
        batch.fix_costs(Some(fixed_costs()));
        // a new EAGLE sequence's follow priced at once (a one-row pass 1 s: a row 0.1 token)
        let (price, follow, _) = batch.follow_prices().expect("fixed");
        assert!((price - 0.1).abs() < 1e-12 && (follow - 0.2).abs() < 1e-12, "{price} {follow}");
        // every row count measured at 0.9 + 0.1 R, whatever passes take; never stale
        for _ in 0..2 * STALE_PASSES {
            batch.costs.observe(4, 100.0);
            batch.follow_costs.observe(2, 100.0);
        }
        for r in 1..=MAX_BATCH {
            assert!((batch.costs.average(r).expect("fixed") - (0.9 + 0.1 * r as f64)).abs() < 1e-12);
            assert!(!batch.costs.stale(r));
        }
        let fit = batch.costs.fit().expect("a fit");
        assert!((fit.seconds(5) - fit.seconds(4) - 0.1).abs() < 1e-9 && (fit.seconds(1) - 1.0).abs() < 1e-9);
        assert!((batch.follow_seconds(2.0).expect("fixed") - 0.1).abs() < 1e-12, "a follow shared by two");
        // what the status tells is what was fixed: another adapter's costs replayed exactly
        let told = batch.status().measured_costs.expect("measured");
        let want = [1.0, 0.1, 0.2, 0.0, 0.0, 0.3];
        let got = [told.pass, told.row, told.follow, told.follow_row, told.head_pass, told.head_step];
        // (a line's fixed seconds are at least 1e-9)
        assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-8), "{got:?}");
        // measured again: nothing until passes run, and the target's row groups kept
        batch.fix_costs(None);
        assert!(batch.costs.fit().is_none() && batch.follow_seconds(1.0).is_none());
        assert_eq!(batch.costs.groups.len(), MAX_BATCH + 1);
        batch.costs.observe(4, 2.0);
        assert_eq!(batch.costs.average(4), Some(2.0));
        assert_eq!(batch.status().measured_costs, None, "one row count: no marginal row");
        batch.costs.observe(8, 2.4);
        let told = batch.status().measured_costs.expect("two row counts");
        assert!((told.pass - 1.7).abs() < 1e-9 && (told.row - 0.1).abs() < 1e-9, "{told:?}");
        assert_eq!((told.follow, told.head_step), (0.0, 0.0), "no head measured");
    }

    #[test]
    fn a_medusa_sequence_pays_its_row_of_the_heads_run_once() {
        // (a sequence with its row of the last pass, 9 in 10 drafts kept, 4 heads)
        let mut s = seq((1..20).collect(), 90, 10);
        s.drafting =
            Some(Drafting { source: Source::Medusa { row: Some(0) }, ngram: None, k_max: 8, fixed: false });
        let mut batch = Batch::new(64);
        batch.running = vec![s];
        batch.medusa_heads = 4;
        // a pass: 1 s and a thousandth per row
        batch.costs.observe(4, 1.004);
        batch.costs.observe(8, 1.008);
        // the heads never run: one draft, the probe of their cost
        assert_eq!(drafts(&mut batch, 24), [1]);
        // its row of their run costs 0.6 of a pass: the first draft (0.9 tokens) pays for it, and
        // the others come at a target row each (charged per draft, the third would not pay)
        batch.medusa_costs.observe(1, 0.6);
        assert_eq!(drafts(&mut batch, 24), [4]);
        // a row costing more than the first draft brings (0.9 of a token) but less than the four
        // it buys (3.1 tokens): the four; two rows left, two drafts
        batch.medusa_costs = PassCosts::default();
        batch.medusa_costs.observe(1, 0.95);
        assert_eq!(drafts(&mut batch, 24), [4]);
        assert_eq!(drafts(&mut batch, 2), [2]);
        // more than the four bring: none, and a less likely n-gram sequence beside it still drafts
        batch.medusa_costs = PassCosts::default();
        batch.medusa_costs.observe(1, 3.5);
        assert_eq!(drafts(&mut batch, 24), [0]);
        // (a Medusa sequence without its row of the last pass runs no row of the heads: the fixed
        // cost is not shared with it; 2.5 s for 3.1 tokens is below this pass's 2 tokens a second)
        batch.medusa_costs = PassCosts::default();
        batch.medusa_costs.observe(1, 2.5);
        let mut idle = seq((1..20).collect(), 90, 10);
        idle.drafting =
            Some(Drafting { source: Source::Medusa { row: None }, ngram: None, k_max: 8, fixed: false });
        batch.running.push(idle);
        assert_eq!(drafts(&mut batch, 24), [0, 0], "2.5 s for one row, not 1.25 each for two");
        batch.running.pop();
        batch.running.push(seq([1, 2, 3].repeat(6), 30, 10));
        let d = drafts(&mut batch, 24);
        assert!(d[0] == 0 && d[1] >= 4, "{d:?}");
    }

    #[test]
    fn a_draft_models_catch_up_is_paid_by_the_drafts_it_buys() {
        // (a sequence the draft model has seen up to position 10 of 18: its first draft also
        // costs the catch-up of 8 more rows; 9 in 10 drafts kept)
        let mut s = seq((1..20).collect(), 90, 10);
        s.drafting = Some(Drafting {
            source: Source::Model { pages: Vec::new(), past: 10 },
            ngram: None,
            k_max: 8,
            fixed: false,
        });
        let mut batch = Batch::new(64);
        batch.running = vec![s];
        // a target pass: 1 s and a thousandth per row; a draft pass: 0.1 s a row
        batch.costs.observe(4, 1.004);
        batch.costs.observe(8, 1.008);
        batch.draft_costs.observe(1, 0.1);
        batch.draft_costs.observe(9, 0.9);
        // the first draft alone: 0.89 tokens for 0.1 + 0.8 s (below a pass's 1 token a second);
        // with the next one, 1.68 tokens for 1 s: taken, and the others after it
        let d = drafts(&mut batch, 24);
        assert!(d[0] >= 2, "{d:?}");
        // a catch-up no bundle pays (198 rows: 8 drafts bring 4.9 tokens for 20.6 s): none
        if let Some(d) = &mut batch.running[0].drafting {
            d.source = Source::Model { pages: Vec::new(), past: 0 };
        }
        batch.running[0].tokens = (1..200).collect();
        (batch.running[0].n_past, batch.running[0].max_tokens) = (198, 1000);
        assert_eq!(drafts(&mut batch, 24), [0]);
    }

    #[test]
    fn an_end_among_accepted_drafts_leaves_the_positions_after_it_out() {
        // a page's positions but two (the newest just before them); drafts 1 2 3 all accepted,
        // the first ends the request (its max_tokens): the positions of 2 and 3 (the page's last
        // and the next page's first) are not the sequence's, and caching its whole pages reads
        // only its tokens
        let tokenizer = crate::model::synthetic::byte_tokenizer(256).expect("bytes");
        let n = KV_PAGE - 2;
        let mut s = seq((0..n as u32).map(|i| 97 + i % 20).collect(), 0, 0);
        (s.prompt_len, s.max_tokens) = (n - 1, 2);
        let r = Rows { drafts: vec![1, 2, 3], asked: 3, ..Rows::new(0, 1, true) };
        let v = Verdict::of(&r, &[1, 2, 3, 4]).expect("a chain's verdict");
        let end = commit(&mut s, &r, &v, &tokenizer, &mut Vec::new());
        assert_eq!(end, Some(FinishReason::Length));
        assert_eq!((s.tokens.len(), s.n_past), (n + 1, n + 1));
        let mut pool = Pool::new(2);
        cache_pages(&mut pool, &mut s);
        assert_eq!(pool.cached(), 0, "no whole page of its tokens");
    }

    #[test]
    fn a_token_tree_is_taken_likeliest_first_and_keeps_the_path_its_choices_follow() {
        // "1" was followed by "8 9 1", "6 1 8" and "5 7 1": three branches below the root 1
        let context = [1, 5, 7, 1, 6, 1, 8, 9, 1];
        let ngram = NGram { branches: 3, ..NGram::default() };
        let tree = |shape: Shape| match shape {
            Shape::Tree(t) => t,
            Shape::Chain(c) => panic!("a chain: {c:?}"),
        };
        let shape = tree(ngram_shape(&ngram, &context, 3, 31));
        assert_eq!(shape.tokens(), &[1, 8, 6, 5, 9, 1, 7, 1, 8, 1]);
        // chances: 8 1/2, 6 1/4, 5 1/8; 9 1/4, 1 (after 6) 1/16, ...: parents first
        let chance = node_chances(&shape, |_| (0.5, 0.5));
        let p = Proposed::new(shape.clone(), Some(&chance));
        assert_eq!(&p.order[..4], &[1, 2, 4, 3]);
        assert!(p.order.windows(2).all(|w| chance[w[0]] >= chance[w[1]]));
        // a fixed K takes the nodes as the tree has them; one continuation is a chain
        assert_eq!(Proposed::new(tree(ngram_shape(&ngram, &context, 3, 3)), None).order, [1, 2, 3]);
        assert!(matches!(ngram_shape(&ngram, &[1, 2, 3, 1, 2], 3, 31), Shape::Chain(c) if c == [3, 1, 2]));
        assert!(matches!(ngram_shape(&NGram::default(), &context, 3, 31), Shape::Chain(_)));
        // the plan takes the first 3 of the order: the tree 1 -> (8 -> 9, 6)
        let mut batch = Batch::new(4);
        batch.running = vec![seq(context.to_vec(), 0, 0)];
        let mut plan = vec![Rows { drafts: vec![0; 3], proposed: Some(p), ..Rows::new(0, 1, true) }];
        place_drafts(&mut batch, &mut plan);
        let r = &plan[0];
        let taken = r.tree.as_ref().expect("a tree");
        assert_eq!(
            (taken.tokens(), taken.parents(), &r.drafts[..]),
            (&[1, 8, 6, 9][..], &[0, 0, 0, 1][..], &[8, 6, 9][..])
        );
        // the choices follow 8 then 9: its path, the choice after it; node 2 was not reached
        let v = Verdict::of(r, &[8, 9, 4, 3]).expect("verdict");
        // (the tally: two first children kept)
        let tally = |first, later| Tally { first, later };
        assert_eq!(
            (&v.kept[..], &v.choices[..], v.tally),
            (&[8, 9][..], &[8, 9, 3][..], tally((2, 0), (0, 0)))
        );
        assert_eq!(v.path, Some(vec![0, 1, 3]));
        // 6 (node 2, a leaf): kept, the root's first child 8 rejected before it; 8 then not 9:
        // a first child of the path's end was rejected; neither: both of the root's children
        let v = Verdict::of(r, &[6, 2, 4, 3]).expect("verdict");
        assert_eq!(
            (&v.kept[..], &v.choices[..], v.tally, v.path),
            (&[6][..], &[6, 4][..], tally((0, 1), (1, 0)), Some(vec![0, 2]))
        );
        let v = Verdict::of(r, &[8, 7, 4, 3]).expect("verdict");
        assert_eq!((&v.kept[..], &v.choices[..], v.tally), (&[8][..], &[8, 7][..], tally((1, 1), (0, 0))));
        let v = Verdict::of(r, &[5, 7, 4, 3]).expect("verdict");
        assert_eq!((&v.kept[..], v.tally), (&[][..], tally((0, 1), (0, 1))));
        // a sibling of rank 2 kept: the first child and the rank 1 sibling before it rejected
        let mut t = TokenTree::new(1);
        for x in [4, 5, 6] {
            t.child(0, x);
        }
        assert_eq!(Tally::of_path(&t, &[0, 3]), tally((0, 1), (1, 1)));
        // a chain: its first children
        let chain = Rows { drafts: vec![4, 5, 6], ..Rows::new(0, 1, true) };
        assert_eq!(Verdict::of(&chain, &[4, 5, 9, 9]).expect("verdict").tally, tally((2, 1), (0, 0)));
        assert_eq!(Verdict::of(&chain, &[4, 5, 6, 9]).expect("verdict").tally, tally((3, 0), (0, 0)));

        // an ensemble: the EAGLE head's chain 2 deep with a sibling at each depth (ranks), then
        // the n-gram's continuations 8 and 6 (2 more nodes)
        let shape = tree(eagle_shape(2, 1, 31).with_ngram(&ngram, &context, (2, 4), 31));
        assert_eq!(shape.tokens(), &[0, ranked(0), ranked(0), ranked(1), ranked(1), 8, 6]);
        assert_eq!(shape.parents(), &[0, 0, 1, 0, 1, 0, 0]);
        let mut p = Proposed::new(shape, None);
        assert_eq!((p.steps(3), p.steps(1), p.steps(6)), (2, 1, 2), "the head's steps");
        // the head's ids: 8 then 9, 4 and 3 beside them; the n-gram's 8 shares the chain's node
        p.fill(&[vec![8, 4], vec![9, 3]]);
        // (the head's probabilities of its ids: the n-gram's nodes have none)
        let ranking =
            |ids: [u32; 2], p: [f32; 2]| Ranked { ids: ids.to_vec(), log_probs: p.map(f32::ln).to_vec() };
        p.log_probs = Proposed::ranked_log_probs(
            &p.shape,
            &[ranking([8, 4], [0.5, 0.25]), ranking([9, 3], [0.75, 0.125])],
        );
        let (t, log_probs) = p.tree(1, 6);
        assert_eq!((t.tokens(), t.parents()), (&[1, 8, 9, 4, 3, 6][..], &[0, 0, 1, 0, 1, 0][..]));
        let p_of = |p: f32| Some(p.ln());
        assert_eq!(log_probs, [None, p_of(0.5), p_of(0.75), p_of(0.25), p_of(0.125), None]);
        // the nodes a judgement keeps of the first 5 taken (not the head's second draft, 9, nor
        // the n-gram's 8): taken first, the tree of those alone
        let mut kept =
            Proposed::new(tree(eagle_shape(2, 1, 31).with_ngram(&ngram, &context, (2, 4), 31)), None);
        kept.fill(&[vec![8, 4], vec![9, 3]]);
        assert_eq!(kept.keep(&[true, false, true, true, false]), 3);
        assert_eq!(kept.order, [1, 3, 4, 2, 5, 6]);
        let (t, _) = kept.tree(1, 3);
        assert_eq!((t.tokens(), t.parents()), (&[1, 8, 4, 3][..], &[0, 0, 0, 1][..]));
        // nodes the drafter did not fill (its steps ran out) end the nodes taken
        let mut p = Proposed::new(tree(eagle_shape(2, 1, 31)), None);
        p.fill(&[vec![8, 4]]);
        assert_eq!(p.tree(1, 4).0.tokens(), &[1, 8]);
        // the room: no more nodes than the context holds after the root
        assert!(
            matches!(eagle_shape(1, 1, 2).with_ngram(&ngram, &context, (2, 2), 2), Shape::Tree(t) if t.len() == 3)
        );
    }

    #[test]
    fn an_ensemble_whose_drafter_cannot_draft_yet_drafts_the_ngrams_continuations() {
        // (an EAGLE head that has not followed the sequence: it cannot draft)
        let mut s = seq([1, 2, 3].repeat(6), 90, 10);
        let waiting = Source::Eagle { past: 0, row: None, idle: 0.0 };
        s.drafting = Some(Drafting { source: waiting, ngram: None, k_max: 4, fixed: true });
        let mut batch = Batch::new(64);
        batch.running = vec![s];
        assert_eq!(drafts(&mut batch, 24), [0], "the head alone: nothing");
        if let Some(d) = &mut batch.running[0].drafting {
            d.ngram = Some(NGram { branches: 4, ..NGram::default() });
        }
        assert_eq!(drafts(&mut batch, 24), [4], "with the n-gram: its continuation, K deep");
    }

    #[test]
    fn a_trees_nodes_beside_a_drafters_steps_cost_a_row_alone() {
        // an EAGLE chain node (a head step of half a pass) and two siblings its step ranked, of
        // chances 0.9, 0.05 and 0.05; a pass of 1 s and a thousandth per row
        let cand = |steps: Vec<usize>| Candidate {
            entry: 0,
            proposal: vec![0; 3],
            gains: vec![0.9, 0.05, 0.05],
            steps,
            each: 0.5,
            first: 0.0,
        };
        let taken = |c: Candidate| {
            let mut plan = vec![Rows::new(0, 1, true)];
            let p = Planned { rows: 1.0, tokens: 1.0, drafting: 0.0, measured: None };
            add_adaptive(&mut plan, &[c], 8, (Some(Fit { a: 1.0, b: 0.001, c: 0.0, groups: &[] }), 0), p);
            plan[0].drafts.len()
        };
        assert_eq!(taken(cand(vec![1, 1, 1])), 3, "0.05 tokens for a row's thousandth of a pass");
        assert_eq!(taken(cand(vec![1, 2, 3])), 1, "each a step: 0.05 tokens for half a pass");
    }

    #[test]
    fn admission_takes_the_pages_of_a_sequence_up_to_the_context() {
        // (a sequence preempted at the context's end comes back in one context's pages)
        let mut batch = Batch::new(128 / KV_PAGE);
        let mut full = seq((0..128).collect(), 0, 0);
        full.n_past = 0;
        batch.waiting.push_back(full);
        batch.admit(128);
        assert_eq!((batch.running.len(), batch.running[0].pages.len()), (1, 128 / KV_PAGE));
        // admitted in arrival order; the places are the rows of a pass at most
        let mut batch = Batch::new(8);
        batch.limits = BatchLimits { max_seqs: 8, max_rows: 2 };
        for id in [5, 2, 9] {
            batch.waiting.push_back(Seq { id: SeqId(id), ..seq(vec![1, 2], 0, 0) });
        }
        batch.admit(128);
        let ids: Vec<u64> = batch.running.iter().map(|s| s.id.0).collect();
        assert_eq!(ids, [2, 5], "two places, in arrival order");
    }

    #[test]
    fn pass_costs_fit_a_line_through_each_row_count() {
        let mut c = PassCosts::default();
        c.observe(4, 1.0);
        assert!(c.line().is_none(), "one row count: no slope");
        assert_eq!(c.estimate(), Some((1.0, 0.0)), "its seconds as fixed");
        assert!(c.measured(4) && !c.measured(8) && !c.measured(400));
        assert_eq!(PassCosts::default().estimate(), None);
        c.observe(8, 2.0);
        c.observe(8, 2.0);
        let (a, b) = c.line().expect("two row counts");
        assert!((a - 0.0).abs() < 1e-6 || a == 1e-9, "{a}");
        assert!((b - 0.25).abs() < 1e-9, "{b}");
        // (a pass of more rows measured cheaper: no negative slope)
        c.observe(16, 0.1);
        c.observe(16, 0.1);
        c.observe(16, 0.1);
        assert!(c.line().expect("line").1 >= 0.0);
    }

    #[test]
    fn a_new_sequence_starts_from_its_drafters_acceptance() {
        let pattern: Vec<u32> = [1, 2, 3].repeat(6);
        let mut batch = Batch::new(64);
        // a pass: 1 s and 0.15 s a row: a first draft pays at an acceptance of 0.13 or more
        batch.costs.observe(4, 1.6);
        batch.costs.observe(8, 2.2);
        batch.running = vec![seq(pattern.clone(), 0, 0)];
        assert_eq!(drafts(&mut batch, 24)[0].min(1), 1, "from 1/2");
        // the n-gram's drafts after 3-word matches (the pattern's) kept 10 times in 100 across
        // the batch: a bound of 0.04, none
        let record = Tally { first: (10, 90), later: (0, 0) };
        batch.acceptance[0][2] = record;
        assert_eq!(drafts(&mut batch, 24), [0]);
        // (another drafter's record is not the n-gram's, nor a shorter match's)
        let others = [Tally::default(), Tally::default(), record];
        batch.acceptance = [[record, record, Tally::default()], others, others, others];
        assert_eq!(drafts(&mut batch, 24)[0].min(1), 1);
        // a sequence's own record outweighs its drafter's
        batch.acceptance[0][2] = record;
        batch.running = vec![seq(pattern, 90, 10)];
        assert!(drafts(&mut batch, 24)[0] >= 2);
    }

    #[test]
    fn an_ngrams_drafts_are_judged_by_the_words_its_match_has() {
        // "1 2 3" matched (3 words): 4 1 2 3 ...; "5" matched alone (1 word): 10 11 5 ...
        let long = vec![1, 2, 3, 4, 1, 2, 3];
        let short = vec![5, 6, 7, 8, 9, 5, 10, 11, 5];
        let mut batch = Batch::new(64);
        // (a pass: 1 s and 0.15 s a row)
        batch.costs.observe(4, 1.6);
        batch.costs.observe(8, 2.2);
        batch.running = vec![seq(long.clone(), 0, 0), seq(short.clone(), 0, 0)];
        // 1-word matches' drafts kept 20 times in 100 across the batch, 3-word ones' 80: the
        // first drafts, the second none (their mean, 0.5, would have drafted both or neither)
        let kept = |k: usize| Tally { first: (k, 100 - k), later: (0, 0) };
        batch.acceptance[0] = [kept(20), kept(50), kept(80)];
        let mut plan = vec![Rows::new(0, 1, true), Rows::new(1, 1, true)];
        draft(&mut batch, &mut plan, 24, 1024);
        assert_eq!((plan[0].record, plan[1].record), (2, 0), "the records its outcomes go to");
        assert!(!plan[0].drafts.is_empty() && plan[0].drafts[..2] == [4, 1], "{:?}", plan[0].drafts);
        assert_eq!(plan[1].drafts, Vec::<u32>::new(), "a 1-word match's record does not pay");
        // the records swapped: the other way round
        batch.acceptance[0] = [kept(80), kept(50), kept(20)];
        assert_eq!(drafts(&mut batch, 24)[0], 0);
        assert!(drafts(&mut batch, 24)[1] > 0);
    }

    /// The first draft the head ranked at a sequence's last row, of probability `p` (the two
    /// ids after it share the rest).
    fn first(p: f32) -> Ranked {
        Ranked { ids: vec![7, 8, 9], log_probs: vec![p.ln(), ((1.0 - p) / 2.0).ln(), ((1.0 - p) / 2.0).ln()] }
    }

    #[test]
    fn an_eagle_draft_is_judged_by_the_heads_probability_of_it() {
        let eagle = |p: f32| {
            let mut s = seq((1..20).collect(), 0, 0);
            let source = Source::Eagle { past: s.n_past, row: Some((0, first(p))), idle: 0.0 };
            s.drafting = Some(Drafting { source, ngram: None, k_max: 4, fixed: false });
            s
        };
        let mut batch = Batch::new(64);
        // (a pass: 1 s and 0.15 s a row; the head's chain nearly free)
        batch.costs.observe(4, 1.6);
        batch.costs.observe(8, 2.2);
        batch.head_costs.observe(1, 1e-12);
        batch.running = vec![eagle(0.95), eagle(0.1), eagle(0.5)];
        // the head's drafts below 0.3 kept 20 times in 100 across the batch, from 0.6 on 80: the
        // first drafts, the second none, the third by its record of 50 (their mean would have
        // drafted all or none)
        let kept = |k: usize| Tally { first: (k, 100 - k), later: (0, 0) };
        batch.acceptance[2] = [kept(20), kept(50), kept(80)];
        let mut plan: Vec<Rows> = (0..3).map(|i| Rows::new(i, 1, true)).collect();
        draft(&mut batch, &mut plan, 24, 1024);
        let records: Vec<usize> = plan.iter().map(|r| r.record).collect();
        assert_eq!(records, [2, 0, 1], "the records its outcomes go to");
        let drafted: Vec<usize> = plan.iter().map(|r| r.drafts.len()).collect();
        assert!(drafted[0] > drafted[2] && drafted[2] > 0 && drafted[1] == 0, "{drafted:?}");
        // the records swapped: the other way round
        batch.acceptance[2] = [kept(80), kept(50), kept(20)];
        let drafted = drafts(&mut batch, 24);
        assert!(drafted[1] > drafted[2] && drafted[2] > 0 && drafted[0] == 0, "{drafted:?}");
    }

    #[test]
    fn an_eagle_proposal_is_as_deep_as_its_steps_confidences_pay() {
        // (a record's chances of a first child and of a later sibling: below 0.3, 0.2 and 0.1;
        // 0.3-0.6, 0.5 and 0.2; from 0.6, 0.9 and 0.3)
        let chances = [(0.2, 0.1), (0.5, 0.2), (0.9, 0.3)];
        let records = |p: &[f32]| -> Vec<usize> { p.iter().map(|p| confident(p.ln())).collect() };
        let stays = |shape: &TokenTree, taken: &[usize], p: &[f32], prices: &[f64]| {
            let records = records(p);
            confident_nodes(shape, taken, prices, |n| chances[records[shape.depth(n) - 1]])
        };
        let chain = |p: &[f32], prices: &[f64]| {
            let n = prices.len();
            stays(&TokenTree::chain(1, &[5, 6, 7, 8][..n]), &[1, 2, 3, 4][..n], p, prices)
        };
        // a chain of 4 taken by its first draft's record (0.9 to the depth), each draft at 0.4
        let prices = [0.4; 4];
        // every step confident: 0.9, 0.81, 0.73, 0.66, all of it
        assert_eq!(records(&[0.95, 0.7, 0.5, 0.1]), [2, 2, 1, 0]);
        assert_eq!(chain(&[0.95, 0.7, 0.8, 0.99], &prices), [true; 4]);
        // the third step unsure: 0.9 x 0.9 x 0.2 = 0.16 is not worth 0.4, nor anything below it
        assert_eq!(chain(&[0.95, 0.7, 0.1, 0.99], &prices), [true, true, false, false]);
        // a middling second step: 0.45, then 0.405 pay; 0.36 does not
        assert_eq!(chain(&[0.95, 0.4, 0.9, 0.9], &prices), [true, true, true, false]);
        // depth 1 stays whatever its price (the plan judged it by its own record); a probe's
        // (price 0) too
        assert_eq!(chain(&[0.1, 0.1], &[0.5, 0.0]), [true, true]);
        assert_eq!(chain(&[0.95, 0.1, 0.1], &[0.4, 0.5, 0.0]), [true, false, false]);
        // the head's chain 2 deep with a sibling at each depth: the second step unsure, its
        // draft's chance 0.9 x 0.2 = 0.18 pays 0.1, not 0.2; its sibling's 0.9 x 0.8 x 0.1 =
        // 0.072 does not pay 0.1; the first step's sibling (0.1 x 0.3) stays (depth 1)
        let shape = TokenTree::chain_with_siblings(1, &[5, 6], &[vec![9], vec![3]], 31);
        assert_eq!(shape.parents(), &[0, 0, 1, 0, 1]);
        let taken = [1, 2, 3, 4];
        assert_eq!(stays(&shape, &taken, &[0.95, 0.1], &[0.1, 0.1, 0.5, 0.1]), [true, true, true, false]);
        assert_eq!(stays(&shape, &taken, &[0.95, 0.1], &[0.1, 0.2, 0.5, 0.07]), [true, false, true, true]);
        // a confident second step: its draft 0.81 pays 0.2, its sibling 0.9 x 0.1 x 0.3 not 0.1
        assert_eq!(stays(&shape, &taken, &[0.95, 0.95], &[0.1, 0.2, 0.5, 0.1]), [true, true, true, false]);
        // a sibling whose parent went goes too
        let below = TokenTree::chain_with_siblings(1, &[5, 6, 7], &[vec![], vec![], vec![3]], 31);
        assert_eq!(below.parents(), &[0, 0, 1, 2, 2]);
        assert_eq!(
            stays(&below, &taken, &[0.95, 0.1, 0.95], &[0.1, 0.2, 0.0, 0.0]),
            [true, false, false, false]
        );
    }

    #[test]
    fn an_eagle_sibling_is_judged_by_the_heads_probability_of_it() {
        // (node_chances: a later sibling's chance is its own acceptance after the rejection of
        // each sibling before it, at theirs)
        let mut fan = TokenTree::new(1);
        [4, 5, 6].iter().for_each(|&x| _ = fan.child(0, x));
        let chance = node_chances(&fan, |n| [(1.0, 1.0), (0.5, 0.0), (0.0, 0.25), (0.0, 0.5)][n]);
        assert_eq!(chance, [1.0, 0.5, 0.5 * 0.25, 0.5 * 0.75 * 0.5]);
        // a sibling record is bounded by all the drafts it counts: 90 kept in 1000 is about 0.08,
        // not the capped weight's 0.03 (no row at 2 % of a pass would take it)
        let bound = Tally::pooled_bound((0, 0), (90, 910));
        assert!(bound > 0.07 && bound < 0.09 && Tally::bound((0, 0), (90, 910)) < 0.03, "{bound}");
        // the head's records across the batch: first drafts of 0.3-0.6 kept 50 times in 100;
        // siblings from 0.2 kept 60 times in 100, below 0.1 5 times in 100
        let mut batch = Batch::new(64);
        let kept = |k: usize| (k, 100 - k);
        batch.acceptance[2][1].first = kept(50);
        (batch.acceptance[2][0].later, batch.acceptance[2][2].later) = (kept(5), kept(60));
        // (a pass: 1 s and 0.15 s a row; the head's chain nearly free; 2 siblings beside a step)
        batch.costs.observe(4, 1.6);
        batch.costs.observe(8, 2.2);
        batch.head_costs.observe(1, 1e-12);
        batch.eagle_siblings = 2;
        // the depth 1 siblings the plan takes, by the head's probabilities of its first ranks
        let siblings_taken = |batch: &mut Batch, p: [f32; 3]| {
            let mut s = seq((1..20).collect(), 0, 0);
            let first = Ranked { ids: vec![7, 8, 9], log_probs: p.map(f32::ln).to_vec() };
            let source = Source::Eagle { past: s.n_past, row: Some((0, first)), idle: 0.0 };
            s.drafting = Some(Drafting { source, ngram: None, k_max: 4, fixed: false });
            batch.running = vec![s];
            let mut plan = vec![Rows::new(0, 1, true)];
            draft(batch, &mut plan, 24, 1024);
            let p = plan[0].proposed.as_ref().expect("a tree");
            let sibling = |&&n: &&usize| p.shape.depth(n) == 1 && p.shape.tokens()[n] != ranked(0);
            let taken = &p.order[..plan[0].drafts.len()];
            taken.iter().filter(sibling).map(|&n| rank_of(p.shape.tokens()[n])).collect::<Vec<_>>()
        };
        // a sibling of 0.3 taken (about 0.55 x 0.55), not one of 0.01 beside it; one of 0.05 not
        assert_eq!(siblings_taken(&mut batch, [0.5, 0.3, 0.01]), [Some(1)]);
        assert_eq!(siblings_taken(&mut batch, [0.5, 0.05, 0.01]), []);

        // once drafted: the chain 2 deep, two siblings beside its second draft (0.25 and 0.05;
        // depth 2's record 1, 0.5): the likelier sibling stays at 0.1 a node, the other goes
        let shape = TokenTree::chain_with_siblings(1, &[5, 6], &[vec![], vec![3, 4]], 31);
        assert_eq!(shape.parents(), &[0, 0, 1, 1, 1]);
        let s = &batch.running[0];
        let log_probs = [None, Some(0.5f32), Some(0.5), Some(0.25), Some(0.05)].map(|p| p.map(f32::ln));
        let at = eagle_acceptances(s, &batch.acceptance[2], &shape, &log_probs, |_| 1);
        let stays = confident_nodes(&shape, &[1, 2, 3, 4], &[0.1; 4], |n| at[n]);
        assert_eq!(stays, [true, true, true, false]);
        // not knowing the siblings' probabilities: every sibling record's together (65 in 200),
        // the same for both, between their records'
        let unknown = [None, Some(0.5f32.ln()), Some(0.5f32.ln()), None, None];
        let both = eagle_acceptances(s, &batch.acceptance[2], &shape, &unknown, |_| 1);
        assert!(both[3] == both[4] && both[3].1 > at[4].1 && both[3].1 < at[3].1, "{both:?} {at:?}");
    }

    #[test]
    fn an_eagle_chains_drafts_go_to_their_own_records() {
        let first = |kept: usize, rejected: usize| Tally { first: (kept, rejected), later: (0, 0) };
        let mut r =
            Rows { drafts: vec![4, 5, 6], records: vec![2, 0, 1], record: 2, ..Rows::new(0, 1, true) };
        let outcome = |r: &Rows, choices: &[u32]| {
            let v = Verdict::of(r, choices).expect("a verdict");
            let tallies = r.tallies(&v);
            let mut sum = Tally::default();
            tallies.iter().for_each(|(_, t)| sum.add(t));
            (tallies, sum == v.tally)
        };
        let outcome_split = |r: &Rows, choices: &[u32]| {
            let (tallies, split) = outcome(r, choices);
            assert!(split, "{tallies:?}: the verdict's tally, split");
            tallies
        };
        // the first kept, the second rejected: nothing of the third
        assert_eq!(outcome_split(&r, &[4, 9, 7, 8]), [(2, first(1, 0)), (0, first(0, 1))]);
        assert_eq!(outcome_split(&r, &[4, 5, 6, 1]), [(2, first(1, 0)), (0, first(1, 0)), (1, first(1, 0))]);
        assert_eq!(outcome_split(&r, &[3, 5, 6, 1]), [(2, first(0, 1))]);
        // a chain without its steps' records (another drafter's): all to its record
        r.records.clear();
        assert_eq!(outcome_split(&r, &[4, 9, 7, 8]), [(2, first(1, 1))]);
        // a tree, the head's chain 2 deep with a sibling at each depth, each node by the head's
        // probability of it: the chain's 0.95 and 0.1 (records 2 and 0), the siblings' 0.15 and
        // 0.05 (sibling records 1 and 0)
        let shape = TokenTree::chain_with_siblings(1, &[5, 6], &[vec![9], vec![3]], 31);
        let log_probs = [None, Some(0.95f32), Some(0.1), Some(0.15), Some(0.05)];
        let log_probs = log_probs.iter().map(|p| p.map(f32::ln)).collect();
        let tree = Rows { drafts: vec![5, 6, 9, 3], tree: Some(shape), records: vec![2, 0], log_probs, ..r };
        let later = |kept: usize, rejected: usize| Tally { first: (0, 0), later: (kept, rejected) };
        // the first draft kept, then the second's sibling: a first child rejected, a later one kept
        let kept_sibling = [(2, first(1, 0)), (0, first(0, 1)), (0, later(1, 0))];
        assert_eq!(outcome_split(&tree, &[5, 3, 8, 8, 7]), kept_sibling);
        // nothing kept: depth 1's first child and its sibling (of record 1) rejected
        assert_eq!(outcome_split(&tree, &[4, 3, 8, 8, 7]), [(2, first(0, 1)), (1, later(0, 1))]);
        // the second's sibling at 0.25: its own record 2, not its depth's (0)
        let mut likelier = Rows { log_probs: tree.log_probs.clone(), ..tree };
        likelier.log_probs[4] = Some(0.25f32.ln());
        let kept_sibling = [(2, first(1, 0)), (0, first(0, 1)), (2, later(1, 0))];
        assert_eq!(outcome_split(&likelier, &[5, 3, 8, 8, 7]), kept_sibling);
        // a sibling of no known probability (an ensemble's n-gram node): its outcome nowhere
        likelier.log_probs[4] = None;
        assert_eq!(outcome(&likelier, &[5, 3, 8, 8, 7]), (kept_sibling[..2].to_vec(), false));
        // a first child of none (an n-gram node below the head's): its depth's record
        likelier.log_probs[2] = None;
        likelier.records = vec![2, 1];
        assert_eq!(outcome(&likelier, &[5, 3, 8, 8, 7]).0, [(2, first(1, 0)), (1, first(0, 1))]);
    }

    #[test]
    fn a_trees_later_siblings_are_judged_by_their_own_acceptance() {
        // "1" was followed by "8 9 1", "6 1 8" and "5 7 1": three continuations of the newest 1
        let context = vec![1, 5, 7, 1, 6, 1, 8, 9, 1];
        // (a pass: 1 s and 0.15 s a row)
        let mut batch = Batch::new(64);
        batch.costs.observe(4, 1.6);
        batch.costs.observe(8, 2.2);
        let taken = |batch: &mut Batch, later: (usize, usize)| {
            let mut s = seq(context.clone(), 60, 40);
            let ngram = NGram { branches: 3, ..NGram::default() };
            s.drafting = Some(Drafting { source: Source::NGram(ngram), ngram: None, k_max: 3, fixed: false });
            s.tally.iter_mut().for_each(|t| t.later = later);
            batch.running = vec![s];
            let mut plan = vec![Rows::new(0, 1, true)];
            draft(batch, &mut plan, 24, 1024);
            place_drafts(batch, &mut plan);
            plan[0].drafts.clone()
        };
        // first children kept 60 times in 100, later siblings once in 50: the first branch alone
        // (a sibling credited with the first child's acceptance, 0.55 x 0.45, was taken)
        let chain = taken(&mut batch, (1, 49));
        assert_eq!(chain, [8, 9]);
        // later siblings kept 50 times in 60: the first child's sibling 6 too
        assert!(taken(&mut batch, (50, 10)).contains(&6));
    }

    #[test]
    fn the_marginal_row_is_measured_between_consecutive_passes() {
        let groups: Vec<f64> = (0..=MAX_BATCH).map(|r| r.div_ceil(8) as f64).collect();
        let mut c = PassCosts { groups, ..PassCosts::default() };
        // 1 s and 0.1 s a row; 1 row measured in a slow regime (1.5 times), then passes of 2
        // and 3 rows in a fast one: the averages' line makes a row free
        let secs = |r: usize, regime: f64| regime * (1.0 + 0.1 * r as f64);
        c.observe(1, secs(1, 1.5));
        for r in [2, 3, 2, 3] {
            c.observe(r, secs(r, 1.0));
        }
        assert_eq!(c.fit().expect("a fit").b, 0.0);
        // 5 consecutive pairs (one across the regimes): their median, the row's 0.1 s
        c.observe(2, secs(2, 1.0));
        let f = c.fit().expect("a fit");
        assert!((f.b - 0.1).abs() < 1e-9 && f.c == 0.0, "{} {}", f.b, f.c);
        // passes in different row groups make no pair; the second group's c is fitted after b
        c.observe(9, secs(9, 1.0) + 0.5);
        c.observe(16, secs(16, 1.0) + 0.5);
        let f = c.fit().expect("a fit");
        assert!((f.b - 0.1).abs() < 1e-9 && f.c > 0.0, "{} {}", f.b, f.c);
        assert_eq!(c.pairs.len(), 6);
    }

    #[test]
    fn pass_costs_fit_the_row_groups_where_passes_tell_them_apart() {
        let groups: Vec<f64> = (0..=MAX_BATCH).map(|r| r.div_ceil(8) as f64).collect();
        let secs = |r: usize| 0.002 + 0.012 * r as f64 + 0.05 * groups[r];
        let mut c = PassCosts { groups: groups.clone(), ..PassCosts::default() };
        // row counts of one group: the line (the groups' c is not told apart from a)
        for r in [2, 4, 8] {
            c.observe(r, secs(r));
        }
        let f = c.fit().expect("a fit");
        assert!(f.c == 0.0 && (f.b - 0.012).abs() < 1e-9, "{} {}", f.b, f.c);
        // and a second group: a, b and c, the ninth row dearer than the eighth by a group
        for r in [16, 64] {
            c.observe(r, secs(r));
        }
        let f = c.fit().expect("a fit");
        assert!((f.a - 0.002).abs() < 1e-9 && (f.b - 0.012).abs() < 1e-9 && (f.c - 0.05).abs() < 1e-9);
        assert!((f.seconds(9) - f.seconds(8) - 0.062).abs() < 1e-9 && (f.seconds(8) - secs(8)).abs() < 1e-9);
        // a pass measured costing less with more groups (noise): the line
        c.observe(24, 0.1);
        assert_eq!(c.fit().expect("a fit").c, 0.0);
        // a drafter's costs (no groups): the line
        let mut d = PassCosts::default();
        for r in [2, 16] {
            d.observe(r, secs(r));
        }
        assert_eq!(d.fit().expect("a line").c, 0.0);
    }

    #[test]
    fn drafts_never_open_a_row_group_that_costs_more_than_they_bring() {
        // (a CPU adapter's groups of 8 rows; a pass 2 ms, 12 ms a row, 50 a group: lavapipe's
        // SmolLM2 measured 74 ms at 2 rows, 146 at 8, 207 at 9)
        let pattern: Vec<u32> = [1, 2, 3].repeat(6);
        let groups: Vec<f64> = (0..=MAX_BATCH).map(|r| r.div_ceil(8) as f64).collect();
        let mut batch = Batch::new(64);
        batch.costs.groups = groups.clone();
        for r in [2, 4, 6, 8, 16, 64] {
            batch.costs.observe(r, 0.002 + 0.012 * r as f64 + 0.05 * groups[r]);
        }
        // 8 decoding sequences keeping 99 drafts in 100: a ninth row costs 62 ms for 0.99 of a
        // token where the pass makes 8 in 148 ms: none
        batch.running = (0..8).map(|_| seq(pattern.clone(), 990, 10)).collect();
        assert_eq!(drafts(&mut batch, 56), [0; 8]);
        // the line through the same passes (18 ms a row and 20 a pass) took it
        let fit = std::mem::take(&mut batch.costs.groups);
        assert!(drafts(&mut batch, 56).iter().sum::<usize>() > 0);
        // 4: drafts fill their group (12 ms for 0.99 of a token each) and stop there
        batch.costs.groups = fit;
        batch.running.truncate(4);
        assert_eq!(drafts(&mut batch, 60), [1; 4]);
    }

    #[test]
    fn a_pass_is_priced_by_its_measured_seconds_and_its_drafts_by_the_fit() {
        let cand = Candidate {
            entry: 0,
            proposal: vec![0],
            gains: vec![0.07],
            steps: vec![0],
            each: 0.0,
            first: 0.0,
        };
        let taken = |measured: Option<f64>| {
            let mut plan = vec![Rows::new(0, 1, true)];
            let p = Planned { rows: 1.0, tokens: 1.0, drafting: 0.0, measured };
            let fit = Fit { a: 1.0, b: 0.1, c: 0.0, groups: &[] };
            add_adaptive(&mut plan, std::slice::from_ref(&cand), 8, (Some(fit), 0), p);
            plan[0].drafts.len()
        };
        // the fit's pass of 1.1 s: 0.07 tokens for a row's 0.1 s do not pay
        assert_eq!(taken(None), 0);
        // the pass measured at 2 s (the fit's line pinned by other row counts): they do
        assert_eq!(taken(Some(2.0)), 1);
    }

    #[test]
    fn a_row_count_unmeasured_for_long_runs_without_drafts_and_is_refreshed() {
        let pattern: Vec<u32> = [1, 2, 3].repeat(6);
        let mut batch = Batch::new(64);
        batch.running = vec![seq(pattern, 90, 10)];
        // a pass: 1 s and 0.1 s a row; then passes of 2 and 3 rows only (its drafts')
        batch.costs.observe(1, 1.1);
        batch.costs.observe(2, 1.2);
        for i in 2..STALE_PASSES {
            batch.costs.observe(2 + (i % 2) as usize, 1.0 + 0.1 * (2 + i % 2) as f64);
            assert!(drafts(&mut batch, 24)[0] > 0, "pass {i}");
        }
        // the count without drafts is stale: this plan drafts nothing, and its pass refreshes
        // it, half the way to its seconds
        batch.costs.observe(2, 1.2);
        assert!(batch.costs.stale(1));
        assert_eq!(drafts(&mut batch, 24), [0]);
        batch.costs.observe(1, 1.3);
        assert!(!batch.costs.stale(1));
        assert!((batch.costs.by_rows[1].expect("measured") - 1.2).abs() < 1e-12);
        assert!(drafts(&mut batch, 24)[0] > 0);
    }

    #[test]
    fn drafts_go_where_rows_pay_the_likeliest_first() {
        // (the n-gram proposes the repeated pattern: 8 drafts each)
        let pattern: Vec<u32> = [1, 2, 3].repeat(6);
        let mut batch = Batch::new(64);
        batch.running = vec![seq(pattern.clone(), 90, 10), seq(pattern.clone(), 1, 30), seq(pattern, 0, 0)];
        // costs unknown (no pass measured): no draft, the pass measures its rows
        assert_eq!(drafts(&mut batch, 24), [0, 0, 0]);
        // one row count measured, another than this pass's (3 rows): none either
        batch.costs.observe(5, 1.0);
        assert_eq!(drafts(&mut batch, 24), [0, 0, 0]);
        // this pass's: one draft, the likeliest, the probe that measures another count
        batch.costs = PassCosts::default();
        batch.costs.observe(3, 1.0);
        assert_eq!(drafts(&mut batch, 24), [1, 0, 0]);
        // rows free (a flat line): every proposal, within the budget, likeliest first
        batch.costs.observe(4, 1.0);
        assert_eq!(drafts(&mut batch, 24), [8, 8, 8]);
        assert_eq!(drafts(&mut batch, 9), [8, 0, 1], "the likely one first, then 1/2 over 1/16");
        // rows cost: a + b R with b = a (a row costs a pass's fixed part)
        batch.costs = PassCosts::default();
        for r in [4, 8, 16] {
            batch.costs.observe(r, 1.0 + r as f64);
        }
        let d = drafts(&mut batch, 24);
        assert_eq!(d[1], 0, "an acceptance of 1/16 does not pay: {d:?}");
        assert!(d[0] >= 1 && d[0] > d[2], "{d:?}");
        // rows nearly free: drafts again, as deep as each one's acceptance makes worth it
        let mut batch = Batch { costs: PassCosts::default(), ..batch };
        for r in [4, 8, 16] {
            batch.costs.observe(r, 1.0 + 0.001 * r as f64);
        }
        let d = drafts(&mut batch, 24);
        assert_eq!((d[0], d[1]), (8, 1), "0.06^2 = 0.004 does not pay a thousandth of a pass: {d:?}");
        assert!(d[2] >= 3, "{d:?}");
    }
}
