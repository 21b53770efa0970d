//! The pages of the target's KV cache pool that the batch hands out, and the prefix cache in
//! them: a whole page of committed positions keeps its keys and values after the sequences that
//! held it end, found again by the tokens that made it and the page before it, so that a later
//! request whose tokens start the same way (a system prompt, the earlier turns of a chat, a
//! request run again, a preempted one coming back) does not compute them again (vLLM's
//! automatic prefix caching).
//!
//! ```text
//!   a page is   held    by 1 or more running sequences (refs)
//!               idle    cached, held by none: taken (and forgotten) when no page is free,
//!                       the least recently released first (a sequence's last page first)
//!               free    neither
//! ```
//!
//! Exact by construction: the keys and values of a position are a function of the tokens up to
//! it alone (every kernel is batch-invariant: a row's bits depend neither on the other rows of
//! its pass nor on how its prompt was cut into chunks), so a page found here holds the bits the
//! request would have computed. Only whole pages below a sequence's newest token are shared, so
//! a sequence never writes into a page another one reads.
//!
//! An EAGLE head's cache has a page of the same id beside each (its pool as large as the
//! target's). A page's head keys and values are a function of its tokens, those before it and
//! the first token of the page after (its last position's head row reads the next token): a
//! page records that token once the head has run all its positions, and a sequence drafting with
//! the head finds only the cached pages whose head part it can use. Where two sequences computed
//! the same page, the cache keeps the copy whose head part is computed.

use std::collections::{BTreeSet, HashMap};

use crate::gpu::KV_PAGE;

/// What finds a cached page: the entry of the page before it (for a first page its sequence's
/// root: 0, or its request's own) and the page's tokens (exact: no hash of them stands for them).
type Key = (u64, Vec<u32>);

/// The batch's pages of the pool.
pub(super) struct Pool {
    /// Neither held nor cached, the lowest last.
    free: Vec<u32>,
    /// Per page: the running sequences holding it.
    refs: Vec<u32>,
    /// The prefix cache: key -> (entry, page).
    entries: HashMap<Key, (u64, u32)>,
    /// Per page: its key while cached.
    keys: Vec<Option<Key>>,
    /// Cached pages no sequence holds, (when released, page): the oldest first.
    idle: BTreeSet<(u64, u32)>,
    /// Per page: when it was last released (its place in `idle`).
    released: Vec<u64>,
    /// Per page: the token after it for which its EAGLE head part is computed (none: not).
    head_next: Vec<Option<u32>>,
    /// Per uncached page: the key of the cached page holding the same tokens (both computed
    /// meanwhile by two sequences), which it replaces in the cache if its head part is computed
    /// and the cached one's is not.
    twins: Vec<Option<Key>>,
    tick: u64,
    last_entry: u64,
}

impl Pool {
    /// A pool of `pages` pages, all free.
    pub(super) fn new(pages: usize) -> Pool {
        Pool {
            free: (0..pages as u32).rev().collect(),
            refs: vec![0; pages],
            entries: HashMap::new(),
            keys: vec![None; pages],
            idle: BTreeSet::new(),
            released: vec![0; pages],
            head_next: vec![None; pages],
            twins: vec![None; pages],
            tick: 0,
            last_entry: 0,
        }
    }

    /// Pages of the pool.
    pub(super) fn len(&self) -> usize {
        self.refs.len()
    }

    /// Pages a sequence can take: the free ones and the cached ones no sequence holds.
    pub(super) fn available(&self) -> usize {
        self.free.len() + self.idle.len()
    }

    /// Pages held by running sequences.
    pub(super) fn held(&self) -> usize {
        self.len() - self.available()
    }

    /// Pages in the prefix cache (held or not).
    pub(super) fn cached(&self) -> usize {
        self.entries.len()
    }

    /// A page for one sequence: a free one, else the cached page released longest ago (then
    /// forgotten); none when every page is held.
    pub(super) fn take(&mut self) -> Option<u32> {
        let page = match self.free.pop() {
            Some(p) => p,
            None => {
                let (_, p) = self.idle.pop_first()?;
                if let Some(key) = self.keys[p as usize].take() {
                    self.entries.remove(&key);
                }
                p
            }
        };
        self.refs[page as usize] = 1;
        self.head_next[page as usize] = None;
        self.twins[page as usize] = None;
        Some(page)
    }

    /// The EAGLE head has run every position of held page `page`, the last with the next token
    /// `next`. If the page is the twin of a cached page whose head part is not computed, it takes
    /// that page's place in the cache (the same entry: the pages after it are still found), and
    /// that page is no longer cached (free once no sequence holds it).
    pub(super) fn head_computed(&mut self, page: u32, next: u32) {
        self.head_next[page as usize] = Some(next);
        let Some(key) = self.twins[page as usize].take() else { return };
        let Some(&(entry, other)) = self.entries.get(&key) else { return };
        if other == page || self.head_next[other as usize].is_some() {
            return;
        }
        self.entries.insert(key.clone(), (entry, page));
        self.keys[page as usize] = Some(key.clone());
        self.keys[other as usize] = None;
        self.twins[other as usize] = Some(key);
        if self.refs[other as usize] == 0 && self.idle.remove(&(self.released[other as usize], other)) {
            self.free.push(other);
        }
    }

    /// Whether page `page`'s EAGLE head part is computed with `next` after it.
    pub(super) fn head_found(&self, page: u32, next: u32) -> bool {
        self.head_next[page as usize] == Some(next)
    }

    /// One more sequence holds cached page `page` (one found by [`Pool::lookup`]).
    pub(super) fn hold(&mut self, page: u32) {
        let p = page as usize;
        if self.refs[p] == 0 {
            self.idle.remove(&(self.released[p], page));
        }
        self.refs[p] += 1;
    }

    /// A sequence gives its pages back, its last first: a page no sequence holds any more is
    /// free, or idle if cached (a sequence's last pages are then forgotten before its first ones,
    /// which more requests share).
    pub(super) fn release(&mut self, pages: &mut Vec<u32>) {
        for page in pages.drain(..).rev() {
            let p = page as usize;
            self.refs[p] = self.refs[p].saturating_sub(1);
            if self.refs[p] > 0 {
                continue;
            }
            if self.keys[p].is_some() {
                self.tick += 1;
                self.released[p] = self.tick;
                self.idle.insert((self.tick, page));
            } else {
                self.free.push(page);
            }
        }
    }

    /// Whether `page` is cached and held by no sequence (taking it would forget it).
    pub(super) fn is_idle(&self, page: u32) -> bool {
        self.refs[page as usize] == 0
    }

    /// The cached pages that hold the first whole pages of `tokens` after the entry `root`, at
    /// most `most`, the first first: (page, its entry) each.
    pub(super) fn lookup(&self, root: u64, tokens: &[u32], most: usize) -> Vec<(u32, u64)> {
        let mut found = Vec::new();
        let mut parent = root;
        for page_tokens in tokens.chunks_exact(KV_PAGE).take(most) {
            let Some(&(entry, page)) = self.entries.get(&(parent, page_tokens.to_vec())) else { break };
            found.push((page, entry));
            parent = entry;
        }
        found
    }

    /// Caches a held page whose positions are all committed, `tokens` (a whole page) after the
    /// entry `parent` (a first page: its sequence's root); returns the entry of these tokens,
    /// which the next page follows. A page whose tokens another one holds already (computed by
    /// another sequence meanwhile) stays uncached, that page's twin (it takes its place if its
    /// EAGLE head part is computed first: [`Pool::head_computed`]).
    pub(super) fn cache(&mut self, page: u32, parent: u64, tokens: &[u32]) -> u64 {
        debug_assert_eq!(tokens.len(), KV_PAGE);
        let key = (parent, tokens.to_vec());
        if let Some(&(entry, cached)) = self.entries.get(&key) {
            if cached != page && self.keys[page as usize].is_none() {
                self.twins[page as usize] = Some(key);
            }
            return entry;
        }
        if let Some(own) = &self.keys[page as usize] {
            // (cached once already under other tokens: its sequence found it, and caches only
            // past it; never reached)
            debug_assert!(false, "page {page} cached twice");
            return self.entries.get(own).map_or(0, |&(entry, _)| entry);
        }
        self.last_entry += 1;
        self.entries.insert(key.clone(), (self.last_entry, page));
        self.keys[page as usize] = Some(key);
        self.last_entry
    }

    /// Forgets the cached pages found from entry `root` (a request's own root, once no sequence
    /// of the request is left: nothing else can find them): idle ones become free, held ones
    /// (none, then) stay their sequences'.
    pub(super) fn forget_from(&mut self, root: u64) {
        let mut children: HashMap<u64, Vec<Key>> = HashMap::new();
        for key in self.entries.keys() {
            children.entry(key.0).or_default().push(key.clone());
        }
        let mut parents = vec![root];
        while let Some(parent) = parents.pop() {
            for key in children.remove(&parent).unwrap_or_default() {
                let Some((entry, page)) = self.entries.remove(&key) else { continue };
                parents.push(entry);
                let p = page as usize;
                self.keys[p] = None;
                if self.refs[p] == 0 && self.idle.remove(&(self.released[p], page)) {
                    self.free.push(page);
                }
            }
        }
    }

    /// Forgets every cached page (a one-sequence pass writes the pool's first pages as its own
    /// cache): idle ones become free, held ones stay their sequences'.
    pub(super) fn forget_all(&mut self) {
        self.free.extend(std::mem::take(&mut self.idle).into_iter().map(|(_, p)| p));
        self.entries.clear();
        self.keys.iter_mut().for_each(|k| *k = None);
        self.head_next.iter_mut().for_each(|h| *h = None);
        self.twins.iter_mut().for_each(|t| *t = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(t: u32) -> Vec<u32> {
        vec![t; KV_PAGE]
    }

    #[test]
    fn a_page_is_found_by_its_tokens_after_the_page_before_it() {
        let mut pool = Pool::new(4);
        let tokens = [page(1), page(2), vec![3]].concat();
        let mut pages: Vec<u32> = (0..3).filter_map(|_| pool.take()).collect();
        assert_eq!((pool.held(), pool.available()), (3, 1));
        let e0 = pool.cache(pages[0], 0, &tokens[..KV_PAGE]);
        let e1 = pool.cache(pages[1], e0, &tokens[KV_PAGE..2 * KV_PAGE]);
        assert_eq!(pool.lookup(0, &tokens, 2), [(pages[0], e0), (pages[1], e1)]);
        assert_eq!(pool.lookup(0, &tokens, 1), [(pages[0], e0)], "at most `most`");
        // the same second page after another first one is another page
        let other = [page(9), page(2)].concat();
        assert!(pool.lookup(0, &other, 2).is_empty());
        // released: cached pages idle (still available), the partial page free
        pool.release(&mut pages);
        assert_eq!((pool.held(), pool.available(), pool.cached()), (0, 4, 2));
        assert_eq!(pool.lookup(0, &tokens, 2).len(), 2, "found after their sequence ended");
        // held again by two sequences; released by one, still held
        pool.hold(0);
        pool.hold(0);
        pool.release(&mut vec![0]);
        assert_eq!(pool.held(), 1);
        pool.release(&mut vec![0]);
        // taking every page forgets the cached ones, the last page released first (the second
        // page, released before the first)
        let taken: Vec<u32> = (0..3).filter_map(|_| pool.take()).collect();
        assert_eq!(pool.cached(), 1, "{taken:?}");
        assert_eq!(pool.lookup(0, &tokens, 2).len(), 1, "the first page outlives the second");
        assert!(pool.take().is_some() && pool.take().is_none());
        assert_eq!(pool.cached(), 0);
    }

    #[test]
    fn a_page_cached_after_a_request_s_own_root_is_found_from_that_root_only() {
        let mut pool = Pool::new(3);
        let tokens = [page(1), page(2)].concat();
        let pages: Vec<u32> = (0..3).filter_map(|_| pool.take()).collect();
        let shared = pool.cache(pages[0], 0, &tokens[..KV_PAGE]);
        let own = (1 << 63) | 7;
        assert!(pool.lookup(own, &tokens, 2).is_empty(), "the shared page is not the request's");
        let e0 = pool.cache(pages[1], own, &tokens[..KV_PAGE]);
        let e1 = pool.cache(pages[2], e0, &tokens[KV_PAGE..]);
        assert_eq!(pool.lookup(own, &tokens, 2), [(pages[1], e0), (pages[2], e1)]);
        assert_eq!(pool.lookup(0, &tokens, 2), [(pages[0], shared)], "nor the request's shared");
        assert!(pool.lookup((1 << 63) | 8, &tokens, 2).is_empty(), "nor another request's");
        assert_eq!(pool.cached(), 3);
    }

    #[test]
    fn the_pages_found_from_a_root_are_forgotten_with_it() {
        let mut pool = Pool::new(5);
        let tokens = [page(1), page(2)].concat();
        let (own, other) = ((1 << 63) | 7, (1 << 63) | 8);
        let mut a: Vec<u32> = (0..2).filter_map(|_| pool.take()).collect();
        let mut b: Vec<u32> = (0..2).filter_map(|_| pool.take()).collect();
        let e0 = pool.cache(a[0], own, &tokens[..KV_PAGE]);
        pool.cache(a[1], e0, &tokens[KV_PAGE..]);
        // a second chain from the same root (another choice's tokens after the first page)
        pool.cache(b[0], own, &page(3));
        let kept = pool.cache(b[1], other, &tokens[..KV_PAGE]);
        pool.release(&mut a);
        assert_eq!((pool.cached(), pool.available()), (4, 3));
        pool.forget_from(own);
        assert_eq!(pool.cached(), 1, "the other root's page stays");
        assert_eq!(pool.lookup(other, &tokens, 1), [(b[1], kept)]);
        assert!(pool.lookup(own, &tokens, 2).is_empty());
        // idle ones free (no longer cached), the held one uncached and its sequence's
        assert_eq!((pool.available(), pool.held()), (3, 2));
        pool.release(&mut b);
        assert_eq!((pool.available(), pool.cached()), (5, 1));
        assert_eq!(pool.free.len(), 4, "the forgotten pages free, the other root's idle");
    }

    #[test]
    fn a_page_s_head_part_is_known_until_the_page_is_taken_again() {
        let mut pool = Pool::new(1);
        let a = pool.take().expect("page");
        assert!(!pool.head_found(a, 7));
        pool.head_computed(a, 7);
        pool.cache(a, 0, &page(1));
        pool.release(&mut vec![a]);
        assert!(pool.head_found(a, 7) && !pool.head_found(a, 8), "the token after it counts");
        assert_eq!(pool.take(), Some(a));
        assert!(!pool.head_found(a, 7), "taken again: forgotten");
        pool.head_computed(a, 7);
        pool.forget_all();
        assert!(!pool.head_found(a, 7), "forgotten with the cache");
    }

    #[test]
    fn of_two_copies_of_a_page_the_cache_keeps_the_one_with_its_head_part() {
        // Two sequences computed the same two pages: the first's copies are cached, the
        // second's are twins. The second's head part of the first page computed: its copy is
        // found in the cache instead (the second page after it still found), the first's copy,
        // released, is free; a twin's mark does not displace a copy that has one.
        let mut pool = Pool::new(6);
        let tokens = [page(1), page(2)].concat();
        let a: Vec<u32> = (0..2).filter_map(|_| pool.take()).collect();
        let b: Vec<u32> = (0..2).filter_map(|_| pool.take()).collect();
        let e0 = pool.cache(a[0], 0, &tokens[..KV_PAGE]);
        let e1 = pool.cache(a[1], e0, &tokens[KV_PAGE..]);
        assert_eq!(pool.cache(b[0], 0, &tokens[..KV_PAGE]), e0, "the same entry");
        assert_eq!(pool.cache(b[1], e0, &tokens[KV_PAGE..]), e1);
        assert_eq!(pool.lookup(0, &tokens, 2), [(a[0], e0), (a[1], e1)]);
        pool.head_computed(a[1], 5);
        pool.head_computed(b[0], 2);
        pool.head_computed(b[1], 5);
        assert_eq!(pool.lookup(0, &tokens, 2), [(b[0], e0), (a[1], e1)], "b's first page, a's second");
        assert!(pool.head_found(b[0], 2));
        pool.release(&mut a.clone());
        assert_eq!((pool.available(), pool.cached()), (4, 2), "a's first page free, its second idle");
        pool.release(&mut b.clone());
        assert_eq!(pool.lookup(0, &tokens, 2), [(b[0], e0), (a[1], e1)], "found after both ended");
        // the free pages (a's first and b's second among them) are taken before the cached ones
        let taken: Vec<u32> = (0..4).filter_map(|_| pool.take()).collect();
        assert_eq!(pool.cached(), 2, "free pages taken first: {taken:?}");
    }

    #[test]
    fn forgetting_frees_idle_pages_and_keeps_held_ones() {
        let mut pool = Pool::new(2);
        let a = pool.take().expect("page");
        let b = pool.take().expect("page");
        pool.cache(a, 0, &page(1));
        pool.cache(b, 0, &page(2));
        pool.release(&mut vec![a]);
        pool.forget_all();
        assert_eq!((pool.cached(), pool.available(), pool.held()), (0, 1, 1));
        assert!(pool.lookup(0, &page(2), 1).is_empty());
        pool.release(&mut vec![b]);
        assert_eq!(pool.available(), 2, "an uncached page is free when released");
        // tokens cached twice: the second page stays uncached
        let (c, d) = (pool.take().expect("page"), pool.take().expect("page"));
        let e = pool.cache(c, 0, &page(5));
        assert_eq!(pool.cache(d, 0, &page(5)), e);
        pool.release(&mut vec![c, d]);
        assert_eq!(pool.cached(), 1);
    }
}
