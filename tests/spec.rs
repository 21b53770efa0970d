//! Speculative decoding: the acceptance rules on hand-built distributions, their convergence to
//! the target's distribution (CPU, many samples; GPU, a tiny model), batch invariance of verify
//! passes, KV rollback, and greedy speculative output == target-only greedy output on tiny
//! random models with several drafts.

mod common;
mod reference;

use common::tiny::{f32_bytes, MedusaKind, TinyModel, TinySpec};
use common::{assert_fits, gpu, rng};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::Rng as _;
use wgspec::generation::{FinishReason, GenerateOptions};
use wgspec::gpu::{Gpu, KernelShape};
use wgspec::loader::safetensors::write_safetensors;
use wgspec::loader::DType;
use wgspec::model::{
    Checkpoint, EagleHead, EagleLayout, LoadOptions, MedusaConfig, MedusaHeads, Model, Precision,
};
use wgspec::sampling::{self, Rng, SamplingParams};
use wgspec::speculative::{
    self, verify_greedy, verify_sampled, Ask, CycleAt, Dist, Draft, DraftBudget, DraftKind, DraftModel,
    Drafter, Eagle, EagleTree, Ensemble, KPolicy, Kept, Medusa, NGram, NextKind, SampledCycle, TokenTree,
    TreeCosts, TreeVerdict, Verdict,
};
use wgspec::Error;

// ---------------------------------------------------------------------------------------------
// Acceptance rules on hand-built logits
// ---------------------------------------------------------------------------------------------

fn dist(v: &[f64]) -> Dist {
    Dist::from_pairs(v.iter().enumerate().map(|(i, &p)| (i as u32, p)).collect())
}

/// The argmax ids of hand-built logits rows.
fn argmaxes(rows: &[&[f32]]) -> Vec<u32> {
    rows.iter().map(|r| sampling::argmax(r)).collect()
}

#[test]
fn greedy_perfect_match_accepts_all_and_adds_the_bonus() {
    let rows: [&[f32]; 4] =
        [&[0.0, 3.0, 1.0, 0.0], &[2.0, 0.0, 0.0, 1.0], &[0.0, 0.0, 0.5, 0.4], &[0.0, 0.1, 0.0, 9.0]];
    let v = verify_greedy(&[1, 0, 2], &argmaxes(&rows)).expect("verify");
    assert_eq!(v, Verdict { accepted: 3, next: 3, kind: NextKind::Bonus });
}

#[test]
fn greedy_early_mismatch_takes_the_target_token() {
    let rows: [&[f32]; 4] =
        [&[0.0, 3.0, 1.0, 0.0], &[2.0, 0.0, 0.0, 1.0], &[0.0, 0.0, 0.5, 0.4], &[0.0, 0.1, 0.0, 9.0]];
    let ids = argmaxes(&rows);
    // First position already wrong: nothing accepted, the target's argmax (1) is recovered.
    assert_eq!(
        verify_greedy(&[2, 0, 2], &ids).expect("verify"),
        Verdict { accepted: 0, next: 1, kind: NextKind::Recovered }
    );
    // SideOutput position wrong.
    assert_eq!(
        verify_greedy(&[1, 3, 2], &ids).expect("verify"),
        Verdict { accepted: 1, next: 0, kind: NextKind::Recovered }
    );
    // Last position wrong: later matches do not count.
    assert_eq!(
        verify_greedy(&[1, 0, 3], &ids).expect("verify"),
        Verdict { accepted: 2, next: 2, kind: NextKind::Recovered }
    );
    // No draft: the target's own token (a plain decoding step).
    assert_eq!(
        verify_greedy(&[], &ids[..1]).expect("verify"),
        Verdict { accepted: 0, next: 1, kind: NextKind::Bonus }
    );
    assert!(matches!(verify_greedy(&[1, 0], &ids), Err(Error::InvalidArgument(_))));
}

#[test]
fn sampled_rule_with_one_hot_target_is_the_greedy_rule() {
    // Greedy params make p one-hot on the argmax: the sampling rule then accepts exactly the matches.
    let rows: [&[f32]; 4] =
        [&[0.0, 3.0, 1.0, 0.0], &[2.0, 0.0, 0.0, 1.0], &[0.0, 0.0, 0.5, 0.4], &[0.0, 0.1, 0.0, 9.0]];
    let p: Vec<Dist> = rows.iter().map(|r| Dist::from_logits(r, &SamplingParams::greedy())).collect();
    let ids = argmaxes(&rows);
    let mut rng = Rng::new(5);
    for draft in [[1u32, 0, 2], [2, 0, 2], [1, 3, 2], [1, 0, 3]] {
        let q: Vec<Dist> = draft.iter().map(|&x| Dist::one_hot(x)).collect();
        for _ in 0..20 {
            let s = verify_sampled(&draft, &q, &p, &mut rng).expect("verify");
            assert_eq!(s, verify_greedy(&draft, &ids).expect("verify"), "draft {draft:?}");
        }
    }
}

#[test]
fn sampled_all_accepted_when_p_dominates_q_and_bonus_from_the_last_row() {
    // p(x) >= q(x) at every drafted token: always accepted; the bonus comes from p[K] (token 3 only).
    let p = [dist(&[0.1, 0.9, 0.0, 0.0]), dist(&[0.6, 0.4, 0.0, 0.0]), dist(&[0.0, 0.0, 0.0, 1.0])];
    let q = [dist(&[0.5, 0.5, 0.0, 0.0]), dist(&[0.5, 0.5, 0.0, 0.0])];
    let mut rng = Rng::new(1);
    for _ in 0..200 {
        let v = verify_sampled(&[1, 0], &q, &p, &mut rng).expect("verify");
        assert_eq!(v, Verdict { accepted: 2, next: 3, kind: NextKind::Bonus });
    }
}

#[test]
fn sampled_rejection_never_resamples_the_rejected_token() {
    // The draft over-proposes token 0 (q = 0.9 > p = 0.2): rejections happen, and norm(max(0, p - q))
    // excludes token 0, so the recovered token is never 0 (nor 3, which p excludes).
    let p = [dist(&[0.2, 0.5, 0.3, 0.0]), dist(&[0.25; 4])];
    let q = [dist(&[0.9, 0.05, 0.0, 0.05])];
    let mut rng = Rng::new(2);
    let (mut rejected, mut accepted) = (0, 0);
    for _ in 0..5000 {
        let v = verify_sampled(&[0], &q, &p, &mut rng).expect("verify");
        if v.kind == NextKind::Recovered {
            rejected += 1;
            assert!(v.next == 1 || v.next == 2, "recovered {} after rejecting 0", v.next);
        } else {
            accepted += 1;
        }
    }
    // Acceptance probability p/q = 0.2/0.9.
    let rate = accepted as f64 / (accepted + rejected) as f64;
    assert!((rate - 0.2 / 0.9).abs() < 0.03, "acceptance rate {rate}");
    // A token the target cannot produce (p = 0) is always rejected.
    for _ in 0..100 {
        let v = verify_sampled(&[3], &q, &p, &mut rng).expect("verify");
        assert_eq!((v.accepted, v.kind), (0, NextKind::Recovered));
        assert_ne!(v.next, 3);
    }
}

#[test]
fn sampled_rule_is_deterministic_for_a_seed() {
    let mut r = rng(3);
    let p: Vec<Dist> = (0..5).map(|_| random_dist(&mut r, 12, 1.0)).collect();
    let q: Vec<Dist> = (0..4).map(|_| random_dist(&mut r, 12, 1.0)).collect();
    let run = |seed: u64| {
        let mut g = Rng::new(seed);
        (0..100)
            .map(|_| {
                let draft: Vec<u32> = q.iter().map(|qi| qi.draw(&mut g)).collect();
                verify_sampled(&draft, &q, &p, &mut g).expect("verify")
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

// ---------------------------------------------------------------------------------------------
// Convergence to the target distribution (CPU, many samples)
// ---------------------------------------------------------------------------------------------

fn random_logits(r: &mut SmallRng, v: usize, scale: f32) -> Vec<f32> {
    (0..v).map(|_| r.gen_range(-scale..scale)).collect()
}

fn random_dist(r: &mut SmallRng, v: usize, scale: f32) -> Dist {
    let params = SamplingParams { temperature: 1.0, ..SamplingParams::greedy() };
    Dist::from_logits(&random_logits(r, v, scale), &params)
}

/// Total-variation distance between counts (normalised) and a distribution over `0..cells`.
fn tv(counts: &[usize], want: &[f64]) -> f64 {
    let n: usize = counts.iter().sum();
    counts.iter().zip(want).map(|(&c, &w)| (c as f64 / n as f64 - w).abs()).sum::<f64>() / 2.0
}

/// A toy "model" whose next-token distribution depends only on the previous token.
struct Markov {
    rows: Vec<Dist>, // [V] next-token distribution after token v
}

/// Draft kinds for the convergence tests.
enum ToyDraft {
    /// Samples from its own distributions (returned as q).
    Sampled(Markov),
    /// Always proposes its argmax (one-hot q), like a greedy draft model or an n-gram lookup.
    Deterministic(Vec<u32>),
}

/// An acceptance rule for a chain: the drafts, their q and the target's p, as `verify_sampled`.
type ChainRule = dyn Fn(&[u32], &[Dist], &[Dist], &mut Rng) -> Verdict;

/// The library's rule.
fn real_rule(xs: &[u32], q: &[Dist], p: &[Dist], rng: &mut Rng) -> Verdict {
    verify_sampled(xs, q, p, rng).expect("verify")
}

/// Speculative sampling of two tokens after `start` (K drafts per cycle) under `rule`, as the loop
/// does it.
fn speculate_two(
    target: &Markov,
    draft: &ToyDraft,
    start: u32,
    k: usize,
    rng: &mut Rng,
    rule: &ChainRule,
) -> (u32, u32) {
    let mut out: Vec<u32> = Vec::new();
    let mut last = start;
    while out.len() < 2 {
        let mut xs = Vec::new();
        let mut qs = Vec::new();
        let mut prev = last;
        for _ in 0..k {
            let (x, q) = match draft {
                ToyDraft::Sampled(m) => {
                    let q = m.rows[prev as usize].clone();
                    (q.draw(rng), q)
                }
                ToyDraft::Deterministic(next) => (next[prev as usize], Dist::one_hot(next[prev as usize])),
            };
            xs.push(x);
            qs.push(q);
            prev = x;
        }
        // p_i: the target's distribution after [last, x1..x_i].
        let ctx: Vec<u32> = std::iter::once(last).chain(xs.iter().copied()).collect();
        let p: Vec<Dist> = ctx.iter().map(|&t| target.rows[t as usize].clone()).collect();
        let v = rule(&xs, &qs, &p, rng);
        out.extend_from_slice(&xs[..v.accepted]);
        out.push(v.next);
        last = v.next;
    }
    (out[0], out[1])
}

#[test]
fn speculative_sampling_converges_to_the_target_distribution() {
    const V: usize = 8;
    let mut r = rng(100);
    let settings = [
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 },
        SamplingParams { temperature: 0.7, top_k: 0, top_p: 0.9, min_p: 0.0, seed: 0 },
        SamplingParams { temperature: 1.5, top_k: 4, top_p: 1.0, min_p: 0.0, seed: 0 },
    ];
    for (si, params) in settings.iter().enumerate() {
        let target_logits: Vec<Vec<f32>> = (0..V).map(|_| random_logits(&mut r, V, 2.5)).collect();
        let target = Markov { rows: target_logits.iter().map(|l| Dist::from_logits(l, params)).collect() };
        // Good draft: the target's logits slightly perturbed, same params. Bad draft: unrelated
        // logits and other params. Deterministic: an arbitrary fixed next token (one-hot q).
        let good = Markov {
            rows: target_logits
                .iter()
                .map(|l| {
                    let noisy: Vec<f32> = l.iter().map(|x| x + r.gen_range(-0.3..0.3)).collect();
                    Dist::from_logits(&noisy, params)
                })
                .collect(),
        };
        let bad = Markov { rows: (0..V).map(|_| random_dist(&mut r, V, 3.0)).collect() };
        let fixed: Vec<u32> = (0..V).map(|_| r.gen_range(0..V as u32)).collect();
        let drafts = [
            ("good", ToyDraft::Sampled(good)),
            ("bad", ToyDraft::Sampled(bad)),
            ("one-hot", ToyDraft::Deterministic(fixed)),
        ];
        // Exact joint distribution of the first two tokens after token 0.
        let mut joint = vec![0.0; V * V];
        for a in 0..V {
            for b in 0..V {
                joint[a * V + b] = target.rows[0].prob(a as u32) * target.rows[a].prob(b as u32);
            }
        }
        let first: Vec<f64> = (0..V).map(|a| target.rows[0].prob(a as u32)).collect();
        for (name, draft) in &drafts {
            let mut g = Rng::new(1000 + si as u64);
            let mut counts = vec![0usize; V * V];
            let mut firsts = vec![0usize; V];
            let mut n = 0;
            for &target_n in &[2_000usize, 20_000, 200_000] {
                while n < target_n {
                    let k = 1 + n % 4;
                    let (a, b) = speculate_two(&target, draft, 0, k, &mut g, &real_rule);
                    counts[a as usize * V + b as usize] += 1;
                    firsts[a as usize] += 1;
                    n += 1;
                }
                // E[TV] <= 0.4 sqrt(cells / N); the bound is 2.5 times that and shrinks as 1/sqrt(N).
                let bound = ((V * V) as f64 / n as f64).sqrt();
                let (tv2, tv1) = (tv(&counts, &joint), tv(&firsts, &first));
                assert!(tv2 < bound, "{params:?} {name} draft, N={n}: joint TV {tv2:.4} >= {bound:.4}");
                assert!(tv1 < bound, "{params:?} {name} draft, N={n}: first-token TV {tv1:.4} >= {bound:.4}");
            }
        }
    }
}

/// Speculative sampling of two tokens after `start` with deterministic token trees, as the loop
/// does it: below every node `depth` levels of children, `branches[token]` (distinct tokens);
/// `rule` verifies (the real one, or a broken one the check must catch).
fn speculate_two_tree(
    target: &Markov,
    branches: &[Vec<u32>],
    start: u32,
    depth: usize,
    rng: &mut Rng,
    rule: &dyn Fn(&TokenTree, &[Dist], &mut Rng) -> TreeVerdict,
) -> (u32, u32) {
    let mut out: Vec<u32> = Vec::new();
    let mut last = start;
    while out.len() < 2 {
        let mut tree = TokenTree::new(last);
        let mut level = vec![0usize];
        for _ in 0..depth {
            let mut next = Vec::new();
            for &node in &level {
                let token = tree.tokens()[node] as usize;
                next.extend(branches[token].iter().filter_map(|&t| tree.child(node, t)));
            }
            level = next;
        }
        let p: Vec<Dist> = tree.tokens().iter().map(|&t| target.rows[t as usize].clone()).collect();
        let v = rule(&tree, &p, rng);
        out.extend(v.path[1..].iter().map(|&i| tree.tokens()[i]));
        out.push(v.next);
        last = v.next;
    }
    (out[0], out[1])
}

#[test]
fn multi_candidate_tree_sampling_converges_to_the_target_distribution() {
    const V: usize = 8;
    let mut r = rng(102);
    let real = |t: &TokenTree, p: &[Dist], g: &mut Rng| t.verify_sampled(p, g).expect("verify");
    // Broken on purpose: each child accepted with its share of the original p, the rejected
    // children's mass never moved to the others (p(x2) instead of p(x2) / (1 - p(x1))).
    let broken = |t: &TokenTree, p: &[Dist], g: &mut Rng| {
        let mut path = vec![0];
        let mut at = 0;
        'down: loop {
            let mut left = p[at].clone();
            for c in t.children(at) {
                let x = t.tokens()[c];
                if g.next_f64() < p[at].prob(x) {
                    path.push(c);
                    at = c;
                    continue 'down;
                }
                left = left.residual(&Dist::one_hot(x));
            }
            return TreeVerdict { path, next: left.draw(g) };
        }
    };
    for (si, params) in [
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 },
        SamplingParams { temperature: 0.7, top_k: 0, top_p: 0.9, min_p: 0.0, seed: 0 },
    ]
    .iter()
    .enumerate()
    {
        let target = Markov {
            rows: (0..V).map(|_| Dist::from_logits(&random_logits(&mut r, V, 2.5), params)).collect(),
        };
        let branches: Vec<Vec<u32>> = (0..V)
            .map(|_| {
                let mut b: Vec<u32> = (0..V as u32).collect();
                b.sort_by_key(|_| r.gen::<u32>());
                b.truncate(3);
                b
            })
            .collect();
        let mut joint = vec![0.0; V * V];
        for a in 0..V {
            for b in 0..V {
                joint[a * V + b] = target.rows[0].prob(a as u32) * target.rows[a].prob(b as u32);
            }
        }
        let first: Vec<f64> = (0..V).map(|a| target.rows[0].prob(a as u32)).collect();
        let mut g = Rng::new(2000 + si as u64);
        let (mut counts, mut firsts, mut n) = (vec![0usize; V * V], vec![0usize; V], 0);
        for &target_n in &[2_000usize, 20_000, 100_000] {
            while n < target_n {
                let (a, b) = speculate_two_tree(&target, &branches, 0, 1 + n % 3, &mut g, &real);
                counts[a as usize * V + b as usize] += 1;
                firsts[a as usize] += 1;
                n += 1;
            }
            let bound = ((V * V) as f64 / n as f64).sqrt();
            let (tv2, tv1) = (tv(&counts, &joint), tv(&firsts, &first));
            assert!(tv2 < bound, "{params:?}, N={n}: joint TV {tv2:.4} >= {bound:.4}");
            assert!(tv1 < bound, "{params:?}, N={n}: first-token TV {tv1:.4} >= {bound:.4}");
        }
        // The check's power: the broken rule lands far outside the same bound (with each row's
        // three likeliest tokens as children, where it moves the most mass).
        let likeliest: Vec<Vec<u32>> = target
            .rows
            .iter()
            .map(|d| {
                let mut pairs = d.pairs().to_vec();
                pairs.sort_by(|a, b| b.1.total_cmp(&a.1));
                pairs.iter().take(3).map(|&(t, _)| t).collect()
            })
            .collect();
        let mut firsts = vec![0usize; V];
        for i in 0..20_000 {
            firsts[speculate_two_tree(&target, &likeliest, 0, 1 + i % 3, &mut g, &broken).0 as usize] += 1;
        }
        let bound = (V as f64 / 20_000.0).sqrt();
        assert!(tv(&firsts, &first) > bound, "{params:?}: the broken rule went unnoticed");
    }
}

#[test]
fn a_broken_rule_is_caught_by_the_convergence_check() {
    // The check's power, through the same harness as the real rule: two rules with classic
    // mistakes land far outside the bound the real rule stays within at N = 20000 (a draft
    // unrelated to the target, which rejects often). One draws the token after a rejection from
    // p instead of the residual max(0, p - q); the other accepts every draft (no correction).
    const V: usize = 8;
    let mut r = rng(101);
    let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 };
    let target = Markov { rows: (0..V).map(|_| random_dist(&mut r, V, 2.5)).collect() };
    let draft = ToyDraft::Sampled(Markov { rows: (0..V).map(|_| random_dist(&mut r, V, 2.5)).collect() });
    let from_p = |xs: &[u32], q: &[Dist], p: &[Dist], g: &mut Rng| {
        for (i, &x) in xs.iter().enumerate() {
            if g.next_f64() >= p[i].prob(x) / q[i].prob(x) {
                return Verdict { accepted: i, next: p[i].draw(g), kind: NextKind::Recovered };
            }
        }
        Verdict { accepted: xs.len(), next: p[xs.len()].draw(g), kind: NextKind::Bonus }
    };
    let accept_all = |xs: &[u32], _q: &[Dist], p: &[Dist], g: &mut Rng| Verdict {
        accepted: xs.len(),
        next: p[xs.len()].draw(g),
        kind: NextKind::Bonus,
    };
    let mut joint = vec![0.0; V * V];
    for a in 0..V {
        for b in 0..V {
            joint[a * V + b] = target.rows[0].prob(a as u32) * target.rows[a].prob(b as u32);
        }
    }
    let n = 20_000;
    let bound = ((V * V) as f64 / n as f64).sqrt();
    let rules: [(&str, &ChainRule); 3] =
        [("real", &real_rule), ("from p", &from_p), ("accept all", &accept_all)];
    for (name, rule) in rules {
        let mut g = Rng::new(7);
        let mut counts = vec![0usize; V * V];
        for i in 0..n {
            let (a, b) = speculate_two(&target, &draft, 0, 1 + i % 4, &mut g, rule);
            counts[a as usize * V + b as usize] += 1;
        }
        let d = tv(&counts, &joint);
        match name {
            "real" => assert!(d < bound, "{params:?}: the real rule's joint TV {d:.4} >= {bound:.4}"),
            _ => assert!(
                d > 2.0 * bound,
                "the rule {name:?} went unnoticed: joint TV {d:.4}, bound {bound:.4}"
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GPU: tiny random models
// ---------------------------------------------------------------------------------------------

fn load(ckpt: &Checkpoint, context: usize) -> Model {
    Model::load(gpu(), ckpt, &LoadOptions { context: Some(context), ..Default::default() }, &mut |_| {})
        .expect("load")
}

fn ckpt_of(tiny: &TinyModel, r: &mut SmallRng) -> Checkpoint {
    Checkpoint::from_gguf(tiny.to_gguf(DType::F32, r)).expect("gguf")
}

/// The same model with every weight moved by up to `noise`.
fn perturbed(tiny: &TinyModel, noise: f32, r: &mut SmallRng) -> TinyModel {
    let mut t = TinyModel { spec: tiny.spec, tensors: Vec::new() };
    for x in &tiny.tensors {
        let values = x.values.iter().map(|v| v + r.gen_range(-noise..noise)).collect();
        t.tensors.push(common::tiny::TinyTensor { name: x.name.clone(), shape: x.shape.clone(), values });
    }
    t
}

fn plain(model: &mut Model, prompt: &[u32], opts: &GenerateOptions) -> speculative::SpecGeneration {
    common::plain(model, prompt, opts).expect("generate")
}

fn speculative<'a>(
    target: &mut Model,
    draft: impl Into<Drafter<'a>>,
    prompt: &[u32],
    opts: &GenerateOptions,
    k: KPolicy,
) -> speculative::SpecGeneration {
    pollster::block_on(speculative::generate(target, draft.into(), prompt, opts, k, &mut |_, _| true))
        .expect("spec generate")
}

/// A test's draft, owned: a draft model (whose cycles the loop may run GPU-resident) or any other.
enum Owned<'a> {
    Model(Box<DraftModel>),
    Other(Box<dyn Draft + 'a>),
}

impl Owned<'_> {
    fn drafter(&mut self) -> Drafter<'_> {
        match self {
            Owned::Model(d) => Drafter::Model(d.as_mut()),
            Owned::Other(d) => Drafter::Other(d.as_mut()),
        }
    }
}

/// `draft`'s proposal after `context` (waited for), as the decode loop asks for one.
fn propose(
    draft: &mut dyn Draft,
    context: &[u32],
    budget: DraftBudget,
    sampling: &SamplingParams,
) -> speculative::Proposal {
    pollster::block_on(draft.propose(Ask { context, budget, sampling })).expect("propose")
}

fn greedy_opts(n: usize) -> GenerateOptions {
    GenerateOptions { max_tokens: n, sampling: SamplingParams::greedy(), stop_tokens: vec![] }
}

#[test]
fn every_row_of_a_verify_pass_equals_one_token_steps_bit_for_bit() {
    // (Gemma: passes across its local layers' window, 5 keys)
    for spec in [TinySpec::llama(), TinySpec::qwen2(), TinySpec::qwen3(), TinySpec::gemma3()] {
        let mut r = rng(200);
        let tiny = TinyModel::random(spec, &mut r);
        let ckpt = Checkpoint::from_gguf(tiny.to_gguf(DType::F16, &mut r)).expect("gguf");
        let mut m = load(&ckpt, 64);
        let v = spec.vocab;
        let tokens: Vec<u32> = (0..60).map(|_| r.gen_range(0..v as u32)).collect();
        // One-token steps over the whole sequence: the reference rows.
        let mut single = Vec::new();
        for (pos, t) in tokens.iter().enumerate() {
            single.push(pollster::block_on(m.forward(&[*t], pos)).expect("step"));
        }
        // Each pass starts within the cached length (a verify pass never skips positions).
        let passes = [
            (1usize, 1usize),
            (2, 3),
            (5, 7),
            (11, 15),
            (17, 2),
            (20, 31),
            (50, 9),
            (40, 8),
            (45, 2),
            (47, 12),
        ];
        for (pos, k) in passes {
            let rows = pollster::block_on(m.forward(&tokens[pos..pos + k + 1], pos)).expect("verify pass");
            for i in 0..=k {
                let same = rows[i * v..(i + 1) * v]
                    .iter()
                    .zip(&single[pos + i])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{:?}: row {i} of a {}-row pass at {pos} differs from the one-token step",
                    spec.arch_of(),
                    k + 1
                );
            }
            let ids =
                pollster::block_on(m.forward_argmax(&tokens[pos..pos + k + 1], pos)).expect("argmax pass");
            let want: Vec<u32> = (0..=k).map(|i| sampling::argmax(&single[pos + i])).collect();
            assert_eq!(ids, want);
        }
    }
}

#[test]
fn kv_rollback_after_any_accept_pattern_matches_a_fresh_forward() {
    let mut r = rng(210);
    let spec = TinySpec::qwen2();
    let tiny = TinyModel::random(spec, &mut r);
    let ckpt = ckpt_of(&tiny, &mut r);
    let mut m = load(&ckpt, 64);
    let mut fresh = load(&ckpt, 64);
    let v = spec.vocab;
    let vocab = v as u32;
    // Cycles of [last, K drafts] with a accepted: the target keeps n_past + 1 + a positions.
    let mut kept: Vec<u32> = vec![3, 14, 15];
    let mut n_past = 2;
    pollster::block_on(m.forward(&kept[..2], 0)).expect("prefill");
    for (k, a) in [(4usize, 0usize), (4, 4), (1, 0), (6, 2), (3, 3), (8, 1), (2, 0), (5, 5)] {
        let drafts: Vec<u32> = (0..k).map(|_| r.gen_range(0..vocab)).collect();
        let mut batch = vec![kept[n_past]];
        batch.extend_from_slice(&drafts);
        pollster::block_on(m.forward(&batch, n_past)).expect("verify");
        n_past += 1 + a;
        m.truncate(n_past);
        assert_eq!(m.len(), n_past);
        kept.truncate(n_past);
        kept.extend_from_slice(&drafts[..a]);
        let next = r.gen_range(0..vocab);
        kept.push(next); // the recovered/bonus token, not yet run
                         // The target's next pass (over the new last token) equals a fresh model's over all tokens.
        let got = pollster::block_on(m.forward(&kept[n_past..], n_past)).expect("next");
        m.truncate(n_past);
        let mut want = Vec::new();
        for (i, chunk) in kept.chunks(7).enumerate() {
            want = pollster::block_on(fresh.forward(chunk, i * 7)).expect("fresh");
        }
        let last_row = &want[want.len() - v..];
        let same = got.iter().zip(last_row).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "after K={k}, a={a}: logits differ from a fresh forward");
    }
}

#[test]
fn draft_model_rolls_back_and_catches_up() {
    // After arbitrary accept patterns, the draft model's proposal equals a fresh greedy run of
    // the same model over the same context.
    let mut r = rng(220);
    let tiny = TinyModel::random(TinySpec::llama(), &mut r);
    let ckpt = ckpt_of(&tiny, &mut r);
    let target_cfg = ckpt.config.clone();
    let mut draft = DraftModel::new(load(&ckpt, 64), &target_cfg).expect("draft");
    let mut fresh = load(&ckpt, 64);
    let params = SamplingParams::greedy();
    let mut context: Vec<u32> = vec![5, 6, 7, 8];
    pollster::block_on(draft.prefill(&context)).expect("prefill");
    for (k, a, replace_next) in
        [(4usize, 2usize, true), (3, 3, false), (5, 0, true), (2, 2, false), (6, 1, true)]
    {
        let p = propose(&mut draft, &context, DraftBudget::chain(k), &params);
        let want = common::plain(&mut fresh, &context, &greedy_opts(k)).expect("fresh").tokens;
        assert_eq!(p.tokens(), want, "context {context:?}");
        assert_eq!(p.steps(), k);
        context.extend_from_slice(&p.tokens()[..a]);
        let next = if replace_next || a == k { (p.tokens()[a.min(k - 1)] + 1) % 300 } else { p.tokens()[a] };
        context.push(next);
    }
}

#[test]
fn the_last_rows_most_likely_ids_are_ranked_on_the_gpu_as_its_logits_rank_them() {
    // forward_top_k (what a draft model's top-k tree reads back) against a CPU ranking of the
    // same pass's last row (ties: lower id first, as the argmax), for 1..=16 ids and passes of
    // 1 and 5 rows; a tree draft's chain token is its first id.
    let mut r = rng(235);
    let tiny = TinyModel::random(TinySpec::qwen2(), &mut r);
    let ckpt = ckpt_of(&tiny, &mut r);
    let mut model = load(&ckpt, 64);
    let v = tiny.spec.vocab as u32;
    pollster::block_on(model.forward_argmax(&[1, 2, 3], 0)).expect("prefix");
    for (rows, k) in [(1, 1), (1, 3), (5, 16), (5, 2)] {
        let tokens: Vec<u32> = (0..rows).map(|_| r.gen_range(0..v)).collect();
        let logits = pollster::block_on(model.forward_last(&tokens, 3)).expect("forward");
        let ids = pollster::block_on(model.forward_top_k(&tokens, 3, k)).expect("top-k");
        let mut want: Vec<u32> = (0..v).collect();
        want.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        assert_eq!(ids, want[..k], "{rows} rows, k {k}");
    }
    assert!(pollster::block_on(model.forward_top_k(&[1], 3, 17)).is_err());
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let mut r = rng(230);
    let target = ckpt_of(&TinyModel::random(TinySpec::llama(), &mut r), &mut r);
    let other = ckpt_of(&TinyModel::random(TinySpec { vocab: 320, ..TinySpec::llama() }, &mut r), &mut r);
    let err = DraftModel::new(load(&other, 16), &target.config).err().expect("must refuse");
    assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("vocabulary")), "{err}");
}

#[test]
fn greedy_speculative_output_equals_greedy_output() {
    for spec in
        [TinySpec::llama(), TinySpec::qwen2(), TinySpec::qwen3(), TinySpec::phi3(), TinySpec::gemma3()]
    {
        let mut r = rng(300
            + spec.qwen2 as u64
            + 2 * spec.qwen3 as u64
            + 3 * spec.phi3 as u64
            + 4 * spec.gemma3 as u64);
        let tiny = TinyModel::random(spec, &mut r);
        let target_ckpt = ckpt_of(&tiny, &mut r);
        let cfg = target_ckpt.config.clone();
        let mut target = load(&target_ckpt, 64);
        let same = load(&target_ckpt, 64);
        let near = load(&ckpt_of(&perturbed(&tiny, 0.05, &mut r), &mut r), 64);
        let random = load(&ckpt_of(&TinyModel::random(spec, &mut r), &mut r), 64);
        let mut ensemble_model =
            DraftModel::new(load(&ckpt_of(&perturbed(&tiny, 0.2, &mut r), &mut r), 64), &cfg).expect("draft");
        let ngram = NGram { branches: 4, ..NGram::default() };
        let mut top3 =
            DraftModel::new(load(&ckpt_of(&perturbed(&tiny, 0.2, &mut r), &mut r), 64), &cfg).expect("draft");
        top3.set_tree(2);
        let mut drafts: Vec<(&str, Owned<'_>)> = vec![
            ("itself", Owned::Model(Box::new(DraftModel::new(same, &cfg).expect("draft")))),
            ("perturbed", Owned::Model(Box::new(DraftModel::new(near, &cfg).expect("draft")))),
            ("random", Owned::Model(Box::new(DraftModel::new(random, &cfg).expect("draft")))),
            ("ngram", Owned::Other(Box::new(NGram::default()))),
            ("ngram tree", Owned::Other(Box::new(ngram.clone()))),
            ("model+ngram", Owned::Other(Box::new(Ensemble { draft: &mut ensemble_model, ngram }))),
            ("model top-3 tree", Owned::Model(Box::new(top3))),
        ];
        let v = spec.vocab as u32;
        // the fourth prompt repeats "5" with four different continuations: n-gram trees
        let prompts: Vec<Vec<u32>> = vec![
            vec![7],
            vec![1, 2, 3, 1, 2, 3, 1, 2],
            (0..37).map(|_| r.gen_range(0..v)).collect(),
            vec![5, 6, 7, 5, 8, 9, 5, 6, 10, 5, 11, 5],
        ];
        let mut tree_cycles = [0, 0, 0]; // ngram tree, model+ngram, model top-3 tree
        for (i, prompt) in prompts.iter().enumerate() {
            let want = plain(&mut target, prompt, &greedy_opts(20));
            for (name, draft) in drafts.iter_mut() {
                // (lean: the tree draft on the repetitive prompts, the last prompt for n-grams only)
                let tree = name.contains("tree") || *name == "model+ngram";
                if (tree && i % 2 == 0) || (i == 3 && !name.contains("ngram")) {
                    continue;
                }
                // (lean: Qwen3, Phi-3 and Gemma 3 with themselves and with n-gram trees)
                if (spec.qwen3 || spec.phi3 || spec.gemma3) && !matches!(*name, "itself" | "ngram tree") {
                    continue;
                }
                for k in [KPolicy::Fixed(1), KPolicy::Fixed(4), KPolicy::Fixed(9), KPolicy::default()] {
                    let got = speculative(&mut target, draft.drafter(), prompt, &greedy_opts(20), k);
                    assert_eq!(
                        got.tokens,
                        want.tokens,
                        "{:?} draft {name} {k:?} prompt {prompt:?}",
                        spec.arch_of()
                    );
                    assert_eq!(got.finish, want.finish);
                    let s = &got.stats;
                    assert_eq!(s.base.generated_tokens, 20);
                    assert_eq!(got.from_draft.iter().filter(|&&d| d).count(), s.accepted);
                    assert_eq!(s.verify_forwards + s.accepted, 20, "every cycle adds accepted + 1 tokens");
                    if *name == "itself" {
                        assert_eq!(s.accepted, s.drafted, "a draft equal to the target is always accepted");
                    }
                    if !tree {
                        assert_eq!(s.tree_cycles, 0, "{name}: chains only");
                    }
                    let which =
                        if name.starts_with("model") { 1 + usize::from(name.contains("tree")) } else { 0 };
                    tree_cycles[which] += s.tree_cycles;
                }
            }
        }
        // (Qwen3, Phi-3 and Gemma 3 ran the n-gram trees only)
        let ran = if spec.qwen3 || spec.phi3 || spec.gemma3 { &tree_cycles[..1] } else { &tree_cycles[..] };
        assert!(ran.iter().all(|&n| n > 0), "the tree drafts verified trees: {tree_cycles:?}");
    }
}

#[test]
fn gpu_resident_greedy_cycles_equal_cpu_driven_ones() {
    // The same draft model with the GPU cycle (K draft steps + verify + acceptance in one
    // submission, one read-back) and without it (a submission and read-back per step): the same
    // tokens, the same provenance, and K round trips fewer per GPU cycle. A GPU of its own: the
    // round-trip counters are per device, and other tests run beside this one.
    let own = Arc::new(pollster::block_on(Gpu::new()).expect("gpu"));
    let load = |ckpt: &Checkpoint| {
        let opts = LoadOptions { context: Some(64), ..Default::default() };
        Model::load(own.clone(), ckpt, &opts, &mut |_| {}).expect("load")
    };
    let spec = TinySpec::qwen2();
    let mut r = rng(310);
    let tiny = TinyModel::random(spec, &mut r);
    let target_ckpt = ckpt_of(&tiny, &mut r);
    let cfg = target_ckpt.config.clone();
    let mut target = load(&target_ckpt);
    let v = spec.vocab as u32;
    let prompt: Vec<u32> = (0..45).map(|_| r.gen_range(0..v)).collect();
    for (noise, k) in [(0.0, 4usize), (0.05, 3), (0.05, 1), (0.3, 6)] {
        let draft_ckpt = if noise > 0.0 {
            ckpt_of(&perturbed(&tiny, noise, &mut r), &mut r)
        } else {
            ckpt_of(&tiny, &mut r)
        };
        let mut on = DraftModel::new(load(&draft_ckpt), &cfg).expect("draft");
        let mut off = DraftModel::new(load(&draft_ckpt), &cfg).expect("draft");
        off.set_gpu_cycle(false);
        let opts = greedy_opts(19);
        let a = speculative(&mut target, &mut on, &prompt, &opts, KPolicy::Fixed(k));
        let b = speculative(&mut target, &mut off, &prompt, &opts, KPolicy::Fixed(k));
        let want = plain(&mut target, &prompt, &opts);
        let what = format!("noise {noise} K={k}");
        assert_eq!(a.tokens, want.tokens, "{what}: GPU cycle vs plain greedy");
        assert_eq!(b.tokens, want.tokens, "{what}: CPU-driven vs plain greedy");
        assert_eq!(a.from_draft, b.from_draft, "{what}: provenance");
        assert_eq!((a.stats.drafted, a.stats.accepted), (b.stats.drafted, b.stats.accepted), "{what}");
        assert!(a.stats.gpu_cycles >= 2, "{what}: {} GPU cycles", a.stats.gpu_cycles);
        assert_eq!(b.stats.gpu_cycles, 0, "{what}: turned off");
        // A CPU-driven cycle reads back each of its K' draft steps (K' = K but near the end, where
        // fewer tokens are wanted) and its verify pass; a GPU cycle reads back once.
        let cycles = a.stats.gpu_cycles as u64;
        let saved = b.stats.readbacks - a.stats.readbacks;
        assert!((cycles..=k as u64 * cycles).contains(&saved), "{what}: {saved} read-backs saved");
        assert_eq!(b.stats.submits - a.stats.submits, saved, "{what}: one submission per read-back saved");
    }
}

#[test]
fn stop_conditions_work_inside_an_accepted_run() {
    let mut r = rng(400);
    let tiny = TinyModel::random(TinySpec::llama(), &mut r);
    let ckpt = ckpt_of(&tiny, &mut r);
    let mut target = load(&ckpt, 64);
    let mut draft = DraftModel::new(load(&ckpt, 64), &ckpt.config).expect("draft");
    let prompt = [4u32, 9, 16];
    let want = plain(&mut target, &prompt, &greedy_opts(24));
    // The target as its own draft with K = 8 accepts runs of 8: every stop lands inside a run.
    let k = KPolicy::Fixed(8);
    for stop_at in [2usize, 5, 11] {
        let stop = want.tokens[stop_at];
        let first = want.tokens.iter().position(|&t| t == stop).expect("present");
        let opts = GenerateOptions { stop_tokens: vec![stop], ..greedy_opts(24) };
        let got = speculative(&mut target, &mut draft, &prompt, &opts, k);
        assert_eq!(got.tokens, want.tokens[..=first]);
        assert_eq!(got.finish, FinishReason::Stop);
    }
    for max in [1usize, 3, 10] {
        let got = speculative(&mut target, &mut draft, &prompt, &greedy_opts(max), k);
        assert_eq!(got.tokens, want.tokens[..max]);
        assert_eq!(got.finish, FinishReason::Length);
    }
    // The callback stops after its 6th token.
    let mut seen = 0;
    let got = pollster::block_on(speculative::generate(
        &mut target,
        Drafter::Model(&mut draft),
        &prompt,
        &greedy_opts(24),
        k,
        &mut |_, _| {
            seen += 1;
            seen < 6
        },
    ))
    .expect("generate");
    assert_eq!(got.tokens, want.tokens[..6]);
    assert_eq!(got.finish, FinishReason::Cancelled);
    // The context end: as many tokens as plain generation gives.
    let mut small = load(&ckpt, 12);
    let mut small_draft = DraftModel::new(load(&ckpt, 12), &ckpt.config).expect("draft");
    let want = plain(&mut small, &prompt, &greedy_opts(100));
    let got = speculative(&mut small, &mut small_draft, &prompt, &greedy_opts(100), k);
    assert_eq!(got.tokens, want.tokens);
    assert_eq!(got.finish, FinishReason::Length);
}

#[test]
fn sampled_speculation_is_seeded_and_deterministic() {
    let mut r = rng(500);
    let tiny = TinyModel::random(TinySpec::llama(), &mut r);
    let ckpt = ckpt_of(&tiny, &mut r);
    let mut target = load(&ckpt, 64);
    let mut draft = DraftModel::new(load(&ckpt_of(&perturbed(&tiny, 0.1, &mut r), &mut r), 64), &ckpt.config)
        .expect("draft");
    let opts = |seed| GenerateOptions {
        max_tokens: 12,
        sampling: SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.0, seed },
        stop_tokens: vec![],
    };
    let a = speculative(&mut target, &mut draft, &[1, 2, 3], &opts(9), KPolicy::Fixed(3));
    let b = speculative(&mut target, &mut draft, &[1, 2, 3], &opts(9), KPolicy::Fixed(3));
    let c = speculative(&mut target, &mut draft, &[1, 2, 3], &opts(10), KPolicy::Fixed(3));
    assert_eq!(a.tokens, b.tokens);
    assert_ne!(a.tokens, c.tokens);
    assert_eq!(a.tokens.len(), 12);
}

/// Under sampling, drafts change nothing but the speed: with the GPU's draws, every token is the
/// one plain sampled decoding with the same seed gives (an emitted token is the target's draw at
/// its position, whatever K and whatever was drafted): n-gram chains at fixed and adaptive K,
/// n-gram trees and an EAGLE head's trees, and a draft model's chains (drawn with the target's
/// noise: GPU-resident cycles with the CPU-driven calibrating ones, and CPU-driven steps alone;
/// one whose logits are NaN fails nothing), several seeds and sampling parameters.
#[test]
fn sampled_speculation_gives_plain_sampling_tokens() {
    let mut r = rng(660);
    let tiny = TinyModel::random(TinySpec::llama(), &mut r);
    let ckpt = ckpt_of(&tiny, &mut r);
    let mut target = load(&ckpt, 96);
    // (an EAGLE head that passes the target's features through: its guesses are often right)
    let (file, config) = common::tiny::eagle_head(&tiny.spec, DType::F32, false, true, &mut r);
    let head = load_eagle(&mut target, file, &config, 4).0;
    let ngram = |branches| Owned::Other(Box::new(NGram { max_n: 3, min_n: 1, branches }));
    let itself = Owned::Model(Box::new(DraftModel::new(load(&ckpt, 96), &ckpt.config).expect("draft")));
    // a draft model whose logits are not finite (weights that overflow f32: the loader refuses
    // non-finite ones): its draws are tokens all the same, and fail nothing
    let mut nan = perturbed(&tiny, 0.05, &mut r);
    for t in nan.tensors.iter_mut().filter(|t| t.name == "output_norm.weight") {
        t.values.iter_mut().for_each(|v| *v = 3e38);
    }
    let nan = Owned::Model(Box::new(
        DraftModel::new(load(&ckpt_of(&nan, &mut r), 96), &ckpt.config).expect("draft"),
    ));
    // a draft model: the target perturbed (its draws often the target's, not always)
    let mut draft_model = |gpu_cycle: bool| {
        let dm = load(&ckpt_of(&perturbed(&tiny, 0.05, &mut r), &mut r), 96);
        let mut d = DraftModel::new(dm, &ckpt.config).expect("draft");
        d.set_gpu_cycle(gpu_cycle);
        Owned::Model(Box::new(d))
    };
    let mut drafts: Vec<(&str, Owned, KPolicy, [usize; 2])> = vec![
        ("model K=3", draft_model(true), KPolicy::Fixed(3), [0; 2]),
        ("model CPU-driven K=2", draft_model(false), KPolicy::Fixed(2), [0; 2]),
        ("the target as its draft", itself, KPolicy::Fixed(3), [0; 2]),
        ("a draft of NaN logits", nan, KPolicy::Fixed(2), [0; 2]),
        ("ngram K=1", ngram(1), KPolicy::Fixed(1), [0; 2]),
        ("ngram K=3", ngram(1), KPolicy::Fixed(3), [0; 2]),
        ("ngram adaptive", ngram(1), KPolicy::Adaptive { max: 6 }, [0; 2]),
        ("ngram tree", ngram(3), KPolicy::Fixed(3), [0; 2]),
        (
            "eagle tree",
            Owned::Other(Box::new(Eagle::with_tree(head, EagleTree::Dynamic { width: 3 }))),
            KPolicy::Fixed(3),
            [0; 2],
        ),
    ];
    let prompt = [5u32, 9, 2, 7, 5, 9, 2, 7, 5, 9, 2];
    // the draft model's GPU-resident cycles, and its CPU-driven ones (calibrating)
    let mut resident = [0usize; 2];
    for params in [
        SamplingParams { temperature: 0.5, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 },
        // (a top-k above the 16 ids that top_k.wgsl ranks: cut by sample.wgsl's own select)
        SamplingParams { temperature: 0.9, top_k: 24, top_p: 0.9, min_p: 0.0, seed: 0 },
    ] {
        for seed in 0..3 {
            let opts = GenerateOptions {
                max_tokens: 24,
                sampling: SamplingParams { seed, ..params },
                stop_tokens: vec![],
            };
            let want = plain(&mut target, &prompt, &opts);
            for (name, draft, k, counts) in drafts.iter_mut() {
                let got = speculative(&mut target, draft.drafter(), &prompt, &opts, *k);
                assert_eq!(got.tokens, want.tokens, "{name} {params:?} seed {seed}: {:?}", got.stats);
                assert_eq!(got.stats.gpu_sampled, got.stats.verify_forwards, "{name}: drawn on the GPU");
                if *name == "model K=3" {
                    resident[0] += got.stats.gpu_cycles;
                    resident[1] += got.stats.verify_forwards - got.stats.gpu_cycles;
                }
                counts[0] += got.stats.accepted;
                counts[1] += got.stats.drafted - got.stats.accepted;
            }
        }
    }
    // (each draft had drafts kept, and rejected: both sides of the rule were taken; but the
    // target as its own draft model, whose draws with the same noise are the target's: none
    // rejected, in the resident cycles and the CPU-driven ones alike)
    for (name, _, _, [kept, rejected]) in &drafts {
        eprintln!("{name}: {kept} drafts kept, {rejected} rejected");
        match *name {
            "the target as its draft" => assert!(*kept > 0 && *rejected == 0, "{name}: {kept} kept"),
            "a draft of NaN logits" => assert!(*kept + *rejected > 0, "{name}: it drafted"),
            _ => assert!(*kept > 0 && *rejected > 0, "{name}: {kept} kept, {rejected} rejected"),
        }
    }
    eprintln!("the draft model's cycles: {} resident, {} others", resident[0], resident[1]);
    assert!(resident[0] > 0 && resident[1] > 0, "both kinds of cycles ran: {resident:?}");
}

/// First- and second-token frequencies under speculative sampling on the GPU converge to the
/// target's own distribution, for a good draft (the target perturbed), a bad one (an unrelated
/// model), n-gram lookup and trees (n-gram continuations, an EAGLE head's guesses; a draw per
/// node on the GPU).
#[test]
fn speculative_sampling_on_the_gpu_has_the_target_distribution() {
    const V: usize = 12;
    let spec = TinySpec { vocab: V, ..TinySpec::llama() };
    let mut r = rng(600);
    let mut tiny = TinyModel::random(spec, &mut r);
    // Small (tied) embeddings: logits of a few units, so every token has a visible probability
    // (the input side is rms-normalised and barely changes).
    for t in tiny.tensors.iter_mut().filter(|t| t.name == "token_embd.weight") {
        t.values.iter_mut().for_each(|v| *v *= 0.08);
    }
    let ckpt = ckpt_of(&tiny, &mut r);
    let mut target = load(&ckpt, 32);
    let good = load(&ckpt_of(&perturbed(&tiny, 0.1, &mut r), &mut r), 32);
    let bad = load(&ckpt_of(&TinyModel::random(spec, &mut r), &mut r), 32);
    let mut drafts: Vec<(&str, Owned)> = vec![
        ("good", Owned::Model(Box::new(DraftModel::new(good, &ckpt.config).expect("draft")))),
        ("bad", Owned::Model(Box::new(DraftModel::new(bad, &ckpt.config).expect("draft")))),
        ("ngram", Owned::Other(Box::new(NGram { max_n: 1, min_n: 1, branches: 1 }))),
        // "3" was followed by "7 3" and "5 3 7": a two-branch tree, the multi-candidate rule
        ("ngram tree", Owned::Other(Box::new(NGram { max_n: 1, min_n: 1, branches: 3 }))),
    ];
    // an EAGLE head: EAGLE-2's dynamic trees (deterministic)
    let (file, config) = common::tiny::eagle_head(&tiny.spec, DType::F32, false, false, &mut r);
    let dynamic = EagleTree::Dynamic { width: 3 };
    drafts.push((
        "eagle tree",
        Owned::Other(Box::new(Eagle::with_tree(load_eagle(&mut target, file, &config, 4).0, dynamic))),
    ));
    let prompt = [3u32, 5, 3, 7, 3];
    for params in [
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 },
        SamplingParams { temperature: 0.6, top_k: 0, top_p: 0.9, min_p: 0.4, seed: 0 },
    ] {
        // Exact marginals of the first two tokens from the target's logits.
        let first_logits = pollster::block_on(target.forward_last(&prompt, 0)).expect("forward");
        let p1 = Dist::from_logits(&first_logits, &params);
        let uncut = Dist::from_logits(&first_logits, &SamplingParams { min_p: 0.0, ..params });
        assert!(params.min_p == 0.0 || uncut.pairs().len() > p1.pairs().len(), "the min-p cuts");
        let mut p2 = vec![0.0; V];
        for &(a, pa) in p1.pairs() {
            let l = pollster::block_on(target.forward_last(&[a], prompt.len())).expect("forward");
            for &(b, pb) in Dist::from_logits(&l, &params).pairs() {
                p2[b as usize] += pa * pb;
            }
        }
        let p1: Vec<f64> = (0..V).map(|t| p1.prob(t as u32)).collect();
        eprintln!("{params:?}: first-token distribution {p1:.3?}, second {p2:.3?}");
        assert!(p1.iter().filter(|&&p| p > 0.03).count() >= 3, "a flat enough target distribution");
        for (name, draft) in drafts.iter_mut() {
            if name.ends_with("tree") && params.top_p < 1.0 {
                continue; // (lean: the tree rule once; it does not depend on top-p)
            }
            let mut trees = 0;
            let (mut c1, mut c2) = (vec![0usize; V], vec![0usize; V]);
            let mut n = 0;
            for target_n in [45usize, 360] {
                while n < target_n {
                    // (the tree draft: 3 tokens, so that the first cycle may draft K = 2, a
                    // two-branch tree; the other drafts need not run the third)
                    let opts = GenerateOptions {
                        max_tokens: if name.ends_with("tree") { 3 } else { 2 },
                        sampling: SamplingParams { seed: 77_000 + n as u64, ..params },
                        stop_tokens: vec![],
                    };
                    let g = speculative(&mut target, draft.drafter(), &prompt, &opts, KPolicy::Fixed(2));
                    trees += g.stats.tree_cycles;
                    // n-gram chains and trees verify on the GPU: every verify pass drew there, the
                    // trees' too
                    if *name == "ngram" || name.ends_with("tree") {
                        assert_eq!(g.stats.gpu_sampled, g.stats.verify_forwards, "{name}: {:?}", g.stats);
                    }
                    c1[g.tokens[0] as usize] += 1;
                    c2[g.tokens[1] as usize] += 1;
                    n += 1;
                }
                let bound = 1.2 * (V as f64 / n as f64).sqrt();
                let (t1, t2) = (tv(&c1, &p1), tv(&c2, &p2));
                eprintln!("{params:?} {name}: N={n} TV first {t1:.3}, second {t2:.3}, bound {bound:.3}");
                assert!(t1 < bound && t2 < bound, "{name} draft N={n}: TV {t1:.3} / {t2:.3} >= {bound:.3}");
            }
            assert_eq!(trees > 0, name.ends_with("tree"), "{name}: {trees} tree cycles");
        }
    }
}

/// The GPU-resident sampled cycle (a draft model's draws, the verify pass's draws and the
/// acceptance on the GPU, one read-back) keeps the target's distribution: the first token's
/// frequencies against its exact marginal, for a good and a bad draft, with a top-k, a top-p or
/// neither; plain sampled decoding too.
#[test]
fn gpu_sampled_cycles_have_the_target_distribution() {
    const V: usize = 12;
    let spec = TinySpec { vocab: V, ..TinySpec::llama() };
    let mut r = rng(620);
    let mut tiny = TinyModel::random(spec, &mut r);
    for t in tiny.tensors.iter_mut().filter(|t| t.name == "token_embd.weight") {
        t.values.iter_mut().for_each(|v| *v *= 0.08);
    }
    // a GPU of its own: the round-trip counters are per device, and other tests run beside this one
    let own = Arc::new(pollster::block_on(Gpu::new()).expect("gpu"));
    let load = |ckpt: &Checkpoint| {
        let opts = LoadOptions { context: Some(32), ..Default::default() };
        Model::load(own.clone(), ckpt, &opts, &mut |_| {}).expect("load")
    };
    let ckpt = ckpt_of(&tiny, &mut r);
    let mut target = load(&ckpt);
    let good = load(&ckpt_of(&perturbed(&tiny, 0.1, &mut r), &mut r));
    let bad = load(&ckpt_of(&TinyModel::random(spec, &mut r), &mut r));
    let prompt = [3u32, 5, 3, 7, 3];
    let n_past = prompt.len() - 1;
    // plain sampled decoding: one GPU draw per token, one read-back each
    let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 };
    let logits = pollster::block_on(target.forward_last(&prompt, 0)).expect("forward");
    let p1: Vec<f64> = (0..V).map(|t| Dist::from_logits(&logits, &params).prob(t as u32)).collect();
    let mut counts = vec![0usize; V];
    for seed in 0..400 {
        let opts = GenerateOptions {
            max_tokens: 1,
            sampling: SamplingParams { seed, ..params },
            stop_tokens: vec![],
        };
        let g = plain(&mut target, &prompt, &opts);
        assert_eq!((g.stats.gpu_sampled, g.stats.readbacks), (1, 1), "a plain sampled step: {:?}", g.stats);
        counts[g.tokens[0] as usize] += 1;
    }
    assert_fits("plain sampled decoding: first tokens", &counts, &p1);
    for (name, dm) in [("good", good), ("bad", bad)] {
        let mut draft = DraftModel::new(dm, &ckpt.config).expect("draft");
        for params in [
            SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 },
            SamplingParams { temperature: 0.7, top_k: 5, top_p: 1.0, min_p: 0.0, seed: 0 },
            SamplingParams { temperature: 1.2, top_k: 0, top_p: 0.9, min_p: 0.5, seed: 0 },
        ] {
            let logits = pollster::block_on(target.forward_last(&prompt, 0)).expect("forward");
            let p1 = Dist::from_logits(&logits, &params);
            let uncut = Dist::from_logits(&logits, &SamplingParams { min_p: 0.0, ..params });
            assert!(params.min_p == 0.0 || uncut.pairs().len() > p1.pairs().len(), "the min-p cuts");
            let p1: Vec<f64> = (0..V).map(|t| p1.prob(t as u32)).collect();
            let cycle = SampledCycle::new(&target, Some(draft.model()), &params).expect("cycle");
            let mut seeds = Rng::new(91);
            let mut counts = vec![0usize; V];
            let (mut accepted, n) = (0, 400);
            let trips = target.gpu().round_trips();
            for _ in 0..n {
                target.truncate(n_past);
                let at = CycleAt { target: &mut target, draft: &mut draft, context: &prompt, n_past, k: 2 };
                cycle.reseed(at.target.gpu(), seeds.next_u64());
                let out = pollster::block_on(cycle.run(at)).expect("cycle");
                assert_eq!(out.drafts.len(), 2);
                accepted += out.accepted;
                counts[if out.accepted > 0 { out.drafts[0] } else { out.next } as usize] += 1;
            }
            let spent = target.gpu().round_trips() - trips;
            eprintln!("{name} {params:?}: {accepted} drafts kept, {spent:?}");
            assert_fits(&format!("{name} {params:?}: first tokens"), &counts, &p1);
            assert!(accepted > 0 && accepted < 2 * n, "{name}: {accepted} of {} drafts kept", 2 * n);
            // one submission and one read-back per cycle (the draft catches up inside it)
            assert_eq!((spent.submits, spent.readbacks), (n as u64, n as u64), "{name}: round trips");
        }
    }
}

/// A token tree under sampling with its draws on the GPU (`SampledCycle::check_tree`: one draw
/// from each node's distribution, the walk down the children holding them) emits the target's
/// distribution: the first token, and the second after each child, against their exact joint
/// distribution. One submission and one read-back per tree, with no logits row in it.
#[test]
fn gpu_tree_draws_have_the_target_distribution() {
    const V: usize = 12;
    let spec = TinySpec { vocab: V, ..TinySpec::llama() };
    let mut r = rng(640);
    let mut tiny = TinyModel::random(spec, &mut r);
    for t in tiny.tensors.iter_mut().filter(|t| t.name == "token_embd.weight") {
        t.values.iter_mut().for_each(|v| *v *= 0.08);
    }
    // a GPU of its own: the round-trip counters are per device
    let own = Arc::new(pollster::block_on(Gpu::new()).expect("gpu"));
    let ckpt = ckpt_of(&tiny, &mut r);
    let opts = LoadOptions { context: Some(32), ..Default::default() };
    let mut target = Model::load(own, &ckpt, &opts, &mut |_| {}).expect("load");
    let prompt = [3u32, 5, 3, 7, 3];
    let n_past = prompt.len() - 1;
    let params = SamplingParams { temperature: 0.9, top_k: 9, top_p: 1.0, min_p: 0.0, seed: 0 };
    let mut dist = |tokens: &[u32], pos: usize| {
        let logits = pollster::block_on(target.forward_last(tokens, pos)).expect("forward");
        Dist::from_logits(&logits, &params)
    };
    let three = |d: &Dist| {
        let mut pairs = d.pairs().to_vec();
        pairs.sort_by(|a, b| b.1.total_cmp(&a.1));
        pairs.iter().take(3).map(|&(t, _)| t).collect::<Vec<u32>>()
    };
    // the root's three likeliest tokens as its children, the first with its own three below it
    let p_root = dist(&prompt, 0);
    let kids = three(&p_root);
    let p_kid: Vec<Dist> = kids.iter().map(|&c| dist(&[c], prompt.len())).collect();
    let mut tree = TokenTree::new(prompt[n_past]);
    let nodes: Vec<usize> = kids.iter().map(|&c| tree.child(0, c).expect("node")).collect();
    for g in three(&p_kid[0]) {
        tree.child(nodes[0], g).expect("node");
    }
    // outcomes: a first token t that no child holds (bin t), or child i then a second token t
    // (bin V + V i + t): probability p_root(child i) p_child_i(t), whether a grandchild holds t
    // or the draw at child i gives it
    let mut want = vec![0.0; V + V * kids.len()];
    for t in 0..V as u32 {
        match kids.iter().position(|&c| c == t) {
            None => want[t as usize] = p_root.prob(t),
            Some(i) => {
                for u in 0..V as u32 {
                    want[V + V * i + u as usize] = p_root.prob(t) * p_kid[i].prob(u);
                }
            }
        }
    }
    let cycle = SampledCycle::new(&target, None, &params).expect("cycle");
    let mut seeds = Rng::new(93);
    let (n, mut counts, mut deep) = (1500, vec![0usize; want.len()], 0);
    let trips = target.gpu().round_trips();
    for _ in 0..n {
        target.truncate(n_past);
        cycle.reseed(target.gpu(), seeds.next_u64());
        let v = pollster::block_on(cycle.check_tree(&mut target, &tree, n_past)).expect("tree");
        let emitted: Vec<u32> = v.path[1..].iter().map(|&i| tree.tokens()[i]).chain([v.next]).collect();
        deep += (v.path.len() == 3) as usize;
        counts[match kids.iter().position(|&c| c == emitted[0]) {
            None => emitted[0] as usize,
            Some(i) => V + V * i + emitted[1] as usize,
        }] += 1;
    }
    let spent = target.gpu().round_trips() - trips;
    eprintln!("{deep} of {n} trees accepted a grandchild; {spent:?}");
    assert!(deep > 50, "the grandchildren were tried");
    assert_fits("a sampled tree's first two tokens", &counts, &want);
    assert_eq!((spent.submits, spent.readbacks), (n as u64, n as u64), "round trips");
}

/// A tree node's draw is the draw at its depth's position: a sampled tree whose path runs through
/// second children (rows past their depth) emits plain sampled decoding's tokens for the same
/// seed, for many seeds.
#[test]
fn a_sampled_trees_draws_are_plain_samplings_at_each_depth() {
    let mut r = rng(650);
    let mut tiny = TinyModel::random(TinySpec { vocab: 12, ..TinySpec::llama() }, &mut r);
    for t in tiny.tensors.iter_mut().filter(|t| t.name == "token_embd.weight") {
        t.values.iter_mut().for_each(|v| *v *= 0.08); // a flat distribution: draws vary
    }
    let mut target = load(&ckpt_of(&tiny, &mut r), 32);
    let prompt = [3u32, 5, 3, 7, 3];
    let n_past = prompt.len() - 1;
    for seed in 0..12 {
        let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed };
        let opts = GenerateOptions { max_tokens: 3, sampling: params, stop_tokens: vec![] };
        let t = plain(&mut target, &prompt, &opts).tokens;
        // root -> [another, t0] ; t0 -> [another, t1]: the path is rows 0, 2, 4 at depths 0, 1, 2
        let other = |x: u32| (x + 1) % 12;
        let mut tree = TokenTree::new(prompt[n_past]);
        tree.child(0, other(t[0])).expect("node");
        let first = tree.child(0, t[0]).expect("node");
        tree.child(first, other(t[1])).expect("node");
        let second = tree.child(first, t[1]).expect("node");
        pollster::block_on(target.forward_last(&prompt[..n_past], 0)).expect("prefill");
        let cycle = SampledCycle::new(&target, None, &params).expect("cycle");
        let v = pollster::block_on(cycle.check_tree(&mut target, &tree, n_past)).expect("tree");
        assert_eq!((v.path.clone(), v.next), (vec![0, first, second], t[2]), "seed {seed}: plain gave {t:?}");
    }
}

/// The distribution sampling draws from, computed the plain way: every token sorted, most likely
/// first (ties by id), top-k, softmax, top-p, renormalised.
fn distribution_by_full_sort(logits: &[f32], params: &SamplingParams) -> Vec<(u32, f64)> {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    if params.top_k > 0 {
        idx.truncate(params.top_k);
    }
    let max = logits[idx[0] as usize] as f64;
    let t = params.temperature as f64;
    let mut probs: Vec<f64> = idx.iter().map(|&i| ((logits[i as usize] as f64 - max) / t).exp()).collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    let mut acc = 0.0;
    let keep = probs.iter().position(|p| {
        acc += p;
        acc >= params.top_p as f64
    });
    let keep = keep.filter(|_| params.top_p < 1.0).map_or(probs.len(), |i| i + 1);
    idx.truncate(keep);
    probs.truncate(keep);
    let sum: f64 = probs.iter().sum();
    idx.into_iter().zip(probs.into_iter().map(|p| p / sum)).collect()
}

#[test]
fn sampling_distribution_selects_what_a_full_sort_does() {
    // Flat, peaked and tied rows, small and vocabulary-sized: the selection (top-k by a partial
    // select, top-p in growing prefixes, no sort without either) must keep exactly the tokens a
    // full sort keeps, in its order wherever a top-k or top-p asks for one, with the same
    // probabilities (summed in another order: 1e-12).
    let mut r = rng(900);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for n in [7usize, 300, 151_936] {
        rows.push((0..n).map(|_| r.gen_range(-10.0f32..10.0)).collect()); // flat
        let mut peaked: Vec<f32> = (0..n).map(|_| r.gen_range(-10.0f32..0.0)).collect();
        for _ in 0..5 {
            let i = r.gen_range(0..n);
            peaked[i] = r.gen_range(5.0f32..15.0);
        }
        rows.push(peaked);
        rows.push((0..n).map(|i| (i % 5) as f32).collect()); // ties everywhere
    }
    for row in &rows {
        for (top_k, top_p) in [
            (0, 1.0f32),
            (0, 0.9),
            (0, 0.5),
            (0, 0.01),
            (1, 1.0),
            (5, 0.8),
            (40, 1.0),
            (100_000, 0.95),
            (200_000, 1.0),
        ] {
            let params = SamplingParams { temperature: 0.7, top_k, top_p, min_p: 0.0, seed: 0 };
            let what = format!("{} tokens, top_k {top_k}, top_p {top_p}", row.len());
            let got = sampling::distribution(row, &params);
            let want = distribution_by_full_sort(row, &params);
            let in_id_order = top_k == 0 && top_p == 1.0;
            let mut got_sorted = got.clone();
            if in_id_order {
                assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "{what}: not in id order");
                got_sorted
                    .sort_by(|a, b| row[b.0 as usize].total_cmp(&row[a.0 as usize]).then(a.0.cmp(&b.0)));
            }
            assert_eq!(got_sorted.len(), want.len(), "{what}: tokens kept");
            for (g, w) in got_sorted.iter().zip(&want) {
                assert_eq!(g.0, w.0, "{what}: token order");
                assert!((g.1 - w.1).abs() <= 1e-12, "{what}: p({}) {} vs {}", g.0, g.1, w.1);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Medusa heads
// ---------------------------------------------------------------------------------------------

/// Medusa heads from the bytes of their file and config (see `tiny::medusa_heads`) for `target`.
fn load_heads(target: &Model, file: Vec<u8>, config: &[u8], top_k: usize) -> MedusaHeads {
    let ckpt =
        Checkpoint::from_named_safetensors(target.config.clone(), vec![Box::new(file)]).expect("heads");
    let (c, prefix) = MedusaConfig::of_checkpoint(&ckpt, Some(config)).expect("medusa config");
    let opts = LoadOptions::default();
    pollster::block_on(MedusaHeads::load(target, &ckpt, (c, &prefix), &opts, top_k, &mut |_| {}))
        .expect("load heads")
}

#[test]
fn medusa_heads_rank_what_the_reference_heads_rank() {
    // The heads read the right row of the target's pass (its final hidden state after the output
    // norm), run their residual blocks and projections, and rank ids as a CPU reference does.
    // Heads with their own projections, and heads that share the target's output matrix.
    for (spec, dtype, heads, layers, kind) in [
        (TinySpec::llama(), DType::F16, 3, 1, MedusaKind::Random),
        (TinySpec::qwen2(), DType::F32, 2, 2, MedusaKind::Random),
        (TinySpec::qwen2(), DType::F16, 4, 1, MedusaKind::Shared),
    ] {
        let mut r = rng(340 + spec.qwen2 as u64);
        let tiny = TinyModel::random(spec, &mut r);
        let ckpt = ckpt_of(&tiny, &mut r);
        let mut target = load(&ckpt, 64);
        let (file, config) = common::tiny::medusa_heads(&tiny, heads, layers, dtype, kind, &mut r);
        let values = Checkpoint::from_named_safetensors(ckpt.config.clone(), vec![Box::new(file.clone())])
            .expect("heads");
        let medusa = load_heads(&target, file, &config, 8);
        let shared_output = kind == MedusaKind::Shared;
        assert_eq!(medusa.config, MedusaConfig { heads, layers, shared_output });
        let mut reference = reference::RefModel::new(&ckpt, Precision::Auto);
        let prompt: Vec<u32> = (0..9).map(|_| r.gen_range(0..spec.vocab as u32)).collect();
        pollster::block_on(target.forward(&prompt, 0)).expect("forward");
        reference.forward(&prompt, 0);
        let get = |name: String, shape: Vec<usize>| {
            values.tensor(&name, &shape, Precision::F32).expect("tensor").to_f32().expect("f32")
        };
        // several rows at once (the batch's sequences): each row's ids are its own run's
        let rows = [8usize, 0, 4, 4, 7, 1, 2, 3];
        let together = pollster::block_on(medusa.top_rows(&rows)).expect("rows");
        for (&row, got) in rows.iter().zip(&together) {
            assert_eq!(got, &pollster::block_on(medusa.top(row)).expect("top"), "row {row} among {rows:?}");
        }
        let three = pollster::block_on(medusa.top_rows(&rows[2..5])).expect("rows");
        assert_eq!(three[..], together[2..5], "a run of three rows");
        for bad in [&[][..], &[0; 9][..], &[wgspec::model::MAX_BATCH][..]] {
            assert!(pollster::block_on(medusa.top_rows(bad)).is_err(), "{bad:?} refused");
        }
        for row in [0, 4, 8] {
            let top = pollster::block_on(medusa.top(row)).expect("top");
            for (h, ids) in top.iter().enumerate() {
                let mut x = reference.hidden[row].clone();
                for l in 0..layers {
                    let w = get(format!("{h}.{l}.linear.weight"), vec![spec.dim, spec.dim]);
                    let b = get(format!("{h}.{l}.linear.bias"), vec![spec.dim]);
                    let y = reference::matvec(&w, &x, spec.dim, spec.dim);
                    for i in 0..spec.dim {
                        let v = (y[i] + b[i]) as f64;
                        x[i] = (x[i] as f64 + v / (1.0 + (-v).exp())) as f32;
                    }
                }
                let out = match shared_output {
                    true => {
                        let name = if spec.tied { "token_embd.weight" } else { "output.weight" };
                        let t = ckpt.tensor(name, &[spec.vocab, spec.dim], Precision::F32).expect("output");
                        t.to_f32().expect("f32")
                    }
                    false => get(format!("{h}.{layers}.weight"), vec![spec.vocab, spec.dim]),
                };
                let logits = reference::matvec(&out, &x, spec.vocab, spec.dim);
                let mut sorted = logits.clone();
                sorted.sort_by(|a, b| b.total_cmp(a));
                for (rank, &id) in ids.iter().enumerate() {
                    let (got, want) = (logits[id as usize], sorted[rank]);
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "qwen2={} row {row} head {h} rank {rank}: id {id} has {got}, the reference's has {want}",
                        spec.qwen2
                    );
                }
            }
        }
    }
}

/// A draft that records, per proposal, the context's last token and its first draft token.
struct Recording<'a> {
    draft: &'a mut dyn Draft,
    guesses: Vec<(u32, u32)>,
}

impl Draft for Recording<'_> {
    fn kind(&self) -> DraftKind {
        self.draft.kind()
    }
    fn prefill<'a>(
        &'a mut self,
        prompt: &'a [u32],
    ) -> speculative::draft::LocalFuture<'a, wgspec::Result<usize>> {
        self.draft.prefill(prompt)
    }
    fn target_pass<'a>(
        &'a mut self,
        pass: Kept<'a>,
    ) -> speculative::draft::LocalFuture<'a, wgspec::Result<usize>> {
        self.draft.target_pass(pass)
    }
    fn propose<'a>(
        &'a mut self,
        ask: Ask<'a>,
    ) -> speculative::draft::LocalFuture<'a, wgspec::Result<speculative::Proposal>> {
        let Ask { context, budget, sampling } = ask;
        Box::pin(async move {
            let p = self.draft.propose(Ask { context, budget, sampling }).await?;
            if let (Some(&last), Some(&first)) = (context.last(), p.tokens().first()) {
                self.guesses.push((last, first));
            }
            Ok(p)
        })
    }
}

/// Greedy speculation with `drafts` (name, draft, whether it guesses the last token: heads that
/// copy the target's output or feature) equals plain greedy decoding on several prompts and Ks;
/// the guessing drafts' first guesses show they read the right row, and their trees are accepted.
fn heads_speculate_exactly(
    what: &str,
    target: &mut Model,
    drafts: &mut [(&str, &mut dyn Draft, bool)],
    r: &mut SmallRng,
) {
    let v = target.config.vocab_size as u32;
    let prompts: Vec<Vec<u32>> =
        vec![vec![7], vec![3, 3, 3, 3, 3, 3], (0..40).map(|_| r.gen_range(0..v)).collect()];
    let (mut trees, mut accepted) = (0, 0);
    for prompt in &prompts {
        let want = plain(target, prompt, &greedy_opts(24));
        for k in [KPolicy::Fixed(1), KPolicy::Fixed(3), KPolicy::default()] {
            for (name, draft, guesses_last) in drafts.iter_mut() {
                let mut rec = Recording { draft: &mut **draft, guesses: Vec::new() };
                let got = speculative(target, Drafter::Other(&mut rec), prompt, &greedy_opts(24), k);
                let what = format!("{what} {name} {k:?} prompt {prompt:?}");
                assert_eq!(got.tokens, want.tokens, "{what}");
                let s = &got.stats;
                assert_eq!(s.verify_forwards + s.accepted, 24, "{what}: every cycle adds accepted + 1");
                assert_eq!(got.from_draft.iter().filter(|&&d| d).count(), s.accepted, "{what}");
                // the last cycle that drafted, as a tree with its accepted path
                let t = s.last_cycle.as_ref().expect("a cycle drafted");
                let path_ok =
                    t.accepted.first() == Some(&0) && t.accepted.windows(2).all(|w| t.parents[w[1]] == w[0]);
                assert!(t.tokens.len() >= 2 && t.parents.len() == t.tokens.len() && path_ok, "{what}: {t:?}");
                if *guesses_last {
                    // the heads read the row that produced the last token: its own argmax
                    // (but the prompt's last token was not the target's choice: skipped)
                    let guesses = &rec.guesses[1.min(rec.guesses.len())..];
                    let right = guesses.iter().filter(|(last, first)| last == first).count();
                    assert!(
                        right * 10 >= guesses.len() * 9 && !guesses.is_empty(),
                        "{what}: the first guess was the last token in {right} of {guesses:?}",
                    );
                    trees += s.tree_cycles;
                    accepted += s.accepted;
                }
            }
        }
    }
    assert!(trees > 0 && accepted > 0, "{what}: trees verified ({trees}) and accepted ({accepted})");
}

#[test]
fn medusa_speculation_equals_greedy_output() {
    // (Gemma: the echo heads rank through its output norm and its tied projection)
    for spec in [TinySpec::llama(), TinySpec::qwen2(), TinySpec::gemma3()] {
        let mut r = rng(350 + spec.qwen2 as u64 + 2 * spec.gemma3 as u64);
        let tiny = TinyModel::random(spec, &mut r);
        let mut target = load(&ckpt_of(&tiny, &mut r), 64);
        let choices = speculative::medusa::default_choices();
        let (file, config) = common::tiny::medusa_heads(&tiny, 3, 1, DType::F16, MedusaKind::Random, &mut r);
        let mut random =
            Medusa::new(load_heads(&target, file, &config, 10), choices.clone()).expect("medusa");
        let (file, config) = common::tiny::medusa_heads(&tiny, 3, 1, DType::F16, MedusaKind::Shared, &mut r);
        let mut shared =
            Medusa::new(load_heads(&target, file.clone(), &config, 10), choices.clone()).expect("medusa");
        // the same heads' trees merged with the n-gram's continuations (the ensemble)
        let mut merged_heads =
            Medusa::new(load_heads(&target, file, &config, 10), choices.clone()).expect("medusa");
        let ngram = NGram { branches: 4, ..NGram::default() };
        let mut merged = Ensemble { draft: &mut merged_heads, ngram };
        // heads that rank what the target's output ranks at the row they read: head 0's first
        // guess is then the context's last token itself (which the target produced from that row)
        let (file, config) = common::tiny::medusa_heads(&tiny, 4, 1, DType::F32, MedusaKind::Echo, &mut r);
        let mut echo = Medusa::new(load_heads(&target, file, &config, 10), choices).expect("medusa");
        let mut drafts: [(&str, &mut dyn Draft, bool); 4] = [
            ("random", &mut random, false),
            ("shared", &mut shared, false),
            ("echo", &mut echo, true),
            ("shared+ngram", &mut merged, false),
        ];
        heads_speculate_exactly(&format!("{:?} medusa", spec.arch_of()), &mut target, &mut drafts, &mut r);
    }
}

#[test]
fn medusa_heads_and_paths_are_checked() {
    let spec = TinySpec::llama();
    let mut r = rng(360);
    let tiny = TinyModel::random(spec, &mut r);
    let target = load(&ckpt_of(&tiny, &mut r), 64);
    let (file, config) = common::tiny::medusa_heads(&tiny, 2, 1, DType::F32, MedusaKind::Random, &mut r);
    // a config that disagrees with the weights, a projection of another vocabulary
    let ckpt = Checkpoint::from_named_safetensors(target.config.clone(), vec![Box::new(file.clone())])
        .expect("heads");
    let err = MedusaConfig::of_checkpoint(&ckpt, Some(br#"{"medusa_num_heads": 5}"#))
        .expect_err("5 heads declared");
    assert!(err.to_string().contains("medusa_num_heads = 5"), "{err}");
    let mut other = target.config.clone();
    other.vocab_size += 1;
    let ckpt = Checkpoint::from_named_safetensors(other, vec![Box::new(file.clone())]).expect("heads");
    let (c, prefix) = MedusaConfig::of_checkpoint(&ckpt, None).expect("config");
    assert_eq!(c, MedusaConfig { heads: 2, layers: 1, shared_output: false });
    let _ = prefix;
    // some heads with a projection and others without
    let (w, b) = (f32_bytes(&vec![0.0; spec.dim * spec.dim]), f32_bytes(&vec![0.0; spec.dim]));
    let out = f32_bytes(&vec![0.0; spec.vocab * spec.dim]);
    let (wide, square, one) = (vec![spec.vocab, spec.dim], vec![spec.dim, spec.dim], vec![spec.dim]);
    let mixed = write_safetensors(&[
        ("0.0.linear.weight", DType::F32, &square, &w),
        ("0.0.linear.bias", DType::F32, &one, &b),
        ("0.1.weight", DType::F32, &wide, &out),
        ("1.0.linear.weight", DType::F32, &square, &w),
        ("1.0.linear.bias", DType::F32, &one, &b),
    ]);
    let ckpt =
        Checkpoint::from_named_safetensors(target.config.clone(), vec![Box::new(mixed)]).expect("heads");
    let err = MedusaConfig::of_checkpoint(&ckpt, None).expect_err("mixed projections");
    assert!(err.to_string().contains("heads [1] have no"), "{err}");
    // paths deeper than the heads, ranks past what they rank, a child before its parent
    let heads = || load_heads(&target, file.clone(), &config, 4);
    for (paths, why) in [
        (vec![vec![0], vec![0, 0], vec![0, 0, 0]], "1..=2 ranks"),
        (vec![vec![4]], "rank 4"),
        (vec![vec![0, 1], vec![0]], "before its parent"),
    ] {
        let err = Medusa::new(heads(), paths).err().expect("refused");
        assert!(err.to_string().contains(why), "{err}");
    }
}

// ---------------------------------------------------------------------------------------------
// EAGLE heads
// ---------------------------------------------------------------------------------------------

/// An EAGLE head from the bytes of its file and config (see `tiny::eagle_head`) for `target`.
/// An EAGLE-3 head's feature taps are set on `target` first.
fn load_eagle(target: &mut Model, file: Vec<u8>, config: &[u8], top_k: usize) -> (EagleHead, Checkpoint) {
    let cfg = EagleHead::config_for(&target.config, config).expect("head config");
    let ckpt = Checkpoint::from_named_safetensors(cfg.clone(), vec![Box::new(file.clone())]).expect("head");
    let layout = EagleHead::layout_of(&target.config, config, &ckpt).expect("layout");
    let taps = match layout {
        EagleLayout::Eagle3 { taps, .. } => taps.to_vec(),
        EagleLayout::Eagle1 { .. } => Vec::new(),
    };
    target.set_feature_taps(&taps).expect("taps");
    let opts = LoadOptions::default();
    let head = pollster::block_on(EagleHead::load(target, &ckpt, layout, &opts, top_k, &mut |_| {}))
        .expect("load head");
    (head, Checkpoint::from_named_safetensors(cfg, vec![Box::new(file)]).expect("head"))
}

/// The reference's most likely id of a logits row (the lowest among equal maxima).
fn reference_argmax(logits: &[f32]) -> u32 {
    sampling::argmax(logits)
}

/// Checks the GPU's ranked ids of a row against the reference's logits of it.
fn check_ranks(what: &str, ids: &[u32], logits: &[f32]) {
    let mut sorted = logits.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    for (rank, &id) in ids.iter().enumerate() {
        let (got, want) = (logits[id as usize], sorted[rank]);
        assert!(
            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
            "{what} rank {rank}: id {id} has {got}, not {want}"
        );
    }
}

/// EAGLE-2's dynamic tree computed with the reference head (whose cache holds the context's 9
/// positions): scores are sums of log-softmax values; each depth expands the best `width`
/// unexpanded nodes of the newest depth among the best `budget.nodes`; every node's ranks come
/// from running its root-to-node path alone.
fn reference_dynamic_tree(
    head: &mut reference::RefEagle,
    root_feature: &[f32],
    root_logits: &[f32],
    root: u32,
    budget: DraftBudget,
    width: usize,
    top_k: usize,
) -> TokenTree {
    let past = head.len();
    // (token, parent, depth, score, expanded)
    let mut nodes: Vec<(u32, usize, usize, f64, bool)> = vec![(root, 0, 0, 0.0, true)];
    let top = |logits: &[f32]| -> Vec<(u32, f64)> {
        let m = logits.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
        let lse = m + logits.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
        ids.sort_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]));
        ids[..top_k].iter().map(|&i| (i, logits[i as usize] as f64 - lse)).collect()
    };
    let add = |nodes: &mut Vec<(u32, usize, usize, f64, bool)>, parent: usize, ranked: Vec<(u32, f64)>| {
        for (t, lp) in ranked {
            let (d, s) = (nodes[parent].2 + 1, nodes[parent].3 + lp);
            nodes.push((t, parent, d, s, false));
        }
    };
    let ranking = |nodes: &[(u32, usize, usize, f64, bool)]| -> Vec<usize> {
        let mut order: Vec<usize> = (1..nodes.len()).collect();
        order.sort_by(|&a, &b| {
            nodes[b].3.total_cmp(&nodes[a].3).then(nodes[a].2.cmp(&nodes[b].2)).then(a.cmp(&b))
        });
        order
    };
    add(&mut nodes, 0, top(root_logits));
    for d in 1..budget.depth {
        let front: Vec<usize> = ranking(&nodes)
            .into_iter()
            .take(budget.nodes)
            .filter(|&v| nodes[v].2 == d && !nodes[v].4)
            .take(width)
            .collect();
        for v in front {
            // the path from the root's child to v, each step fed its parent's output
            let mut path = vec![v];
            while nodes[path[0]].1 != 0 {
                path.insert(0, nodes[path[0]].1);
            }
            head.truncate(past);
            let mut feature = root_feature.to_vec();
            let mut logits = Vec::new();
            for &u in &path {
                (feature, logits) = head.step(nodes[u].0, &feature);
            }
            nodes[v].4 = true;
            add(&mut nodes, v, top(&logits));
        }
    }
    head.truncate(past);
    let mut chosen: Vec<usize> = ranking(&nodes).into_iter().take(budget.nodes).collect();
    chosen.sort_by_key(|&v| nodes[v].2);
    let mut tree = TokenTree::new(root);
    let mut at = vec![None; nodes.len()];
    at[0] = Some(0);
    for v in chosen {
        if let Some(p) = at[nodes[v].1] {
            at[v] = tree.child(p, nodes[v].0);
        }
    }
    tree
}

#[test]
fn eagle_head_runs_target_features_and_drafts_as_the_reference_does() {
    for (spec, dtype, input_norm) in
        [(TinySpec::llama(), DType::F16, false), (TinySpec::qwen2(), DType::BF16, true)]
    {
        let mut r = rng(370 + spec.qwen2 as u64);
        let tiny = TinyModel::random(spec, &mut r);
        let ckpt = ckpt_of(&tiny, &mut r);
        let mut target = load(&ckpt, 64);
        let (file, config) = common::tiny::eagle_head(&tiny.spec, dtype, input_norm, false, &mut r);
        let (head, head_ckpt) = load_eagle(&mut target, file, &config, 4);
        let mut eagle = Eagle::new(head, 0);
        let mut reference = reference::RefModel::new(&ckpt, Precision::Auto);
        let mut ref_head = reference::RefEagle::new(&head_ckpt, &reference);
        let prompt: Vec<u32> = (0..10).map(|_| r.gen_range(0..spec.vocab as u32)).collect();
        let what = format!("qwen2={} input norm {input_norm}", spec.qwen2);
        // the target's pass over 9 tokens; the head over its rows 0..8 in an odd order of passes:
        // rows 0..5 first, then rows 5..9 (a verify pass's kept rows)
        pollster::block_on(target.forward(&prompt[..9], 0)).expect("forward");
        reference.forward(&prompt[..9], 0);
        let mut want_feat = Vec::new();
        let mut want_logits = Vec::new();
        for p in 0..9 {
            let (f, l) = ref_head.step(prompt[p + 1], &reference.hidden[p]);
            want_feat.push(f);
            want_logits.push(l);
        }
        for (rows, first) in [(vec![0, 1, 2, 3, 4], 0), (vec![5, 6, 7, 8], 5)] {
            let passes = pollster::block_on(eagle.target_pass(Kept { context: &prompt, first, rows: &rows }))
                .expect("head pass");
            assert_eq!(passes, 1);
            let n = rows.len();
            let feat = pollster::block_on(eagle.head().features(n)).expect("features");
            for (i, &row) in rows.iter().enumerate() {
                let got = &feat[i * spec.dim..(i + 1) * spec.dim];
                common::assert_close(
                    &format!("{what}: f^ of position {row}"),
                    got,
                    &want_feat[row],
                    1e-4,
                    1e-3,
                );
            }
            // the last row alone is projected and ranked: drafting continues from it
            let top = pollster::block_on(eagle.head_mut().top_ids()).expect("top");
            let last = rows[n - 1];
            check_ranks(&format!("{what}: position {last}"), &top, &want_logits[last]);
        }
        // a proposal of depth 4: the last row's most likely id, then 3 draft steps, each fed its
        // feature and its most likely id
        let params = SamplingParams::greedy();
        let budget = DraftBudget::tree(4, 4);
        let p = propose(&mut eagle, &prompt, budget, &params);
        assert_eq!(
            (p.tokens().len(), p.steps(), p.as_tree().is_none()),
            (4, 3, true),
            "a chain of 4 in 3 steps"
        );
        assert_eq!(p.tokens()[0], reference_argmax(&want_logits[8]), "{what}: first draft");
        let (mut feature, mut token) = (want_feat[8].clone(), p.tokens()[0]);
        for (step, &id) in p.tokens().iter().enumerate().skip(1) {
            let (f, l) = ref_head.step(token, &feature);
            assert_eq!(id, reference_argmax(&l), "{what}: draft step {step}");
            (feature, token) = (f, id);
        }
        assert_eq!(eagle.head().cached(), 12, "9 positions and 3 draft steps");
        // drafting again needs the target's next pass first
        let p = propose(&mut eagle, &prompt, budget, &params);
        assert!(p.tokens().is_empty(), "no features, no proposal");
        // siblings: a tree of the chain and each depth's next most likely ids
        let mut eagle = Eagle::new(
            load_eagle(
                &mut target,
                common::tiny::eagle_head(&tiny.spec, dtype, input_norm, false, &mut r).0,
                &config,
                4,
            )
            .0,
            2,
        );
        pollster::block_on(eagle.target_pass(Kept {
            context: &prompt,
            first: 0,
            rows: &(0..9).collect::<Vec<_>>(),
        }))
        .expect("pass");
        let budget = DraftBudget::tree(3, 9);
        let p = propose(&mut eagle, &prompt, budget, &params);
        let tree = p.as_tree().expect("a tree").clone();
        assert_eq!((tree.len(), tree.max_depth()), (10, 3), "3 chain nodes, 2 siblings at each depth");
        // EAGLE-2's dynamic tree against the reference's: each node's ranks from its path alone
        let (file, _) = common::tiny::eagle_head(&tiny.spec, dtype, input_norm, false, &mut r);
        let (head, head_ckpt) = load_eagle(&mut target, file, &config, 4);
        let mut eagle = Eagle::with_tree(head, EagleTree::Dynamic { width: 3 });
        let mut ref_head = reference::RefEagle::new(&head_ckpt, &reference);
        let mut root = (Vec::new(), Vec::new()); // position 8's f^ and logits
        for p in 0..9 {
            root = ref_head.step(prompt[p + 1], &reference.hidden[p]);
        }
        pollster::block_on(eagle.target_pass(Kept {
            context: &prompt,
            first: 0,
            rows: &(0..9).collect::<Vec<_>>(),
        }))
        .expect("pass");
        for (depth, nodes) in [(4, 10), (1, 3), (3, 31)] {
            if depth != 4 {
                pollster::block_on(eagle.target_pass(Kept { context: &prompt, first: 8, rows: &[8] }))
                    .expect("pass");
            }
            let budget = DraftBudget::tree(depth, nodes);
            let p = propose(&mut eagle, &prompt, budget, &params);
            let tree = p.as_tree().expect("a tree").clone();
            let want = reference_dynamic_tree(&mut ref_head, &root.0, &root.1, prompt[9], budget, 3, 4);
            let what = format!("{what}: dynamic tree, depth {depth}, {nodes} nodes");
            assert_eq!((tree.tokens(), tree.parents()), (want.tokens(), want.parents()), "{what}");
            assert!(tree.max_depth() <= depth && tree.len() <= nodes + 1, "{what}");
            assert_eq!(p.tokens()[0], reference_argmax(&root.1), "{what}: the first branch");
            assert!(p.steps() < depth && (depth == 1 || p.steps() >= 1), "{what}: {} passes", p.steps());
        }
        // sized by costs: a verify pass that grows by a step per row keeps one node (this head's
        // chances are low); one that costs the same for any rows, with free draft passes, takes
        // every candidate worth a pass, as a budget of 31 nodes does
        let verify = std::array::from_fn(|i| (i + 1) as f32);
        let steep = TreeCosts { verify, draft_pass: 0.0, max_nodes: 31 };
        let flat = TreeCosts { verify: [1.0; 32], ..steep };
        pollster::block_on(eagle.target_pass(Kept { context: &prompt, first: 8, rows: &[8] })).expect("pass");
        let budget = DraftBudget { costs: Some(steep), ..DraftBudget::tree(4, 10) };
        let p = propose(&mut eagle, &prompt, budget, &params);
        assert_eq!((p.tokens().len(), p.as_tree()), (1, None), "{what}: steep costs, one node");
        pollster::block_on(eagle.target_pass(Kept { context: &prompt, first: 8, rows: &[8] })).expect("pass");
        let budget = DraftBudget { costs: Some(flat), ..DraftBudget::tree(4, 10) };
        let p = propose(&mut eagle, &prompt, budget, &params);
        let tree = p.as_tree().expect("a tree").clone();
        let want = reference_dynamic_tree(
            &mut ref_head,
            &root.0,
            &root.1,
            prompt[9],
            DraftBudget::tree(4, 31),
            3,
            4,
        );
        assert_eq!((tree.tokens(), tree.parents()), (want.tokens(), want.parents()), "{what}: flat costs");
        assert!(tree.len() > 11, "{what}: flat costs, {} nodes", tree.len());
        // a pass the head cannot follow (a gap: positions 0..3 never ran) leaves it without proposals
        let mut eagle = Eagle::new(
            load_eagle(
                &mut target,
                common::tiny::eagle_head(&tiny.spec, dtype, input_norm, false, &mut r).0,
                &config,
                4,
            )
            .0,
            2,
        );
        let passes = pollster::block_on(eagle.target_pass(Kept { context: &prompt, first: 3, rows: &[0] }))
            .expect("gap");
        assert_eq!(passes, 0);
        let p = propose(&mut eagle, &prompt[..5], budget, &params);
        assert!(p.tokens().is_empty() && p.as_tree().is_none());
    }
}

/// Asserts `log_probs` are the top of a softmax over `vocab` ids, most likely first: each at
/// most 0 and non-increasing, the first at least 1 / vocab, their probabilities summing to at
/// most 1 (f32's rounding aside).
fn softmax_top(log_probs: &[f32], vocab: f32, what: &str) {
    let p: Vec<f32> = log_probs.iter().map(|l| l.exp()).collect();
    assert!(!p.is_empty() && p[0] >= 1.0 / vocab, "{what}: the top of a softmax of {vocab}: {p:?}");
    assert!(p.windows(2).all(|w| w[1] <= w[0]) && p[0] <= 1.0, "{what}: most likely first: {p:?}");
    assert!(p.iter().sum::<f32>() <= 1.0 + 1e-5, "{what}: a softmax's part: {p:?}");
}

#[test]
fn eagle_head_passes_over_several_sequences_equal_each_sequence_alone() {
    // Sequences share the target's passes and the head's over pools of pages (theirs scattered):
    // each head row's f^ is its sequence's alone, bit for bit, and each sequence's chain from its
    // last row (chains of different lengths in one submission) is its one-sequence chain.
    // Random EAGLE-1 and EAGLE-3 heads (every input of a row counts: its feature, its token,
    // its keys); the EAGLE-1 one ranks the first 150 of the 300 ids (`draft_vocab_size`: each
    // row of a projection of several stores its own first 150 logits alone).
    use wgspec::gpu::KV_PAGE;
    use wgspec::model::{HeadChain, HeadRows, SeqRows};
    for eagle3 in [false, true] {
        let what = if eagle3 { "EAGLE-3" } else { "EAGLE-1" };
        let mut r = rng(390 + eagle3 as u64);
        let tiny = TinyModel::random(TinySpec::llama(), &mut r);
        let mut target = load(&ckpt_of(&tiny, &mut r), 128);
        let (file, config) = match eagle3 {
            true => common::tiny::eagle3_head(&tiny, DType::F32, 200, None, false, &mut r),
            false => {
                let (file, config) = common::tiny::eagle_head(&tiny.spec, DType::F32, false, false, &mut r);
                (file, with_draft_vocab(&config, 150.into()))
            }
        };
        let mut head = load_eagle(&mut target, file, &config, 4).0;
        let dim = tiny.spec.dim;
        // each sequence's rows are its positions but the last, whose token is the last row's next;
        // its first draft ranked from its last row, with the head's log-probability of it
        let lens = [71usize, 6, 41];
        let depth = [4usize, 2, 5];
        let seqs: Vec<Vec<u32>> =
            lens.iter().map(|&n| (0..n).map(|_| r.gen_range(0..tiny.spec.vocab as u32)).collect()).collect();
        // alone: one sequence's passes (the pools' first positions), 29 rows at most
        let mut features = Vec::new();
        let mut chains = Vec::new();
        for (s, seq) in seqs.iter().enumerate() {
            let (n, mut f) = (seq.len() - 1, Vec::new());
            for start in (0..n).step_by(29) {
                let end = (start + 29).min(n);
                pollster::block_on(target.forward(&seq[start..end], start)).expect("target");
                let rows: Vec<usize> = (0..end - start).collect();
                head.run_target_rows(&rows, &seq[start + 1..end + 1], start).expect("head");
                f.extend(pollster::block_on(head.features(end - start)).expect("features"));
            }
            features.push(f);
            chains.push(pollster::block_on(head.draft(depth[s] - 1)).expect("chain"));
        }
        // together: pools of 384 positions (each sequence's pages cover its drafts' positions,
        // scattered)
        let pool = 384 / KV_PAGE;
        target.set_kv_pages(pool).expect("target pool");
        head.set_kv_pages(&target, pool).expect("head pool");
        assert_eq!(head.kv_pages(), pool);
        let mut ids: Vec<u32> = (0..pool as u32).collect();
        rand::seq::SliceRandom::shuffle(&mut ids[..], &mut r);
        let mut free = ids.into_iter();
        let pages: Vec<Vec<u32>> = (0..3)
            .map(|s| {
                (0..(lens[s] + depth[s]).div_ceil(KV_PAGE)).map(|_| free.next().expect("page")).collect()
            })
            .collect();
        assert_eq!(pages[1].len(), 1);
        let mut done = [0usize; 3];
        let mut last = [0usize; 3];
        let mut firsts = vec![None; 3];
        let mut latest = Vec::new();
        // (the last pass's rows of each sequence: its start, and the pass's rows)
        let mut last_pass: Vec<(usize, usize, Vec<u32>)> = Vec::new();
        let sizes = [9usize, 1, 5, 12];
        for pass in 0.. {
            let left: Vec<usize> = (0..3).map(|s| lens[s] - 1 - done[s]).collect();
            if left.iter().all(|&l| l == 0) {
                break;
            }
            // (the last pass holds each sequence's last row)
            let ending = left.iter().all(|&l| l <= 1);
            let mut plan = Vec::new();
            for s in 0..3 {
                let take =
                    if ending { left[s] } else { sizes[(s + pass) % 4].min(left[s].saturating_sub(1)) };
                if take > 0 {
                    plan.push((s, done[s], take));
                }
            }
            let tokens: Vec<SeqRows> = (plan.iter())
                .map(|&(s, at, take)| SeqRows {
                    pages: &pages[s],
                    start_pos: at,
                    tokens: &seqs[s][at..at + take],
                    tree: None,
                    logits: 0,
                })
                .collect();
            pollster::block_on(target.forward_pages(&tokens)).expect("target pass");
            let mut first = 0;
            let mut rows: Vec<Vec<u32>> = Vec::new();
            for &(s, _, take) in &plan {
                rows.push((first as u32..(first + take) as u32).collect());
                last[s] = first + take - 1;
                first += take;
            }
            let head_rows: Vec<HeadRows> = (plan.iter().zip(&rows))
                .map(|(&(s, at, take), rows)| HeadRows {
                    pages: &pages[s],
                    start_pos: at,
                    rows,
                    next: &seqs[s][at + 1..at + 1 + take],
                })
                .collect();
            head.run_pages(&head_rows).expect("head pass");
            last_pass = plan.iter().zip(&rows).map(|(&(s, at, _), rows)| (s, at, rows.clone())).collect();
            let ranked = pollster::block_on(head.first_drafts()).expect("first drafts");
            assert_eq!(ranked.len(), plan.len(), "{what}: a first draft per sequence");
            for (&(s, ..), f) in plan.iter().zip(&ranked) {
                firsts[s] = Some(f.clone());
            }
            latest = ranked;
            let got = pollster::block_on(head.features(first)).expect("features");
            let mut row = 0;
            for &(s, at, take) in &plan {
                for p in at..at + take {
                    let (g, w) = (&got[row * dim..(row + 1) * dim], &features[s][p * dim..(p + 1) * dim]);
                    assert!(
                        g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{what}: sequence {s}'s position {p} in pass {pass} ({plan:?}) differs from its run alone"
                    );
                    row += 1;
                }
                done[s] += take;
            }
        }
        let firsts: Vec<_> = firsts.into_iter().map(|f| f.expect("each sequence's last pass")).collect();
        let vocab = tiny.spec.vocab as f32;
        for (s, f) in firsts.iter().enumerate() {
            assert_eq!(f.ids, chains[s][0], "{what}: sequence {s}'s first draft is its chain's");
            softmax_top(&f.log_probs, vocab, &format!("{what}: sequence {s}'s first draft"));
        }
        let asks: Vec<HeadChain> = (0..3)
            .map(|s| HeadChain {
                pages: &pages[s],
                past: lens[s] - 1,
                row: last[s],
                first: &firsts[s],
                drafts: depth[s],
            })
            .collect();
        let got = pollster::block_on(head.draft_pages(&asks)).expect("chains");
        let ids: Vec<Vec<Vec<u32>>> =
            got.iter().map(|c| c.iter().map(|step| step.ids.clone()).collect()).collect();
        assert_eq!(
            ids, chains,
            "{what}: the chains of a batch (each step's ranked ids) are each sequence's alone"
        );
        for (s, chain) in got.iter().enumerate() {
            assert_eq!(chain[0], firsts[s], "{what}: sequence {s}'s chain starts from its first draft");
            for (j, step) in chain.iter().enumerate() {
                softmax_top(&step.log_probs, vocab, &format!("{what}: sequence {s}'s step {j}"));
            }
        }
        let kept = pollster::block_on(head.first_drafts()).expect("first drafts");
        assert_eq!(kept, latest, "{what}: the chains leave the latest pass's first drafts");
        // each sequence's chain alone, after the head's last pass again (its rows and keys the
        // same): every step's ranks and confidence, bit for bit
        let rerun: Vec<HeadRows> = (last_pass.iter())
            .map(|(s, at, rows)| HeadRows {
                pages: &pages[*s],
                start_pos: *at,
                rows,
                next: &seqs[*s][at + 1..at + 1 + rows.len()],
            })
            .collect();
        for s in 0..3 {
            head.run_pages(&rerun).expect("the last head pass again");
            let alone = pollster::block_on(head.draft_pages(&asks[s..s + 1])).expect("a chain alone");
            let bits = |c: &[wgspec::model::Ranked]| -> Vec<(Vec<u32>, Vec<u32>)> {
                c.iter()
                    .map(|step| (step.ids.clone(), step.log_probs.iter().map(|p| p.to_bits()).collect()))
                    .collect()
            };
            assert_eq!(bits(&alone[0]), bits(&got[s]), "{what}: sequence {s}'s chain alone and in the batch");
        }
        // chains past their pages, too deep, from no row of the last pass: refused
        let mut bad = |c: HeadChain| pollster::block_on(head.draft_pages(&[c])).is_err();
        let ok = HeadChain { pages: &pages[1], past: 5, row: 0, first: &firsts[1], drafts: 2 };
        assert!(!bad(ok));
        let short = wgspec::model::Ranked { ids: firsts[1].ids[..3].to_vec(), ..firsts[1].clone() };
        let out_of_vocab =
            wgspec::model::Ranked { ids: vec![tiny.spec.vocab as u32; 4], ..firsts[1].clone() };
        assert!(bad(HeadChain { first: &short, ..ok }), "{what}: its ranks are top_k ids");
        assert!(bad(HeadChain { first: &out_of_vocab, ..ok }), "{what}: ids in the vocabulary");
        let end = KV_PAGE - 1;
        assert!(!bad(HeadChain { past: end, ..ok }), "{what}: position {end} is in one page");
        assert!(bad(HeadChain { past: end, drafts: 3, ..ok }), "{what}: positions {end} and after are not");
        // (the depths in sequence 0's pages, which hold 17 drafts)
        let deep = HeadChain { pages: &pages[0], ..ok };
        assert!(pages[0].len() * KV_PAGE >= 5 + 17);
        assert!(bad(HeadChain { drafts: 17, ..deep }) && bad(HeadChain { drafts: 0, ..deep }));
        assert!(!bad(HeadChain { drafts: 16, ..deep }));
        assert!(bad(HeadChain { row: wgspec::model::MAX_BATCH, ..ok }));
    }
}

#[test]
fn eagle_speculation_equals_greedy_output() {
    // (Gemma: the echo head's guesses go through its output norm and its tied projection)
    for spec in [TinySpec::llama(), TinySpec::qwen2(), TinySpec::gemma3()] {
        let mut r = rng(380 + spec.qwen2 as u64 + 2 * spec.gemma3 as u64);
        let tiny = TinyModel::random(spec, &mut r);
        let mut target = load(&ckpt_of(&tiny, &mut r), 64);
        let (file, config) = common::tiny::eagle_head(&tiny.spec, DType::F16, false, false, &mut r);
        let dynamic = EagleTree::Dynamic { width: 3 };
        let mut random = Eagle::with_tree(load_eagle(&mut target, file.clone(), &config, 4).0, dynamic);
        // the same head's trees merged with the n-gram's continuations (the ensemble)
        let mut merged_head = Eagle::with_tree(load_eagle(&mut target, file, &config, 4).0, dynamic);
        let ngram = NGram { branches: 4, ..NGram::default() };
        let mut merged = Ensemble { draft: &mut merged_head, ngram };
        // a head that predicts the feature it is given: its first guess is the last token
        let (file, config) = common::tiny::eagle_head(&tiny.spec, DType::F32, false, true, &mut r);
        let mut echo = Eagle::with_tree(
            load_eagle(&mut target, file.clone(), &config, 4).0,
            EagleTree::Dynamic { width: 4 },
        );
        let mut echo_chain = Eagle::new(load_eagle(&mut target, file, &config, 4).0, 3);
        let mut drafts: [(&str, &mut dyn Draft, bool); 4] = [
            ("random dynamic", &mut random, false),
            ("echo dynamic", &mut echo, true),
            ("echo chain", &mut echo_chain, true),
            ("random dynamic+ngram", &mut merged, false),
        ];
        heads_speculate_exactly(&format!("{:?} eagle", spec.arch_of()), &mut target, &mut drafts, &mut r);
        // the adaptive runs sized the dynamic trees by costs and calibrated their chances
        for (name, eagle) in [("random", &random), ("echo", &echo)] {
            assert_ne!(eagle.calibration(), 1.0, "{name}: the chances were never calibrated");
        }
    }
}

/// `config` with `draft_vocab_size` set to `value`.
fn with_draft_vocab(config: &[u8], value: serde_json::Value) -> Vec<u8> {
    let mut json: serde_json::Value = serde_json::from_slice(config).expect("config json");
    json["draft_vocab_size"] = value;
    json.to_string().into_bytes()
}

#[test]
fn an_eagle1_head_with_a_draft_vocabulary_ranks_its_first_ids_alone() {
    // (the first 100 of the target's 300 ids: the output matrix's rows after them are not read)
    let spec = TinySpec::llama();
    let mut r = rng(386);
    let tiny = TinyModel::random(spec, &mut r);
    let ckpt = ckpt_of(&tiny, &mut r);
    let mut target = load(&ckpt, 64);
    let (file, config) = common::tiny::eagle_head(&tiny.spec, DType::F16, false, false, &mut r);
    let first_100 = with_draft_vocab(&config, 100.into());
    let (head, head_ckpt) = load_eagle(&mut target, file.clone(), &first_100, 4);
    assert_eq!(head.layout(), EagleLayout::Eagle1 { draft_vocab: 100 });
    let mut eagle = Eagle::new(head, 0);
    let mut reference = reference::RefModel::new(&ckpt, Precision::Auto);
    let mut ref_head = reference::RefEagle::new(&head_ckpt, &reference);
    let prompt: Vec<u32> = (0..10).map(|_| r.gen_range(0..spec.vocab as u32)).collect();
    pollster::block_on(target.forward(&prompt[..9], 0)).expect("forward");
    reference.forward(&prompt[..9], 0);
    let mut want_logits = Vec::new();
    for p in 0..9 {
        want_logits.push(ref_head.step(prompt[p + 1], &reference.hidden[p]).1);
    }
    let rows: Vec<usize> = (0..9).collect();
    pollster::block_on(eagle.target_pass(Kept { context: &prompt, first: 0, rows: &rows })).expect("pass");
    let top = pollster::block_on(eagle.head_mut().top_ids()).expect("top");
    assert!(top.iter().all(|&id| id < 100), "ids past the draft vocabulary: {top:?}");
    check_ranks("the first 100 ids", &top, &want_logits[8][..100]);
    // in the GPU shape (16 lanes), the output matrix cut into small buffers: the first 100 ids
    // end inside one of them
    let opts = LoadOptions { context: Some(64), max_chunk_bytes: Some(4096), ..Default::default() };
    let mut split = Model::load(common::gpu_shaped(), &ckpt, &opts, &mut |_| {}).expect("load split");
    let mut shaped = Eagle::new(load_eagle(&mut split, file.clone(), &first_100, 4).0, 0);
    pollster::block_on(split.forward(&prompt[..9], 0)).expect("forward");
    pollster::block_on(shaped.target_pass(Kept { context: &prompt, first: 0, rows: &rows })).expect("pass");
    let top = pollster::block_on(shaped.head_mut().top_ids()).expect("top");
    assert!(top.iter().all(|&id| id < 100), "GPU shape: ids past the draft vocabulary: {top:?}");
    check_ranks("GPU shape, split output: the first 100 ids", &top, &want_logits[8][..100]);
    // speculation with it is exact: a random head, and one that echoes the last token (whose
    // guesses past the first 100 ids cannot be drafted)
    let mut random =
        Eagle::with_tree(load_eagle(&mut target, file, &first_100, 4).0, EagleTree::Dynamic { width: 3 });
    let (echo_file, echo_config) = common::tiny::eagle_head(&tiny.spec, DType::F32, false, true, &mut r);
    let echo_first = with_draft_vocab(&echo_config, 150.into());
    let mut echo = Eagle::new(load_eagle(&mut target, echo_file.clone(), &echo_first, 4).0, 2);
    let prompts: [Vec<u32>; 3] = [vec![7], vec![3; 6], (0..40).map(|_| r.gen_range(0..300)).collect()];
    let mut accepted = 0;
    for prompt in &prompts {
        let want = plain(&mut target, prompt, &greedy_opts(24));
        for k in [KPolicy::Fixed(3), KPolicy::default()] {
            for (name, draft) in
                [("random, 100 ids", &mut random as &mut dyn Draft), ("echo, 150 ids", &mut echo)]
            {
                let got = speculative(&mut target, Drafter::Other(draft), prompt, &greedy_opts(24), k);
                assert_eq!(got.tokens, want.tokens, "{name} {k:?} {prompt:?}");
                let ids = (got.tokens.iter().zip(&got.from_draft)).filter(|&(_, &d)| d).map(|(&t, _)| t);
                let limit = if name.starts_with("echo") { 150 } else { 100 };
                assert!(ids.clone().all(|t| t < limit), "{name}: a draft past the first {limit} ids");
                accepted += usize::from(name.starts_with("echo")) * ids.count();
            }
        }
    }
    assert!(accepted > 0, "the echo head's drafts of the first 150 ids were never kept");
    // a count that is not one of the vocabulary's ids: a typed error naming the key
    let cfg = EagleHead::config_for(&target.config, &echo_config).expect("config");
    let head = Checkpoint::from_named_safetensors(cfg, vec![Box::new(echo_file)]).expect("head");
    for bad in [0.into(), 301.into(), "all".into(), (-5).into()] {
        let bad_config = with_draft_vocab(&echo_config, bad);
        let err = EagleHead::layout_of(&target.config, &bad_config, &head).expect_err("refused");
        assert!(matches!(&err, Error::Metadata { key, .. } if key.contains("draft_vocab_size")), "{err}");
    }
    // fewer ids than a step ranks
    let three = EagleHead::layout_of(&target.config, &with_draft_vocab(&echo_config, 3.into()), &head);
    let opts = LoadOptions::default();
    let err =
        pollster::block_on(EagleHead::load(&target, &head, three.expect("3 ids"), &opts, 4, &mut |_| {}))
            .err()
            .expect("4 of 3 ids");
    assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("of its 3")), "{err}");
}

#[test]
fn eagle3_head_reads_the_target_taps_and_drafts_as_the_reference_does() {
    for (spec, dtype, draft_vocab, taps) in [
        (TinySpec::llama(), DType::F16, 37, None),
        (TinySpec::qwen2(), DType::F32, TinySpec::qwen2().vocab, Some([0, 2, 1])),
        // (the taps of targets that norm each head, and of fused matrices)
        (TinySpec::qwen3(), DType::F16, 41, Some([1, 2, 0])),
        (TinySpec::phi3(), DType::F32, TinySpec::phi3().vocab, None),
    ] {
        let mut r = rng(390 + spec.qwen2 as u64);
        let tiny = TinyModel::random(spec, &mut r);
        let ckpt = ckpt_of(&tiny, &mut r);
        let mut target = load(&ckpt, 64);
        let (file, config) = common::tiny::eagle3_head(&tiny, dtype, draft_vocab, taps, false, &mut r);
        let (head, head_ckpt) = load_eagle(&mut target, file, &config, 4);
        // the default taps of a 2-layer target: after 2, 1 and 0 layers
        let want_taps = taps.unwrap_or([2, 1, 0]);
        assert_eq!(head.layout(), EagleLayout::Eagle3 { draft_vocab, taps: want_taps });
        let mut eagle = Eagle::with_tree(head, EagleTree::Dynamic { width: 3 });
        let mut reference = reference::RefModel::new(&ckpt, Precision::Auto);
        let mut ref_head = reference::RefEagle::new(&head_ckpt, &reference);
        let prompt: Vec<u32> = (0..10).map(|_| r.gen_range(0..spec.vocab as u32)).collect();
        let what = format!("{:?} draft vocabulary {draft_vocab}", spec.arch_of());
        pollster::block_on(target.forward(&prompt[..9], 0)).expect("forward");
        reference.forward(&prompt[..9], 0);
        let mut want = Vec::new();
        for p in 0..9 {
            let feature: Vec<f32> =
                want_taps.iter().flat_map(|&t| reference.residual[p][t].clone()).collect();
            want.push(ref_head.step(prompt[p + 1], &feature));
        }
        for (rows, first) in [(vec![0, 1, 2, 3, 4], 0), (vec![5, 6, 7, 8], 5)] {
            assert_eq!(
                pollster::block_on(eagle.target_pass(Kept { context: &prompt, first, rows: &rows }))
                    .expect("pass"),
                1
            );
            let feat = pollster::block_on(eagle.head().features(rows.len())).expect("features");
            for (i, &row) in rows.iter().enumerate() {
                let got = &feat[i * spec.dim..(i + 1) * spec.dim];
                common::assert_close(&format!("{what}: h of position {row}"), got, &want[row].0, 1e-4, 1e-3);
            }
            // ranked in the draft vocabulary, named by the target's ids
            let top = pollster::block_on(eagle.head_mut().top_ids()).expect("top");
            let last = rows[rows.len() - 1];
            check_ranks(&format!("{what}: position {last}"), &top, &want[last].1);
        }
        // EAGLE-2's tree from the draft vocabulary, against the reference's
        let params = SamplingParams::greedy();
        let p = propose(&mut eagle, &prompt, DraftBudget::tree(4, 10), &params);
        let tree = p.as_tree().expect("a tree").clone();
        let root = &want[8];
        let want_tree = reference_dynamic_tree(
            &mut ref_head,
            &root.0,
            &root.1,
            prompt[9],
            DraftBudget::tree(4, 10),
            3,
            4,
        );
        assert_eq!((tree.tokens(), tree.parents()), (want_tree.tokens(), want_tree.parents()), "{what}");
        // the chain: each step fed the head's own output and most likely id
        let mut eagle = Eagle::new(eagle.into_head(), 0);
        pollster::block_on(eagle.target_pass(Kept {
            context: &prompt,
            first: 0,
            rows: &(0..9).collect::<Vec<_>>(),
        }))
        .expect("pass");
        let p = propose(&mut eagle, &prompt, DraftBudget::chain(4), &params);
        assert_eq!(p.tokens()[0], reference_argmax(&root.1), "{what}: first draft");
        ref_head.truncate(9);
        let (mut feature, mut token) = (root.0.clone(), p.tokens()[0]);
        for (step, &id) in p.tokens().iter().enumerate().skip(1) {
            let (f, l) = ref_head.step(token, &feature);
            assert_eq!(id, reference_argmax(&l), "{what}: draft step {step}");
            (feature, token) = (f, id);
        }
        // every draft id is one the draft vocabulary has
        let d2t_ids: Vec<usize> = (0..spec.vocab).filter(|&t| want[0].1[t].is_finite()).collect();
        assert_eq!(d2t_ids.len(), draft_vocab);
        assert!(
            tree.tokens()[1..].iter().chain(&p.tokens()).all(|&t| d2t_ids.contains(&(t as usize))),
            "{what}"
        );
    }
}

#[test]
fn eagle3_speculation_equals_greedy_output_and_bad_heads_are_refused() {
    let spec = TinySpec::llama();
    let mut r = rng(395);
    let tiny = TinyModel::random(spec, &mut r);
    let mut target = load(&ckpt_of(&tiny, &mut r), 64);
    let (file, config) = common::tiny::eagle3_head(&tiny, DType::F16, 40, Some([2, 1, 0]), false, &mut r);
    // a head that projects the target's last residual as the target does: its first guess is
    // the last token
    let (copy_file, copy_config) =
        common::tiny::eagle3_head(&tiny, DType::F32, spec.vocab, Some([2, 1, 0]), true, &mut r);
    let copy_head = load_eagle(&mut target, copy_file, &copy_config, 4).0;
    let mut copy = Eagle::with_tree(copy_head, EagleTree::Dynamic { width: 2 });
    let mut dynamic = Eagle::with_tree(
        load_eagle(&mut target, file.clone(), &config, 4).0,
        EagleTree::Dynamic { width: 4 },
    );
    let mut chain = Eagle::new(load_eagle(&mut target, file.clone(), &config, 4).0, 2);
    let mut drafts: [(&str, &mut dyn Draft, bool); 3] = [
        ("eagle3 dynamic", &mut dynamic, false),
        ("eagle3 chain", &mut chain, false),
        ("eagle3 copy", &mut copy, true),
    ];
    heads_speculate_exactly("eagle3", &mut target, &mut drafts, &mut r);
    // (every head above reads the same taps: setting others would leave them reading the old
    // buffer) the target's taps must be the head's
    let cfg = EagleHead::config_for(&target.config, &config).expect("config");
    let ckpt = Checkpoint::from_named_safetensors(cfg.clone(), vec![Box::new(file.clone())]).expect("head");
    let layout = EagleHead::layout_of(&target.config, &config, &ckpt).expect("layout");
    target.set_feature_taps(&[]).expect("no taps");
    let opts = LoadOptions::default();
    let err = pollster::block_on(EagleHead::load(&target, &ckpt, layout, &opts, 4, &mut |_| {}))
        .err()
        .expect("no taps");
    assert!(err.to_string().contains("feature taps"), "{err}");
    // taps past the target's layers; a d2t that leaves the target's vocabulary
    let (_, bad) = common::tiny::eagle3_head(&tiny, DType::F16, 40, Some([1, 3, 0]), false, &mut r);
    let err = EagleHead::layout_of(&target.config, &bad, &ckpt).expect_err("tap after 3 of 2 layers");
    assert!(err.to_string().contains("eagle_aux_hidden_state_layer_ids"), "{err}");
    target.set_feature_taps(&[2, 1, 0]).expect("taps");
    let mut d2t_past = file.clone();
    let d2t_at = d2t_past.len() - 8 * 40;
    d2t_past[d2t_at..d2t_at + 8].copy_from_slice(&(spec.vocab as i64).to_le_bytes());
    let ckpt = Checkpoint::from_named_safetensors(cfg, vec![Box::new(d2t_past)]).expect("head");
    let err = pollster::block_on(EagleHead::load(&target, &ckpt, layout, &opts, 4, &mut |_| {}))
        .err()
        .expect("d2t");
    assert!(err.to_string().contains("d2t maps draft id 0"), "{err}");
}

/// A head's memory bill (EagleHead::plan and MedusaHeads::plan, their memory_bytes) is what its
/// load allocates, to the byte: EAGLE-1 and EAGLE-3 heads, Medusa heads with their own and with
/// the target's projection, stored and f32 weights, both attention shapes.
#[test]
fn heads_allocate_what_their_bills_say() {
    let mut r = rng(0xea61e);
    let spec = TinySpec { vocab: 300, ..TinySpec::llama() };
    let tiny = TinyModel::random(spec, &mut r);
    let shapes = [
        KernelShape::default(),
        KernelShape { matmul_lanes: Some(16), split_attention: Some(true), shuffle_loads: None },
    ];
    for shape in shapes {
        let g = std::sync::Arc::new(pollster::block_on(Gpu::with_shape(shape)).expect("a fresh device"));
        let opts = LoadOptions { context: Some(96), ..Default::default() };
        let mut target = Model::load(g.clone(), &ckpt_of(&tiny, &mut r), &opts, &mut |_| {}).expect("target");
        let heads = [
            ("EAGLE-1 f32", common::tiny::eagle_head(&tiny.spec, DType::F32, false, false, &mut r)),
            ("EAGLE-1 q8_0", common::tiny::eagle_head(&tiny.spec, DType::Q8_0, true, false, &mut r)),
            ("EAGLE-3 f16", common::tiny::eagle3_head(&tiny, DType::F16, 40, Some([2, 1, 0]), false, &mut r)),
        ];
        for (what, (file, config)) in heads {
            let cfg = EagleHead::config_for(&target.config, &config).expect("head config");
            let ckpt = Checkpoint::from_named_safetensors(cfg, vec![Box::new(file)]).expect("head");
            let layout = EagleHead::layout_of(&target.config, &config, &ckpt).expect("layout");
            let taps = match layout {
                EagleLayout::Eagle3 { taps, .. } => taps.to_vec(),
                EagleLayout::Eagle1 { .. } => Vec::new(),
            };
            target.set_feature_taps(&taps).expect("taps");
            let before = g.billed_bytes();
            let head = pollster::block_on(EagleHead::load(&target, &ckpt, layout, &opts, 4, &mut |_| {}))
                .expect("load head");
            let what = format!("{shape:?} {what}");
            assert_eq!(g.billed_bytes() - before, head.memory_bytes(), "{what}: allocated, billed");
        }
        for (kind, dtype) in [(MedusaKind::Random, DType::Q8_0), (MedusaKind::Shared, DType::F32)] {
            let (file, config) = common::tiny::medusa_heads(&tiny, 3, 2, dtype, kind, &mut r);
            let before = g.billed_bytes();
            let heads = load_heads(&target, file, &config, 4);
            let what = format!("{shape:?} Medusa {kind:?} {dtype:?}");
            assert_eq!(g.billed_bytes() - before, heads.memory_bytes(), "{what}: allocated, billed");
            assert!(heads.memory_bytes() > heads.weight_bytes(), "{what}");
        }
    }
}
