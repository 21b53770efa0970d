//! Continuous batching: requests share every forward pass of the target (Orca's iteration-level
//! scheduling over vLLM's paged KV cache).
//!
//! ```text
//!   waiting   requests not yet admitted (or preempted), oldest first
//!   running   sequences with pages of the target's KV cache pool, in admission order
//!   a pass    1. each decoding sequence: its last token (1 row)
//!             2. sequences still prefilling: a chunk of their prompt, within the pass's rows
//!             3. rows left: n-gram drafts after decoding sequences' last tokens
//!             one target pass over all of them (Model::forward_pages), the argmax of each row
//!   commit    per sequence: the drafts the argmax agrees with, then the argmax's own token;
//!             finished sequences return their pages before the next pass
//! ```
//!
//! A sequence is admitted when the pool has pages for its tokens and it has a place among
//! `max_seqs`. A decoding sequence that needs a new page and finds none preempts the youngest
//! running sequence: its pages return to the pool and it waits at the head of the queue, to run
//! its tokens (prompt and generated) again when admitted. Every row of a pass reads only its own
//! sequence's keys and the kernels are batch-invariant, so a request's tokens are, bit for bit,
//! those of its run alone ([`Engine::generate`](super::Engine::generate)) whatever shares its
//! passes, in whatever order requests arrive, preempted or not.

use std::collections::VecDeque;

use serde::Serialize;
use web_time::Instant;

use super::prompt::TextStream;
use super::request::{Completion, Request, TokenEvent};
use crate::error::{Error, Result};
use crate::generation::FinishReason;
use crate::gpu::KV_PAGE;
use crate::model::{Model, SeqRows, MAX_BATCH};
use crate::speculative::{DraftKind, NGram, SpecStats};
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

/// The batch in figures (the server's `/metrics`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct BatchStatus {
    pub running: usize,
    pub waiting: usize,
    /// Pages of the pool held by running sequences, and free.
    pub pages_used: usize,
    pub pages_free: usize,
    /// Passes run, rows they held (prompt chunks, decoding tokens, drafts) and sequences
    /// preempted, since the engine was made.
    pub passes: u64,
    pub rows: u64,
    pub preemptions: u64,
}

/// One request's state.
struct Seq {
    id: SeqId,
    /// The prompt and every committed token; positions `..n_past` are in its pages.
    tokens: Vec<u32>,
    prompt_len: usize,
    n_past: usize,
    pages: Vec<u32>,
    max_tokens: usize,
    /// Per generated token: whether it was an accepted draft.
    from_draft: Vec<bool>,
    text: TextStream,
    /// Its n-gram drafter and the most drafts a pass verifies (none: plain decoding).
    ngram: Option<(NGram, usize)>,
    stats: SpecStats,
    /// When it was first admitted, and when its first token came.
    admitted: Option<Instant>,
    first_token: Option<Instant>,
}

impl Seq {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Pages its positions `..end` take.
    fn pages_for(end: usize) -> usize {
        end.div_ceil(KV_PAGE)
    }
}

/// The rows one sequence has in a pass: its tokens `n_past..n_past + run` (`pending`: all it has
/// not run, the last of them its newest token), then `drafts`.
struct Rows {
    seq: usize,
    run: usize,
    pending: bool,
    drafts: Vec<u32>,
}

/// The engine's batch of requests ([`Engine::batch_submit`](super::Engine::batch_submit)).
pub(super) struct Batch {
    /// Free pages of the pool, the lowest last.
    free: Vec<u32>,
    pool: usize,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    next_id: u64,
    pub(super) limits: BatchLimits,
    status: BatchStatus,
}

impl Batch {
    pub(super) fn new(pool: usize) -> Batch {
        Batch {
            free: (0..pool as u32).rev().collect(),
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 0,
            limits: BatchLimits::default(),
            status: BatchStatus::default(),
        }
    }

    /// Whether no request is waiting or running.
    pub(super) fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    pub(super) fn status(&self) -> BatchStatus {
        BatchStatus {
            running: self.running.len(),
            waiting: self.waiting.len(),
            pages_used: self.pool - self.free.len(),
            pages_free: self.free.len(),
            ..self.status
        }
    }

    /// Queues a request whose prompt is tokenized and checked (see [`Batch::check`]).
    pub(super) fn submit(&mut self, prompt: Vec<u32>, req: &Request, draft: DraftKind) -> SeqId {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        let ngram = (draft == DraftKind::Ngram).then(|| {
            let k = req.draft_k.unwrap_or(req.max_draft_k).min(MAX_BATCH - 1);
            (NGram::default(), k)
        });
        let stats = SpecStats { draft, base: crate::generation::Stats::default(), ..SpecStats::default() };
        self.waiting.push_back(Seq {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            n_past: 0,
            pages: Vec::new(),
            max_tokens: req.max_tokens,
            from_draft: Vec::new(),
            text: TextStream::new(&req.stop),
            ngram,
            stats,
            admitted: None,
            first_token: None,
        });
        id
    }

    /// Takes a request out, waiting or running, its pages back to the pool; false if it is not
    /// there (it ended).
    pub(super) fn cancel(&mut self, id: SeqId) -> bool {
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i);
            return true;
        }
        match self.running.iter().position(|s| s.id == id) {
            Some(i) => {
                let s = self.running.remove(i);
                self.free.extend(s.pages.into_iter().rev());
                true
            }
            None => false,
        }
    }

    /// Admits waiting sequences, oldest first, while there is a place and the pool holds their
    /// tokens and the position after them.
    fn admit(&mut self) {
        while self.running.len() < self.limits.max_seqs.clamp(1, MAX_BATCH) {
            let Some(s) = self.waiting.front() else { break };
            let need = Seq::pages_for(s.tokens.len() + 1);
            if need > self.free.len() {
                break;
            }
            let Some(mut s) = self.waiting.pop_front() else { break };
            s.pages = (0..need).filter_map(|_| self.free.pop()).collect();
            s.admitted.get_or_insert_with(Instant::now);
            self.running.push(s);
        }
    }

    /// Gives running sequence `i` pages up to position `end` (exclusive), preempting the
    /// youngest other sequences while the pool has none left when `preempt`; false if it could
    /// not (then it holds what it had).
    fn grow(&mut self, i: usize, end: usize, preempt: bool) -> bool {
        while self.running[i].pages.len() < Seq::pages_for(end) {
            match self.free.pop() {
                Some(p) => self.running[i].pages.push(p),
                None if preempt && self.running.len() > i + 1 => self.preempt_youngest(),
                None => return false,
            }
        }
        true
    }

    /// The youngest running sequence gives its pages back and waits at the head of the queue,
    /// to run all its tokens again.
    fn preempt_youngest(&mut self) {
        if let Some(mut s) = self.running.pop() {
            self.free.extend(s.pages.drain(..).rev());
            s.n_past = 0;
            self.waiting.push_front(s);
            self.status.preemptions += 1;
        }
    }
}

/// Runs one pass of the batch on `target`: admits what fits, plans every running sequence's
/// rows, runs them, commits. Returns each request's events of the pass, in order (nothing when
/// the batch is idle). An error of the pass itself (the GPU) is returned: it leaves every running
/// sequence where it was.
pub(super) async fn step(
    batch: &mut Batch,
    target: &mut Model,
    tokenizer: &Tokenizer,
) -> Result<Vec<(SeqId, BatchEvent)>> {
    let mut events = Vec::new();
    let context = target.context();
    // sequences at the context's end or their max_tokens (a preempted one may come back there)
    // end before they take rows
    batch.admit();
    let mut i = 0;
    while i < batch.running.len() {
        let s = &batch.running[i];
        let decoding = s.n_past + 1 == s.tokens.len();
        if decoding && (s.n_past >= context || s.generated() >= s.max_tokens) {
            let s = batch.running.remove(i);
            finish(batch, s, FinishReason::Length, tokenizer, &mut events);
            continue;
        }
        i += 1;
    }
    batch.admit();
    let plan = plan(batch, context);
    if plan.is_empty() {
        return Ok(events);
    }
    // each sequence's rows: its tokens not yet run, then its drafts
    let rows: Vec<Vec<u32>> = plan
        .iter()
        .map(|r| {
            let s = &batch.running[r.seq];
            s.tokens[s.n_past..s.n_past + r.run].iter().chain(&r.drafts).copied().collect()
        })
        .collect();
    let seqs: Vec<SeqRows> = plan
        .iter()
        .zip(&rows)
        .map(|(r, tokens)| {
            let s = &batch.running[r.seq];
            SeqRows { pages: &s.pages, start_pos: s.n_past, tokens }
        })
        .collect();
    let argmax = target.forward_pages_argmax(&seqs).await?;
    batch.status.passes += 1;
    batch.status.rows += argmax.len() as u64;
    let mut at = 0;
    let mut ended = Vec::new();
    for r in &plan {
        let rows = r.run + r.drafts.len();
        let out = &argmax[at..at + rows];
        at += rows;
        let s = &mut batch.running[r.seq];
        s.stats.base.target_forwards += 1;
        if !r.pending {
            s.n_past += r.run;
            continue;
        }
        if let Some(reason) = commit(s, r, &out[r.run - 1..], tokenizer, &mut events) {
            ended.push((r.seq, reason));
        }
    }
    for &(i, reason) in ended.iter().rev() {
        let s = batch.running.remove(i);
        finish(batch, s, reason, tokenizer, &mut events);
    }
    Ok(events)
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
            if !batch.grow(i, end, true) {
                // (the youngest itself, and no other to preempt: it waits for pages)
                batch.preempt_youngest();
                break;
            }
            plan.push(Rows { seq: i, run: 1, pending: true, drafts: Vec::new() });
            budget -= 1;
        }
        i += 1;
    }
    // 2. prompt chunks (their pages were taken at admission)
    for (i, s) in batch.running.iter().enumerate() {
        let left = s.tokens.len() - s.n_past;
        if left > 1 && budget > 0 {
            let run = left.min(budget);
            budget -= run;
            plan.push(Rows { seq: i, run, pending: run == left, drafts: Vec::new() });
        }
    }
    // 3. drafts after the newest tokens, in the rows left, as far as the sequence's pages go
    for r in plan.iter_mut().filter(|r| r.pending) {
        let s = &batch.running[r.seq];
        let Some((ngram, k_max)) = &s.ngram else { continue };
        let last = s.n_past + r.run; // the position after the newest token
        let remaining = s.max_tokens.saturating_sub(s.generated());
        let room = (s.pages.len() * KV_PAGE).min(context).saturating_sub(last);
        let k = (*k_max).min(budget).min(room).min(remaining.saturating_sub(1));
        if k > 0 {
            r.drafts = ngram.lookup(&s.tokens, k);
            budget -= r.drafts.len();
        }
    }
    plan.sort_by_key(|r| r.seq);
    plan
}

/// Commits a sequence's pass: `out` holds the argmax of its newest token's row, then of its
/// drafts' rows. Keeps the drafts the argmax agrees with, then the argmax's token; each token
/// checked as the one-sequence loop checks it. Returns why the sequence ends, if it does.
fn commit(
    s: &mut Seq,
    r: &Rows,
    out: &[u32],
    tokenizer: &Tokenizer,
    events: &mut Vec<(SeqId, BatchEvent)>,
) -> Option<FinishReason> {
    let accepted = r.drafts.iter().zip(out).take_while(|(d, o)| d == o).count();
    let st = &mut s.stats;
    st.verify_forwards += 1;
    st.drafted += r.drafts.len();
    st.accepted += accepted;
    if !r.drafts.is_empty() {
        st.mean_k += r.drafts.len() as f64; // (a sum until the end)
    }
    s.n_past = s.tokens.len() + accepted;
    let now = Instant::now();
    s.first_token.get_or_insert(now);
    let new = r.drafts[..accepted].iter().map(|&x| (x, true)).chain([(out[accepted], false)]);
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
        if s.text.stopped() || tokenizer.eos_ids().contains(&tok) {
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
fn finish(
    batch: &mut Batch,
    mut s: Seq,
    reason: FinishReason,
    tokenizer: &Tokenizer,
    events: &mut Vec<(SeqId, BatchEvent)>,
) {
    batch.free.extend(s.pages.drain(..).rev());
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
