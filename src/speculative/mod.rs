//! Lossless speculative decoding: a draft proposes K tokens, the target verifies them in one
//! forward pass, the acceptance rule keeps a prefix and adds one target token, both KV caches
//! roll back to the accepted length.
//!
//! - [`spec`]: which draft a request names ([`DraftKind`]) and what a user loads ([`DraftSpec`])
//! - [`draft`]: the [`Draft`] trait and its [`Proposal`]s (a chain or a tree), [`DraftModel`] (a
//!   smaller model), and the loop's [`Drafter`]
//! - [`ngram`]: [`NGram`] (prompt lookup) and the [`Ensemble`] of a draft with it (one tree)
//! - [`medusa`]: [`Medusa`] heads on the target's hidden state, drafting token trees
//! - [`eagle`]: an [`Eagle`] head, a decoder layer drafting from the target's features
//! - [`verify`]: the greedy and speculative-sampling acceptance rules (pure functions)
//! - [`cycle`]: the GPU-resident greedy cycle, and the [`CycleOutcome`] of every GPU cycle
//! - [`sampled`]: sampling on the GPU (draws and the acceptance rule; a few words read back)
//! - [`tree`]: token trees (several continuations verified in one pass) and their greedy rule
//! - [`schedule`]: the choice of K (fixed, or adaptive from measured acceptance and costs)
//! - `verifier`: the verify side of a cycle, chosen once per generation (greedy, or sampled on
//!   the GPU)
//! - [`generate`](mod@generate): the loop, with per-generation [`SpecStats`]

pub mod cycle;
pub mod draft;
pub mod eagle;
pub mod generate;
pub mod medusa;
pub mod ngram;
pub mod sampled;
pub mod schedule;
pub mod spec;
pub mod tree;
mod verifier;
pub mod verify;

pub use cycle::{CycleAt, CycleOutcome, GreedyCycle};
pub use draft::{
    check_draft, check_tokenizers, check_vocab, Ask, Draft, DraftBudget, DraftModel, Drafter, Kept, Proposal,
    TreeCosts,
};
pub use eagle::{Eagle, EagleTree, EAGLE_SIBLINGS, EAGLE_WIDTH};
pub use generate::{generate, generate_with, CycleTrace, SpecGeneration, SpecStats};
pub use medusa::{Medusa, MEDUSA_CHOICES};
pub use ngram::{Ensemble, NGram, TREE_BRANCHES};
pub use sampled::SampledCycle;
pub use schedule::{KPolicy, Schedule, DEFAULT_MAX_DRAFT_K};
pub use spec::{DraftKind, DraftSpec};
pub use tree::{TokenTree, TreeVerdict};
pub use verify::{verify_greedy, verify_sampled, Dist, NextKind, Verdict};
