//! The plain CPU reference forward pass: the specification every GPU result is checked against.
//! Written for clarity, not speed: f32 weights, f64 accumulation, one loop per formula.
#![allow(dead_code)]

use std::collections::HashMap;

use wgspec::gpu::RopeLayout;
use wgspec::model::{Checkpoint, Config, Precision, RopeScaling, TensorRole, TensorTable};

/// A model on the CPU, with its own KV cache.
pub struct RefModel {
    pub cfg: Config,
    w: HashMap<String, Vec<f32>>,
    k_cache: Vec<Vec<f32>>, // per layer [pos, kv_dim]
    v_cache: Vec<Vec<f32>>,
    /// The cache holds values rounded to f16, as the GPU's does.
    kv_f16: bool,
    /// The final hidden state (after the output norm) of each row of the last forward, [n][dim].
    pub hidden: Vec<Vec<f32>>,
    /// The residual stream of each row of the last forward after k layers, k = 0..=n_layers
    /// (0: the embedding), [n][n_layers + 1][dim].
    pub residual: Vec<Vec<Vec<f32>>>,
    /// Each RoPE frequency's divisor ([`rope_divisors`]).
    rope_divisors: Vec<f64>,
}

/// `y[r] = x[r] . W^T` with `W: [rows, cols]`.
pub fn matvec(w: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows)
        .map(|o| {
            let row = &w[o * cols..(o + 1) * cols];
            row.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() as f32
        })
        .collect()
}

pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| *v as f64 * *v as f64).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    x.iter().zip(w).map(|(v, g)| (*v as f64 * inv * *g as f64) as f32).collect()
}

/// Each RoPE frequency's divisor under `ckpt`'s scaling, worked out as transformers writes it
/// (`_compute_llama3_parameters`: wavelengths masked into low, medium and high) or read from the
/// GGUF's `rope_freqs.weight`.
pub fn rope_divisors(ckpt: &Checkpoint) -> Vec<f64> {
    let c = &ckpt.config;
    let half = c.rope_dim / 2;
    let inv_freq: Vec<f64> =
        (0..half).map(|i| 1.0 / (c.rope_theta as f64).powf((2 * i) as f64 / c.rope_dim as f64)).collect();
    match c.rope_scaling {
        RopeScaling::None => vec![1.0; half],
        RopeScaling::Linear { factor } => vec![factor as f64; half],
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } => {
            let (factor, low, high, old) =
                (factor as f64, low_freq_factor as f64, high_freq_factor as f64, original_context as f64);
            inv_freq
                .iter()
                .map(|&inv| {
                    let wavelen = 2.0 * std::f64::consts::PI / inv;
                    let scaled = if wavelen > old / low { inv / factor } else { inv };
                    let smooth = (old / wavelen - low) / (high - low);
                    let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
                    let medium = wavelen >= old / high && wavelen <= old / low;
                    inv / if medium { smoothed } else { scaled }
                })
                .collect()
        }
        RopeScaling::Stored => {
            let t = ckpt.tensor("rope_freqs.weight", &[half], Precision::F32).expect("rope_freqs.weight");
            t.to_f32().expect("values").into_iter().map(f64::from).collect()
        }
    }
}

/// Rotates each `head_dim` slice of `x` by position `pos`, each frequency divided by its
/// `divisors` entry.
pub fn rope(
    x: &mut [f32],
    head_dim: usize,
    (rope_dim, divisors): (usize, &[f64]),
    theta: f32,
    layout: RopeLayout,
    pos: usize,
) {
    let half = rope_dim / 2;
    for head in x.chunks_mut(head_dim) {
        for (i, divisor) in divisors.iter().enumerate().take(half) {
            let freq = (theta as f64).powf(-2.0 * i as f64 / rope_dim as f64) / divisor;
            let (sin, cos) = (pos as f64 * freq).sin_cos();
            let (a, b) = match layout {
                RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                RopeLayout::Halves => (i, i + half),
            };
            let (xa, xb) = (head[a] as f64, head[b] as f64);
            head[a] = (xa * cos - xb * sin) as f32;
            head[b] = (xa * sin + xb * cos) as f32;
        }
    }
}

/// Causal attention of one query row at `pos` over cached rows 0..=pos.
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (pos, window): (usize, usize),
    heads: usize,
    kv_heads: usize,
    hd: usize,
) -> Vec<f32> {
    let kv_dim = kv_heads * hd;
    let mut out = vec![0f32; heads * hd];
    // (a sliding window of `window` keys, the query's own included; 0: every key)
    let lo = if window > 0 { (pos + 1).saturating_sub(window) } else { 0 };
    for h in 0..heads {
        let kvh = h / (heads / kv_heads);
        let qh = &q[h * hd..(h + 1) * hd];
        let scores: Vec<f64> = (lo..=pos)
            .map(|j| {
                let kj = &k[j * kv_dim + kvh * hd..j * kv_dim + (kvh + 1) * hd];
                qh.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() / (hd as f64).sqrt()
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let sum: f64 = e.iter().sum();
        for d in 0..hd {
            let acc: f64 = (lo..=pos).map(|j| e[j - lo] * v[j * kv_dim + kvh * hd + d] as f64).sum();
            out[h * hd + d] = (acc / sum) as f32;
        }
    }
    out
}

impl RefModel {
    /// Reads every tensor of `ckpt` as the GPU holds it under `precision`.
    pub fn new(ckpt: &Checkpoint, precision: Precision) -> RefModel {
        let cfg = ckpt.config.clone();
        let mut w = HashMap::new();
        // (Gemma's Hugging Face files store a norm's w for a norm that multiplies by 1 + w)
        let offset = if cfg.arch.gemma() && ckpt.gguf().is_none() { 1.0 } else { 0.0 };
        for spec in TensorTable::new(&cfg).iter() {
            let t = ckpt.tensor(&spec.name, &spec.shape, precision).expect("tensor");
            let mut values = t.to_f32().expect("values");
            if spec.role == TensorRole::Norm {
                values.iter_mut().for_each(|v| *v += offset);
            }
            w.insert(spec.name.clone(), values);
        }
        let n = cfg.n_layers;
        let (k_cache, v_cache) = (vec![Vec::new(); n], vec![Vec::new(); n]);
        // the GPU keeps the cache in f16 under Precision::Auto (head and rotary dims multiples of 4)
        let kv_f16 =
            precision == Precision::Auto && cfg.head_dim.is_multiple_of(4) && cfg.rope_dim.is_multiple_of(4);
        let rope_divisors = rope_divisors(ckpt);
        RefModel { cfg, w, k_cache, v_cache, kv_f16, hidden: Vec::new(), residual: Vec::new(), rope_divisors }
    }

    fn t(&self, name: &str) -> &[f32] {
        &self.w[name]
    }

    /// A weight by its GGUF name, as f32.
    pub fn tensor(&self, name: &str) -> &[f32] {
        &self.w[name]
    }

    /// Cached positions.
    pub fn len(&self) -> usize {
        self.k_cache[0].len() / self.cfg.kv_dim()
    }

    pub fn truncate(&mut self, len: usize) {
        let kv = self.cfg.kv_dim();
        for l in 0..self.cfg.n_layers {
            self.k_cache[l].truncate(len * kv);
            self.v_cache[l].truncate(len * kv);
        }
    }

    /// Logits `[tokens.len(), vocab]` for tokens at positions `start_pos..`.
    pub fn forward(&mut self, tokens: &[u32], start_pos: usize) -> Vec<f32> {
        self.truncate(start_pos);
        self.hidden.clear();
        self.residual.clear();
        let mut logits = Vec::new();
        for (r, &tok) in tokens.iter().enumerate() {
            logits.extend(self.step(tok, start_pos + r));
        }
        logits
    }

    fn step(&mut self, tok: u32, pos: usize) -> Vec<f32> {
        let c = self.cfg.clone();
        let (dim, qd, kvd, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let emb = self.t("token_embd.weight");
        let mut x = emb[tok as usize * dim..(tok as usize + 1) * dim].to_vec();
        if c.arch.gemma() {
            // Gemma's embeddings times sqrt(dim), in f32 as llama.cpp scales them
            let s = (dim as f32).sqrt();
            x.iter_mut().for_each(|v| *v *= s);
        }
        let mut residual = vec![x.clone()];
        for l in 0..c.n_layers {
            let b = |s: &str| format!("blk.{l}.{s}");
            let xb = rmsnorm(&x, self.t(&b("attn_norm.weight")), c.rms_eps);
            let mut q = matvec(self.t(&b("attn_q.weight")), &xb, qd, dim);
            let mut k = matvec(self.t(&b("attn_k.weight")), &xb, kvd, dim);
            let mut v = matvec(self.t(&b("attn_v.weight")), &xb, kvd, dim);
            if c.arch.qkv_bias() {
                for (y, bias) in [(&mut q, "attn_q.bias"), (&mut k, "attn_k.bias"), (&mut v, "attn_v.bias")] {
                    for (a, bb) in y.iter_mut().zip(self.t(&b(bias))) {
                        *a += bb;
                    }
                }
            }
            if c.arch.qk_norm() {
                // each head RMS-normalised on its own (Qwen3's q_norm, k_norm), before RoPE
                let per_head = |y: &[f32], w: &[f32]| -> Vec<f32> {
                    y.chunks(c.head_dim).flat_map(|h| rmsnorm(h, w, c.rms_eps)).collect()
                };
                q = per_head(&q, self.t(&b("attn_q_norm.weight")));
                k = per_head(&k, self.t(&b("attn_k_norm.weight")));
            }
            // (Gemma's local layers: a window, their own base, no long-context scaling)
            let window = match c.global_every {
                n if n > 0 && (l + 1).is_multiple_of(n) => None,
                _ => c.sliding_window,
            };
            let unscaled = vec![1.0; c.rope_dim / 2];
            let (theta, divisors) = match (c.arch.gemma(), window) {
                (true, Some(_)) => (c.local_rope_theta, unscaled.as_slice()),
                _ => (c.rope_theta, self.rope_divisors.as_slice()),
            };
            rope(&mut q, c.head_dim, (c.rope_dim, divisors), theta, c.rope_layout, pos);
            rope(&mut k, c.head_dim, (c.rope_dim, divisors), theta, c.rope_layout, pos);
            if self.kv_f16 {
                for a in k.iter_mut().chain(v.iter_mut()) {
                    *a = half::f16::from_f32(*a).to_f32();
                }
            }
            self.k_cache[l].extend(&k);
            self.v_cache[l].extend(&v);
            let att = attention(
                &q,
                &self.k_cache[l],
                &self.v_cache[l],
                (pos, window.unwrap_or(0)),
                c.n_heads,
                c.n_kv_heads,
                c.head_dim,
            );
            let mut o = matvec(self.t(&b("attn_output.weight")), &att, dim, qd);
            if c.arch.gemma() {
                o = rmsnorm(&o, self.t(&b("post_attention_norm.weight")), c.rms_eps);
            }
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let xb = rmsnorm(&x, self.t(&b("ffn_norm.weight")), c.rms_eps);
            let g = matvec(self.t(&b("ffn_gate.weight")), &xb, ffn, dim);
            let u = matvec(self.t(&b("ffn_up.weight")), &xb, ffn, dim);
            // SwiGLU, or Gemma's GeGLU (GELU's tanh approximation)
            let act = |g: f64| match c.arch.gemma() {
                true => {
                    0.5 * g
                        * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh())
                }
                false => g / (1.0 + (-g).exp()),
            };
            let h: Vec<f32> = g.iter().zip(&u).map(|(g, u)| (act(*g as f64) * *u as f64) as f32).collect();
            let mut d = matvec(self.t(&b("ffn_down.weight")), &h, dim, ffn);
            if c.arch.gemma() {
                d = rmsnorm(&d, self.t(&b("post_ffw_norm.weight")), c.rms_eps);
            }
            x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
            residual.push(x.clone());
        }
        self.residual.push(residual);
        let xb = rmsnorm(&x, self.t("output_norm.weight"), c.rms_eps);
        let out_name = if c.tied_embeddings { "token_embd.weight" } else { "output.weight" };
        let logits = matvec(self.t(out_name), &xb, c.vocab_size, dim);
        self.hidden.push(xb);
        logits
    }
}

/// An EAGLE head on the CPU (the layouts of `src/model/eagle/`). EAGLE-1: position p takes the
/// target's feature f_p (its final hidden state) and the token t_{p+1}, and gives the predicted
/// feature f^_{p+1} and its logits through the target's output projection. EAGLE-3: the feature
/// is the target's three taps side by side (through `fc`) or the head's own previous output; the
/// layer attends over [input_layernorm(embedding) | hidden_norm(feature)], and the logits are
/// `lm_head . norm(output)` over the draft vocabulary, placed at the target's ids (`d + d2t[d]`;
/// every other id -inf).
pub struct RefEagle {
    cfg: Config,
    w: HashMap<String, Vec<f32>>,
    embed: Vec<f32>,  // the target's [vocab, dim]
    output: Vec<f32>, // the target's [vocab, dim]
    /// EAGLE-3: the target's id of each draft id.
    d2t: Option<Vec<usize>>,
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
    rope_divisors: Vec<f64>,
}

impl RefEagle {
    /// The head of `ckpt` (its tensors by their own names) for the target `target`.
    pub fn new(ckpt: &Checkpoint, target: &RefModel) -> RefEagle {
        let cfg = ckpt.config.clone();
        let mut w = HashMap::new();
        for (name, shape) in ckpt.tensor_shapes() {
            let t = ckpt.tensor(name, shape, Precision::F32).expect("tensor");
            w.insert(name.to_string(), t.to_f32().expect("values"));
        }
        let d2t = w.get("lm_head.weight").map(|lm| {
            let draft_vocab = lm.len() / cfg.dim;
            let d2t = ckpt.index_tensor("d2t", draft_vocab).unwrap_or_else(|_| vec![0; draft_vocab]);
            d2t.iter().enumerate().map(|(d, &o)| (d as i64 + o) as usize).collect()
        });
        let out_name = if target.cfg.tied_embeddings { "token_embd.weight" } else { "output.weight" };
        RefEagle {
            rope_divisors: rope_divisors(ckpt),
            cfg,
            w,
            embed: target.tensor("token_embd.weight").to_vec(),
            output: target.tensor(out_name).to_vec(),
            d2t,
            k_cache: Vec::new(),
            v_cache: Vec::new(),
        }
    }

    /// Positions in the cache.
    pub fn len(&self) -> usize {
        self.k_cache.len() / self.cfg.kv_dim()
    }

    pub fn truncate(&mut self, len: usize) {
        let kv = self.cfg.kv_dim();
        self.k_cache.truncate(len * kv);
        self.v_cache.truncate(len * kv);
    }

    /// (f^_{p+1}, logits) of position p = the cache's length, from f_p (EAGLE-3: the target's
    /// taps `[3 dim]` or the head's own output `[dim]`) and t_{p+1}.
    pub fn step(&mut self, token: u32, feature: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let c = self.cfg.clone();
        let (dim, qd, kvd, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let pos = self.len();
        let t = |name: &str| &self.w[name];
        let emb = &self.embed[token as usize * dim..(token as usize + 1) * dim];
        let fc = |input: &[f32]| {
            let mut x = matvec(t("fc.weight"), input, dim, input.len());
            if let Some(b) = self.w.get("fc.bias") {
                x.iter_mut().zip(b).for_each(|(a, b)| *a += b);
            }
            x
        };
        let eagle3 = self.d2t.is_some();
        let p = if eagle3 { "midlayer." } else { "layers.0." };
        // x: the residual stream; xin: what q, k and v read
        let (mut x, xin) = if eagle3 {
            let g = if feature.len() == dim { feature.to_vec() } else { fc(feature) };
            let e = rmsnorm(emb, t("midlayer.input_layernorm.weight"), c.rms_eps);
            let h = rmsnorm(&g, t("midlayer.hidden_norm.weight"), c.rms_eps);
            (g, [e, h].concat())
        } else {
            let x = fc(&[emb, feature].concat());
            let xb = match self.w.get("layers.0.input_layernorm.weight") {
                Some(g) => rmsnorm(&x, g, c.rms_eps),
                None => x.clone(),
            };
            (x, xb)
        };
        let w = |name: &str| &self.w[&format!("{p}{name}")];
        let n_in = xin.len();
        let mut q = matvec(w("self_attn.q_proj.weight"), &xin, qd, n_in);
        let mut k = matvec(w("self_attn.k_proj.weight"), &xin, kvd, n_in);
        let v = matvec(w("self_attn.v_proj.weight"), &xin, kvd, n_in);
        let r = (c.rope_dim, self.rope_divisors.as_slice());
        rope(&mut q, c.head_dim, r, c.rope_theta, RopeLayout::Halves, pos);
        rope(&mut k, c.head_dim, r, c.rope_theta, RopeLayout::Halves, pos);
        self.k_cache.extend(&k);
        self.v_cache.extend(&v);
        let att = attention(&q, &self.k_cache, &self.v_cache, (pos, 0), c.n_heads, c.n_kv_heads, c.head_dim);
        let o = matvec(w("self_attn.o_proj.weight"), &att, dim, qd);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let xn = rmsnorm(&x, w("post_attention_layernorm.weight"), c.rms_eps);
        let g = matvec(w("mlp.gate_proj.weight"), &xn, ffn, dim);
        let u = matvec(w("mlp.up_proj.weight"), &xn, ffn, dim);
        let h: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| ((*g as f64 / (1.0 + (-*g as f64).exp())) * *u as f64) as f32)
            .collect();
        let d = matvec(w("mlp.down_proj.weight"), &h, dim, ffn);
        x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        let logits = match &self.d2t {
            Some(d2t) => {
                let xn = rmsnorm(&x, t("norm.weight"), c.rms_eps);
                let draft = matvec(t("lm_head.weight"), &xn, d2t.len(), dim);
                let mut logits = vec![f32::NEG_INFINITY; c.vocab_size];
                for (d, &id) in d2t.iter().enumerate() {
                    logits[id] = draft[d];
                }
                logits
            }
            None => matvec(&self.output, &x, c.vocab_size, dim),
        };
        (x, logits)
    }
}
