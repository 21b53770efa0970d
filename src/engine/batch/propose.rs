//! A draft model's proposals for the batch: its passes over the rows of every sequence that
//! drafts with it this time, in pages of its own pool, before the target's pass verifies them.
//!
//! ```text
//!   feeding     while the drafting sequences' unseen tokens (those the draft has not computed)
//!               are more than a pass holds: passes of their unseen tokens but the newest (at
//!               most FEED_PASSES a step: a sequence still behind then drafts none this time,
//!               and is fed further the next)
//!   pass 1      each drafting sequence: its unseen tokens, the newest last (its row's argmax,
//!               or a sampled request's draw: x1)
//!   pass j      each sequence drafting j or more: x_(j-1) (one row; argmax or draw: x_j)
//! ```
//!
//! The plan chose how many drafts each sequence takes (placeholders until here); a sequence
//! whose draft pages cannot be had drafts none this time. Only drafting sequences run: a
//! sequence that drafts after plain passes first catches up on the tokens it did not see. Its
//! proposals are the chains the one-sequence loop's draft model proposes (its cache caught up and
//! rolled back the same way; where that loop drafts the draft's trees, `tree:N:DRAFT`, the batch
//! still drafts chains): greedy argmaxes, or a sampled request's draws with the noise its target
//! rows draw with at the same positions (its draws on the draft's rows, `Seq::draft_draw`).
//! Either way the target's rows keep them where they equal their argmax or draw, so a request's
//! tokens do not depend on them.
//!
//! An EAGLE head's proposals for the batch: after each commit, one head pass over the kept rows
//! of every sequence drafting with it ([`follow`]: the target's features of the pass, each with
//! the token after it, in the head's pages of the ids of the sequence's target pages; each
//! sequence's last row projected and ranked in the same submission: x1 and the head's
//! probability of it, read before the next plan ([`take_firsts`]), which judges its drafts by
//! it); before the next target pass, the chains of those drafting this time
//! ([`propose_eagle`]: from x1, one-row steps per sequence drafting more than one, all in one
//! submission, each step's ranked ids and the head's probability of the first read back). A
//! sequence the head has not followed through the token before its newest drafts none. Its chains
//! are the one-sequence loop's EAGLE chains, with up to [`super::Drafters::eagle_siblings`] of
//! each step's next likeliest ids beside them (a tree: the loop's `EagleTree::Chain`; where that
//! loop grows EAGLE-2's dynamic trees, the batch grows these), as deep as each step's
//! confidence still pays for an adaptive K (EAGLE-2's dynamic depth: [`super::confident_nodes`]);
//! a tree's accepted path gives the rows the head's next pass follows ([`before_commit`]).
//!
//! The Medusa heads' proposals ([`propose_medusa`]): each head's ranked ids at every drafting
//! sequence's row of the pass before (the position before its newest token, [`medusa_rows`]: a
//! tree's accepted path's last node's), up to [`MEDUSA_ROWS`] rows per run of the heads, in
//! Medusa's tree of their paths (its nodes the plan took). Both are deterministic drafts, kept
//! where a row's choice (argmax or draw) equals them.

use web_time::Instant;

use super::{
    confident, confident_nodes, eagle_acceptances, read_pass, Batch, Drafting, Draw, DrawAt, Outcome,
    PassCosts, Proposed, Readback, Rows, Seq, SeqId, Source, Verdict, EAGLE_PATIENCE,
};
use crate::error::{Error, Result};
use crate::gpu::KV_PAGE;
use crate::model::{EagleHead, HeadChain, HeadRows, Model, Ranked, SeqRows, MAX_BATCH, MEDUSA_ROWS};
use crate::speculative::{Medusa, TokenTree};

/// Most feeding passes in one step (each of up to [`MAX_BATCH`] rows): a long prompt found in
/// the prefix cache, or a sequence that drafts for the first time after a long prompt, is fed
/// over several steps rather than holding every request's pass back for all of it.
const FEED_PASSES: usize = 4;

/// Fills the plan's draft placeholders of the sequences drafting with `draft` (the engine's
/// draft model, whose pool `batch.draft_pool` hands out).
pub(super) async fn propose(batch: &mut Batch, draft: &mut Model, plan: &mut [Rows]) -> Result<()> {
    take_pages(batch, plan);
    if drafting(batch, plan).next().is_none() {
        return Ok(());
    }
    // (from the first pass on, the draft's cache holds nothing the one-sequence loop knows)
    batch.draft_used = true;
    feed(batch, draft, plan).await?;
    // pass 1: each drafting sequence's unseen tokens; x1 from its last row
    let rows: Vec<(usize, usize, usize)> =
        drafting(batch, plan).map(|(entry, past, tokens)| (entry, past, tokens.len())).collect();
    let out = catch_up(batch, draft, plan, &rows, true).await?;
    let mut chains: Vec<(usize, Vec<u32>)> = rows.iter().zip(out).map(|(r, x1)| (r.0, vec![x1])).collect();
    // passes 2..: the chains that want more, one row each
    loop {
        let more: Vec<usize> =
            (0..chains.len()).filter(|&j| chains[j].1.len() < steps(&plan[chains[j].0])).collect();
        if more.is_empty() {
            break;
        }
        let rows: Vec<(usize, usize, u32)> = (more.iter())
            .map(|&j| {
                let (entry, chain) = &chains[j];
                let len = batch.running[plan[*entry].seq].tokens.len();
                (*entry, len + chain.len() - 1, chain[chain.len() - 1])
            })
            .collect();
        let tokens: Vec<[u32; 1]> = rows.iter().map(|&(_, _, t)| [t]).collect();
        let running = &batch.running;
        let seqs: Vec<SeqRows> = (rows.iter().zip(&tokens))
            .map(|(&(entry, pos, _), t)| SeqRows {
                pages: model_pages(&running[plan[entry].seq]),
                start_pos: pos,
                tokens: t,
                tree: None,
                logits: 1,
            })
            .collect();
        let draws = draft_draws(running, plan, rows.iter().map(|r| r.0));
        let rb = batch.draft_readback.as_ref();
        let out = timed(&mut batch.draft_costs, (draft, rb), &seqs, &draws).await?;
        for ((&j, &(entry, pos, _)), &next) in more.iter().zip(&rows).zip(&out) {
            set_past(batch, plan, entry, pos + 1);
            chains[j].1.push(next);
        }
    }
    for (entry, chain) in chains {
        let r = &mut plan[entry];
        match &mut r.proposed {
            // (an ensemble's tree: its chain's nodes get the draft's tokens)
            Some(p) => p.fill(&chain.iter().map(|&x| vec![x]).collect::<Vec<_>>()),
            None => r.drafts = chain,
        }
    }
    Ok(())
}

/// The draft pages of each drafting sequence (the positions its passes write: up to its
/// newest token and its chain's drafts but the last), or, where the pool has none left, no
/// drafts.
/// A drafting sequence's newest token's row gives x1, even where the draft ran it before.
fn take_pages(batch: &mut Batch, plan: &mut [Rows]) {
    for r in plan.iter_mut().filter(|r| r.pending && !r.drafts.is_empty()) {
        let Batch { running, draft_pool, .. } = &mut *batch;
        let s = &mut running[r.seq];
        let len = s.tokens.len();
        if let Some(Drafting { source: Source::Model { pages, past }, fixed, .. }) = &mut s.drafting {
            if grow(draft_pool, pages, len + steps(r).max(1) - 1) {
                *past = (*past).min(len - 1);
            } else {
                drop_drafts(r, *fixed);
            }
        }
    }
}

/// The drafting sequences (plan entry, their draft's computed positions, their tokens).
fn drafting<'a>(batch: &'a Batch, plan: &'a [Rows]) -> impl Iterator<Item = (usize, usize, &'a [u32])> + 'a {
    (plan.iter().enumerate()).filter(|(_, r)| r.pending && !r.drafts.is_empty()).filter_map(|(entry, r)| {
        let s = &batch.running[r.seq];
        match &s.drafting {
            Some(Drafting { source: Source::Model { past, .. }, .. }) => Some((entry, *past, &s.tokens[..])),
            _ => None,
        }
    })
}

/// Feeding passes (see the module's doc), until the drafting sequences' unseen tokens fit one
/// pass; then, past [`FEED_PASSES`], the sequences furthest behind draft none this time.
async fn feed(batch: &mut Batch, draft: &mut Model, plan: &mut [Rows]) -> Result<()> {
    for _ in 0..FEED_PASSES {
        let unseen: usize = drafting(batch, plan).map(|(_, past, tokens)| tokens.len() - past).sum();
        if unseen <= MAX_BATCH {
            return Ok(());
        }
        let mut room = MAX_BATCH;
        let mut rows = Vec::new();
        for (entry, past, tokens) in drafting(batch, plan) {
            let end = (tokens.len() - 1).min(past + room);
            if end > past {
                room -= end - past;
                rows.push((entry, past, end));
            }
        }
        catch_up(batch, draft, plan, &rows, false).await?;
    }
    let mut behind: Vec<(usize, usize)> =
        drafting(batch, plan).map(|(entry, past, tokens)| (tokens.len() - past, entry)).collect();
    behind.sort_unstable();
    let mut unseen: usize = behind.iter().map(|b| b.0).sum();
    while unseen > MAX_BATCH {
        let Some((n, entry)) = behind.pop() else { break };
        let fixed = batch.running[plan[entry].seq].drafting.as_ref().is_some_and(|d| d.fixed);
        drop_drafts(&mut plan[entry], fixed);
        unseen -= n;
    }
    Ok(())
}

/// One pass of the draft over its sequences' own tokens, `rows` (plan entry, first position,
/// end): with `last`, each sequence's last row's argmax, or its draw where it samples (see
/// [`timed`]; without, no logits); the draft has then computed each sequence's positions up to
/// `end`.
async fn catch_up(
    batch: &mut Batch,
    draft: &mut Model,
    plan: &[Rows],
    rows: &[(usize, usize, usize)],
    last: bool,
) -> Result<Vec<u32>> {
    let running = &batch.running;
    let seqs: Vec<SeqRows> = (rows.iter())
        .map(|&(entry, start, end)| {
            let s = &running[plan[entry].seq];
            let (tokens, logits) = (&s.tokens[start..end], last as usize);
            SeqRows { pages: model_pages(s), start_pos: start, tokens, tree: None, logits }
        })
        .collect();
    let draws = match last {
        true => draft_draws(running, plan, rows.iter().map(|r| r.0)),
        false => Vec::new(),
    };
    let rb = batch.draft_readback.as_ref();
    let out = timed(&mut batch.draft_costs, (draft, rb), &seqs, &draws).await?;
    for &(entry, _, end) in rows {
        set_past(batch, plan, entry, end);
    }
    Ok(out)
}

/// A sequence drafts none this time: an adaptive K asks none (a fixed K is still the K asked,
/// as where rows or pages cut a fixed K's drafts short).
fn drop_drafts(r: &mut Rows, fixed: bool) {
    r.drafts.clear();
    if !fixed {
        r.asked = 0;
    }
}

/// Gives a sequence draft pages up to position `end` (exclusive) from `pool`; false where they
/// ran out (it keeps what it took).
fn grow(pool: &mut super::Pool, pages: &mut Vec<u32>, end: usize) -> bool {
    while pages.len() < end.div_ceil(KV_PAGE) {
        match pool.take() {
            Some(p) => pages.push(p),
            None => return false,
        }
    }
    true
}

/// A sequence's draft pages.
fn model_pages(s: &Seq) -> &[u32] {
    match &s.drafting {
        Some(Drafting { source: Source::Model { pages, .. }, .. }) => pages,
        _ => &[],
    }
}

/// The draft has computed the positions of plan entry `entry`'s sequence up to `past`.
fn set_past(batch: &mut Batch, plan: &[Rows], entry: usize, to: usize) {
    if let Some(Drafting { source: Source::Model { past, .. }, .. }) =
        &mut batch.running[plan[entry].seq].drafting
    {
        *past = to;
    }
}

/// The draws on the draft's rows of the sequences of plan entries `entries` (none: greedy).
fn draft_draws<'a>(
    running: &'a [Seq],
    plan: &[Rows],
    entries: impl Iterator<Item = usize>,
) -> Vec<Option<&'a Draw>> {
    entries.map(|entry| running[plan[entry].seq].draft_draw.as_ref()).collect()
}

/// One pass of the draft model over `seqs`, its seconds measured: the argmax of each row that
/// wants logits (each sequence's last, or none), but where a sequence has a draw in `draws` (by
/// sequence; none past its end) that draw. (A draft row's non-finite logits fail no request, as
/// its argmax does not: the target's rows decide every token; the draw is still a token of the
/// vocabulary.)
async fn timed(
    costs: &mut PassCosts,
    (draft, readback): (&mut Model, Option<&Readback>),
    seqs: &[SeqRows<'_>],
    draws: &[Option<&Draw>],
) -> Result<Vec<u32>> {
    let rows = seqs.iter().map(|s| s.tokens.len()).sum();
    // (the rows with logits: each sequence's last `logits`; a draw in its last)
    let mut at = Vec::new();
    let mut end = 0;
    for (slot, s) in seqs.iter().enumerate() {
        end += s.logits;
        if let (Some(&Some(draw)), true) = (draws.get(slot), s.logits > 0) {
            at.push(DrawAt { draw, row0: end - 1, rows: 1, slot });
        }
    }
    let t0 = Instant::now();
    let enc = draft.encode_pages(seqs, true)?;
    let out = read_pass(draft, readback, enc, &at, end).await?;
    costs.observe(rows, t0.elapsed().as_secs_f64());
    let mut ids: Vec<u32> = (0..end).map(|row| out.argmax(row)).collect();
    for a in &at {
        ids[a.row0] = out.draw(a.row0).unwrap_or(ids[a.row0]);
    }
    let vocab = draft.config.vocab_size;
    match ids.iter().find(|&&x| x as usize >= vocab) {
        Some(bad) => Err(Error::Gpu(format!("the draft's GPU chose token {bad} of a vocabulary of {vocab}"))),
        None => Ok(ids),
    }
}

/// Fills the plan's draft placeholders of the sequences drafting with the EAGLE `head` (the
/// engine's): their chains and the siblings beside them, from their last rows of the head's
/// latest pass, in the head's pages of the ids of their target pages (free ones taken for the
/// draft steps' positions, never a preemption: drafts past them are dropped).
pub(super) async fn propose_eagle(batch: &mut Batch, head: &mut EagleHead, plan: &mut [Rows]) -> Result<()> {
    // (plan entry, and the head's row, past and first draft's ranks of its sequence)
    let mut asks: Vec<(usize, usize, usize, Ranked)> = Vec::new();
    for (entry, r) in plan.iter_mut().enumerate() {
        let eagle = batch.running[r.seq].drafting.as_ref().is_some_and(Drafting::is_eagle);
        if !r.pending || r.drafts.is_empty() || !eagle {
            continue;
        }
        // (the draft steps' positions: its newest token's and the chain's but the last)
        let n_past = batch.running[r.seq].n_past;
        if batch.running[r.seq].eagle_ready() {
            batch.take_free(r.seq, n_past + steps(r) - 1);
        }
        let s = &batch.running[r.seq];
        let room = (s.pages.len() * KV_PAGE + 1).saturating_sub(n_past);
        let cut = match &r.proposed {
            // (a tree's nodes up to the first deeper than the steps the pages hold)
            Some(p) => p.order.iter().take_while(|&&n| p.shape.depth(n) <= room).count(),
            None => room,
        };
        r.drafts.truncate(cut);
        match (&s.drafting, s.eagle_ready()) {
            // (an ensemble's tree of the n-gram's nodes alone needs no step of the head)
            (Some(Drafting { source: Source::Eagle { row: Some((row, first)), past, .. }, .. }), true)
                if !r.drafts.is_empty() =>
            {
                if steps(r) > 0 {
                    asks.push((entry, *row, *past, first.clone()))
                }
            }
            // (an ensemble's n-gram nodes while the head cannot draft: kept)
            _ if r.proposed.is_some() && steps(r) == 0 => {}
            (d, _) => drop_drafts(r, d.as_ref().is_some_and(|d| d.fixed)),
        }
    }
    if asks.is_empty() {
        return Ok(());
    }
    // (from the first pass on, the head's cache holds nothing the one-sequence loop knows)
    batch.head_used = true;
    let chains: Vec<HeadChain> = (asks.iter())
        .map(|(entry, row, past, first)| {
            let (pages, drafts) = (&batch.running[plan[*entry].seq].pages, steps(&plan[*entry]));
            HeadChain { pages, past: *past, row: *row, first, drafts }
        })
        .collect();
    // (the head's step rows: a chain's first draft was ranked in its follow, and a chain of one
    // needs no submission)
    let steps: usize = chains.iter().map(|c| c.drafts - 1).sum();
    let t0 = Instant::now();
    let out = head.draft_pages(&chains).await;
    // (its draft steps wrote over the rows of the head's latest pass: drafting again needs the
    // next one, whatever happens to this pass)
    forget_rows(batch, Drafting::is_eagle);
    let out = out?;
    if steps > 0 {
        batch.head_costs.observe(steps, t0.elapsed().as_secs_f64());
        batch.status.head_step_rows += steps as u64;
        batch.status.head_step_passes += 1;
    }
    for (&(entry, ..), ranked) in asks.iter().zip(out) {
        let r = &mut plan[entry];
        let s = &batch.running[r.seq];
        let Some(d) = &s.drafting else { continue };
        // (each depth's record by the confidence of its step, and each node's probability: its
        // chances now, and where its outcome goes; an adaptive K's nodes stay where they still
        // pay: confident_nodes)
        r.records = ranked.iter().map(|step| confident(step.confidence())).collect();
        let (records, first, pooled) = (&r.records, r.record, &batch.acceptance[d.drafter()]);
        let depth_record = |depth: usize| records.get(depth - 1).copied().unwrap_or(first);
        let (adaptive, asked) = (!r.prices.is_empty(), r.drafts.len());
        match &mut r.proposed {
            // (a tree: its shape's nodes get the steps' ids; those that stay are taken first)
            Some(p) => {
                p.fill(&ranked.iter().map(|step| step.ids.clone()).collect::<Vec<_>>());
                p.log_probs = Proposed::ranked_log_probs(&p.shape, &ranked);
                if adaptive {
                    let n = r.drafts.len().min(p.order.len());
                    let at = eagle_acceptances(s, pooled, &p.shape, &p.log_probs, depth_record);
                    let stays = confident_nodes(&p.shape, &p.order[..n], &r.prices, |n| at[n]);
                    r.drafts.truncate(p.keep(&stays));
                }
            }
            None => {
                let chain: Vec<u32> = ranked.iter().map(|step| step.ids[0]).collect();
                let taken: Vec<usize> = (1..=chain.len()).collect();
                let shape = TokenTree::chain(0, &chain);
                let stays = match adaptive {
                    // (a chain's nodes are its steps' drafts: each depth's record is its own)
                    true => {
                        let at = eagle_acceptances(s, pooled, &shape, &[], depth_record);
                        confident_nodes(&shape, &taken, &r.prices, |n| at[n])
                    }
                    false => vec![true; chain.len()],
                };
                r.drafts =
                    chain.into_iter().zip(stays).take_while(|&(_, stays)| stays).map(|(t, _)| t).collect();
            }
        }
        batch.status.drafts_cut += (asked - r.drafts.len()) as u64;
    }
    Ok(())
}

/// The EAGLE draft steps plan entry `r`'s drafts take: a chain's drafts, or its tree's deepest
/// node taken.
fn steps(r: &Rows) -> usize {
    match &r.proposed {
        Some(p) => p.steps(r.drafts.len()),
        None => r.drafts.len(),
    }
}

/// What [`follow`] and [`medusa_rows`] need of a pass before its commit: per sequence drafting
/// with the EAGLE head or the Medusa heads, its id, its computed positions, and the pass rows of
/// its positions from there on that its commit may keep (its tokens run, then its chain's
/// drafts, or its tree's accepted path: `outcomes`, each plan entry's).
pub(super) fn before_commit(batch: &Batch, plan: &[Rows], outcomes: &[Outcome]) -> Vec<Before> {
    let mut first = 0;
    let mut before = Vec::new();
    for (r, outcome) in plan.iter().zip(outcomes) {
        let s = &batch.running[r.seq];
        if s.drafting.as_ref().is_some_and(|d| d.is_eagle() || d.is_medusa()) {
            let rows: Vec<u32> = match outcome {
                Outcome::Chosen(Verdict { path: Some(path), .. }) => (first..first + r.run - 1)
                    .chain(path.iter().map(|&n| first + r.run - 1 + n))
                    .map(|row| row as u32)
                    .collect(),
                _ => (first..first + r.run + r.drafts.len()).map(|row| row as u32).collect(),
            };
            before.push((s.id, s.n_past, rows));
        }
        first += r.run + r.drafts.len();
    }
    before
}

/// A sequence's id, its computed positions before a commit, and the pass rows of its positions
/// from there on ([`before_commit`]).
pub(super) type Before = (SeqId, usize, Vec<u32>);

/// The EAGLE head's pass over the kept rows of the pass just committed, of every running
/// sequence drafting with it that it has followed so far (`before`: [`before_commit`]'s): each
/// row the target's feature at a position and the token after it. Each such sequence's last
/// row of it is where its next chain starts, its first draft ranked there (with the head's
/// log-probability of it, the record its drafts go to: [`Drafting::record`]; read by
/// [`take_firsts`], the GPU running the pass meanwhile); each page whose positions it has now
/// all run records the token after it (the prefix cache can then give its head part too). The others
/// cannot draft until they come back (preempted ones), or for the rest of their run: their
/// adaptive K's drafts did not pay for [`EAGLE_PATIENCE`] such passes. Returns the rows it ran.
pub(super) fn follow(batch: &mut Batch, head: &mut EagleHead, before: &[Before]) -> usize {
    // (plan entry's sequence, its first kept position, its rows of the pass, rows kept)
    let mut kept: Vec<(usize, usize, &[u32], usize)> = Vec::new();
    for (i, s) in batch.running.iter_mut().enumerate() {
        let n_past = s.n_past;
        let Some(Drafting { source: Source::Eagle { past, row, idle }, .. }) = &mut s.drafting else {
            continue;
        };
        // (the head's latest pass will not be this one's for a sequence it does not follow)
        *row = None;
        let Some((_, old, rows)) = before.iter().find(|b| b.0 == s.id) else { continue };
        if *idle < EAGLE_PATIENCE as f64 && *past == *old && n_past > *old {
            kept.push((i, *old, rows, n_past - old));
        }
    }
    if kept.is_empty() {
        return 0;
    }
    batch.head_used = true;
    let running = &batch.running;
    let seqs: Vec<HeadRows> = (kept.iter())
        .map(|&(i, old, rows, n)| {
            let s = &running[i];
            HeadRows {
                pages: &s.pages,
                start_pos: old,
                rows: &rows[..n],
                next: &s.tokens[old + 1..old + 1 + n],
            }
        })
        .collect();
    let ran = head.run_pages(&seqs);
    // (the rows are the target pass's own, in the pages of its committed positions: nothing to
    // refuse)
    debug_assert!(ran.is_ok(), "{ran:?}");
    if ran.is_err() {
        return 0;
    }
    let mut at = 0;
    for &(i, old, _, n) in &kept {
        at += n;
        let s = &mut batch.running[i];
        if let Some(Drafting { source: Source::Eagle { past, .. }, .. }) = &mut s.drafting {
            *past = old + n;
            batch.firsts_pending.push((s.id, at - 1));
        }
        // (page j's last position is (j + 1) KV_PAGE - 1; the token after it is known)
        for j in old / KV_PAGE..(old + n) / KV_PAGE {
            batch.pool.head_computed(s.pages[j], s.tokens[(j + 1) * KV_PAGE]);
        }
    }
    at
}

/// The first drafts of the head's latest [`follow`] (waiting for its pass): each sequence it
/// followed that is still running takes its last row of that pass and its first draft, and
/// can draft. A failed read-back (the GPU's error, which the next pass shows) leaves them
/// unable to draft until the next follow.
pub(super) async fn take_firsts(batch: &mut Batch, head: &EagleHead) {
    if batch.firsts_pending.is_empty() {
        return;
    }
    let pending = std::mem::take(&mut batch.firsts_pending);
    let firsts = head.first_drafts().await;
    debug_assert!(firsts.as_ref().is_ok_and(|f| f.len() == pending.len()), "{firsts:?}");
    let Ok(firsts) = firsts else { return };
    for ((id, at), first) in pending.into_iter().zip(firsts) {
        let Some(s) = batch.running.iter_mut().find(|s| s.id == id) else { continue };
        if let Some(Drafting { source: Source::Eagle { row, .. }, .. }) = &mut s.drafting {
            *row = Some((at, first));
        }
    }
}

/// After a commit: each running sequence drafting with the Medusa heads takes its last kept row
/// of the pass (`before`: [`before_commit`]'s), the position before its newest token, whose
/// hidden state the heads read when it drafts next; the others none.
pub(super) fn medusa_rows(batch: &mut Batch, before: &[Before]) {
    for s in batch.running.iter_mut() {
        let n_past = s.n_past;
        let Some(Drafting { source: Source::Medusa { row }, .. }) = &mut s.drafting else { continue };
        *row = (before.iter().find(|b| b.0 == s.id))
            .filter(|(_, old, _)| n_past > *old)
            .and_then(|(_, old, rows)| rows.get(n_past - old - 1))
            .map(|&r| r as usize);
    }
}

/// Fills the plan's draft placeholders of the sequences drafting with the Medusa heads: each
/// head's ranked ids at the sequence's row of the last pass (its tree's nodes; without
/// Medusa's paths each head's most likely id, a chain), in runs of up to
/// [`MEDUSA_ROWS`] rows (before this plan's pass: that pass's hidden states are still there).
pub(super) async fn propose_medusa(batch: &mut Batch, medusa: &Medusa, plan: &mut [Rows]) -> Result<()> {
    let heads = medusa.heads();
    let asks: Vec<(usize, usize)> = (plan.iter().enumerate())
        .filter(|(_, r)| r.pending && !r.drafts.is_empty())
        .filter_map(|(entry, r)| match &batch.running[r.seq].drafting {
            Some(Drafting { source: Source::Medusa { row: Some(row) }, .. }) => Some((entry, *row)),
            _ => None,
        })
        .collect();
    for run in asks.chunks(MEDUSA_ROWS) {
        let rows: Vec<usize> = run.iter().map(|&(_, row)| row).collect();
        let t0 = Instant::now();
        let top = heads.top_rows(&rows).await?;
        batch.medusa_costs.observe(rows.len(), t0.elapsed().as_secs_f64());
        for (&(entry, _), guesses) in run.iter().zip(top) {
            let r = &mut plan[entry];
            match &mut r.proposed {
                // (a tree: its shape's nodes get the heads' ids)
                Some(p) => p.fill(&guesses),
                None => r.drafts = guesses.iter().take(r.drafts.len()).map(|ids| ids[0]).collect(),
            }
        }
    }
    Ok(())
}

/// Forgets the rows of the last passes that the sequences drafting as `which` says would draft
/// from (the buffers they name were written over, or are about to be: a failed pass).
pub(super) fn forget_rows(batch: &mut Batch, which: fn(&Drafting) -> bool) {
    for d in batch.running.iter_mut().filter_map(|s| s.drafting.as_mut()).filter(|d| which(d)) {
        match &mut d.source {
            Source::Eagle { row, .. } => *row = None,
            Source::Medusa { row } => *row = None,
            _ => {}
        }
    }
}
