//! One constructor per kernel: each writes the kernel's parameter block (laid out exactly as the
//! `Params` struct of its `.wgsl` file) and binds its buffers. Model code only calls these.
//!
//! Every op also binds the shared step uniform `[n, start_pos]` (see [`Step`]), written once per pass.

use bytemuck::{Pod, Zeroable};

use super::{groups, Cost, Gpu, GpuBuffer, Grid, Kernel, Op, WeightBuffer};

/// Rows of a pass one matmul workgroup computes (`ROWS` in `shaders/matmul.wgsl`).
pub const MATMUL_ROWS: u32 = 4;

/// The per-pass uniform shared by every op: rows in the pass and the position of the first row.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Step {
    pub n: u32,
    pub start_pos: u32,
}

/// Where a matmul writes its rows.
#[derive(Clone, Copy, Debug, Default)]
pub struct MatmulOut {
    /// Row stride of the output, in f32.
    pub ldy: u32,
    /// First output column written by this chunk.
    pub col_offset: u32,
    /// Row r of the pass goes to row `start_pos + r` (true: KV cache) or to row r (false).
    pub at_start_pos: bool,
    /// Add the result to what the output holds (a residual add) instead of overwriting it.
    pub accumulate: bool,
    /// The weight rows interleave gate and up projections (g0, u0, g1, u1, ...): output column
    /// `i` is `silu(gate_i) * up_i` (SwiGLU), so a matrix of `2 f` rows writes `f` columns.
    pub glu: bool,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct MatmulParams {
    k: u32,
    units: u32,
    cols: u32,
    col_offset: u32,
    ldy: u32,
    y_row_base: u32,
    has_bias: u32,
    accumulate: u32,
    glu: u32,
    scale_base: u32,
    _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct EmbedParams {
    dim: u32,
    units: u32,
    row_start: u32,
    rows: u32,
    scale_base: u32,
    _pad: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct NormParams {
    dim: u32,
    eps: f32,
    _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct RopeParams {
    heads: u32,
    head_dim: u32,
    rope_dim: u32,
    pairing: u32,
    row_base: u32,
    _pad: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AttentionParams {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    ctx: u32,
    scale: f32,
    _pad: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct WidthParams {
    width: u32,
    _pad: [u32; 3],
}

/// Rotary layouts: which pairs of a head's dimensions rotate together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// `(x[2i], x[2i+1])`: GGUF llama q/k (llama.cpp's "normal" mode).
    Interleaved,
    /// `(x[i], x[i + rope_dim/2])`: Hugging Face checkpoints and GGUF qwen2 (llama.cpp's "neox" mode).
    Halves,
}

/// Shapes of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Positions the KV cache holds.
    pub ctx: u32,
}

impl Gpu {
    /// `y[r, col_offset + c] (+)= x[r, :] . w[c, :] + bias[c]` for the rows of one weight buffer
    /// (`w: [cols, k]` in its format, `cols = w.rows`); `x: [n, k]`; `bias: [cols]` or None.
    pub fn matmul(
        &self,
        step: &wgpu::Buffer,
        x: &GpuBuffer<f32>,
        w: &WeightBuffer,
        bias: Option<&GpuBuffer<f32>>,
        y: &GpuBuffer<f32>,
        out: MatmulOut,
    ) -> Op {
        let p = MatmulParams {
            k: w.k as u32,
            units: w.units() as u32,
            cols: w.rows as u32,
            col_offset: out.col_offset,
            ldy: out.ldy,
            y_row_base: out.at_start_pos as u32,
            has_bias: bias.is_some() as u32,
            accumulate: out.accumulate as u32,
            glu: out.glu as u32,
            scale_base: w.scale_base,
            _pad: [0; 2],
        };
        let params = self.uniform("matmul params", bytemuck::bytes_of(&p));
        // An unused bias binding still needs a buffer: x serves (it is never read then).
        let bias_raw = bias.map(|b| &b.raw).unwrap_or(&x.raw);
        let grid =
            Grid::RowGroups { y: w.rows.div_ceil(self.matmul_columns_per_group()) as u32, rows: MATMUL_ROWS };
        let (k, cols) = (w.k as u64, w.rows as u64);
        let cost = Cost {
            fixed_bytes: w.bytes() + if bias.is_some() { 4 * cols } else { 0 },
            row_bytes: 4 * (k + cols / (1 + out.glu as u64) * (1 + out.accumulate as u64)),
            row_flops: 2 * k * cols,
            ..Cost::default()
        };
        self.op(Kernel::Matmul(w.dtype), step, &params, &[&x.raw, &w.raw, bias_raw, &y.raw], grid)
            .with_cost(cost)
    }

    /// `x[r, :] = table[tokens[r] - row_start, :]` for the tokens inside one buffer of an embedding
    /// table (`table: [rows, dim]` in its format, the same buffer a tied output reads).
    pub fn embed(
        &self,
        step: &wgpu::Buffer,
        tokens: &GpuBuffer<u32>,
        table: &WeightBuffer,
        x: &GpuBuffer<f32>,
        row_start: usize,
    ) -> Op {
        let p = EmbedParams {
            dim: table.k as u32,
            units: table.units() as u32,
            row_start: row_start as u32,
            rows: table.rows as u32,
            scale_base: table.scale_base,
            _pad: [0; 3],
        };
        let params = self.uniform("embed params", bytemuck::bytes_of(&p));
        let grid = Grid::PerRow(groups(table.units()));
        let row = table.dtype.gpu_bytes(1, table.k) + 4 * table.k as u64;
        let cost = Cost { row_bytes: row, ..Cost::default() };
        self.op(Kernel::Embed(table.dtype), step, &params, &[&tokens.raw, &table.raw, &x.raw], grid)
            .with_cost(cost)
    }

    /// `y[r] = x[r] / rms(x[r]) * weight`; `x, y: [n, dim]`, `weight: [dim]`.
    pub fn rmsnorm(
        &self,
        step: &wgpu::Buffer,
        x: &GpuBuffer<f32>,
        weight: &GpuBuffer<f32>,
        y: &GpuBuffer<f32>,
        dim: usize,
        eps: f32,
    ) -> Op {
        let p = NormParams { dim: dim as u32, eps, _pad: [0; 2] };
        let params = self.uniform("rmsnorm params", bytemuck::bytes_of(&p));
        let d = dim as u64;
        let cost = Cost { fixed_bytes: 4 * d, row_bytes: 8 * d, row_flops: 4 * d, ..Cost::default() };
        self.op(Kernel::RmsNorm, step, &params, &[&x.raw, &weight.raw, &y.raw], Grid::Rows).with_cost(cost)
    }

    /// Rotates `x: [rows, heads * head_dim]` in place; `cos_sin: [positions, rope_dim / 2, 2]`.
    /// With `at_start_pos`, pass row r is row `start_pos + r` of `x` (a KV cache).
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        step: &wgpu::Buffer,
        cos_sin: &GpuBuffer<f32>,
        x: &GpuBuffer<f32>,
        heads: usize,
        head_dim: usize,
        rope_dim: usize,
        layout: RopeLayout,
        at_start_pos: bool,
    ) -> Op {
        let p = RopeParams {
            heads: heads as u32,
            head_dim: head_dim as u32,
            rope_dim: rope_dim as u32,
            pairing: match layout {
                RopeLayout::Interleaved => 0,
                RopeLayout::Halves => 1,
            },
            row_base: at_start_pos as u32,
            _pad: [0; 3],
        };
        let params = self.uniform("rope params", bytemuck::bytes_of(&p));
        let pairs = (heads * rope_dim / 2) as u64;
        let cost = Cost { row_bytes: pairs * 24, row_flops: pairs * 6, ..Cost::default() };
        self.op(
            Kernel::Rope,
            step,
            &params,
            &[&cos_sin.raw, &x.raw],
            Grid::PerRow(groups(heads * rope_dim / 2)),
        )
        .with_cost(cost)
    }

    /// Causal attention of `q: [n, heads * head_dim]` over the caches `[ctx, kv_heads * head_dim]`
    /// into `out: [n, heads * head_dim]`, using `scores: [n_max, heads, ctx]` as scratch.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        step: &wgpu::Buffer,
        q: &GpuBuffer<f32>,
        k_cache: &GpuBuffer<f32>,
        v_cache: &GpuBuffer<f32>,
        scores: &GpuBuffer<f32>,
        out: &GpuBuffer<f32>,
        shape: AttentionShape,
    ) -> Op {
        let p = AttentionParams {
            heads: shape.heads,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
            ctx: shape.ctx,
            scale: 1.0 / (shape.head_dim as f32).sqrt(),
            _pad: [0; 3],
        };
        let params = self.uniform("attention params", bytemuck::bytes_of(&p));
        let (h, hd) = (shape.heads as u64, shape.head_dim as u64);
        let cost = Cost {
            row_bytes: 8 * h * hd,
            // each position's K and V rows (read once per query head in this kernel), its scores
            pos_row_bytes: 4 * (2 * h * hd + 3 * h),
            pos_row_flops: 4 * h * hd + 4 * h,
            ..Cost::default()
        };
        self.op(
            Kernel::Attention,
            step,
            &params,
            &[&q.raw, &k_cache.raw, &v_cache.raw, &scores.raw, &out.raw],
            Grid::PerRow(shape.heads),
        )
        .with_cost(cost)
    }

    /// `out[r] = argmax logits[r, :]` (lowest index on ties); `logits: [n, vocab]`, `out: [n]`.
    pub fn argmax(
        &self,
        step: &wgpu::Buffer,
        logits: &GpuBuffer<f32>,
        out: &GpuBuffer<u32>,
        vocab: usize,
    ) -> Op {
        let p = WidthParams { width: vocab as u32, _pad: [0; 3] };
        let params = self.uniform("argmax params", bytemuck::bytes_of(&p));
        let cost = Cost { row_bytes: 4 * vocab as u64, row_flops: vocab as u64, ..Cost::default() };
        self.op(Kernel::Argmax, step, &params, &[&logits.raw, &out.raw], Grid::Rows).with_cost(cost)
    }

    /// Greedy acceptance of a verify pass over `n = K + 1` rows (`step` is that pass's uniform):
    /// `out = [a, target_argmax[a], drafts[..K]]` with a = the accepted count. `drafts: [capacity]`,
    /// `target_argmax: [K + 1]`, `out: [2 + capacity]`.
    pub fn accept_greedy(
        &self,
        step: &wgpu::Buffer,
        drafts: &GpuBuffer<u32>,
        target_argmax: &GpuBuffer<u32>,
        out: &GpuBuffer<u32>,
    ) -> Op {
        let p = WidthParams { width: drafts.len.min(out.len.saturating_sub(2)) as u32, _pad: [0; 3] };
        let params = self.uniform("accept params", bytemuck::bytes_of(&p));
        let storage = [&drafts.raw, &target_argmax.raw, &out.raw];
        self.op(Kernel::AcceptGreedy, step, &params, &storage, Grid::Fixed([1, 1, 1]))
    }

    /// The step uniform buffer (write it with [`Gpu::write_step`] before each pass).
    pub fn step_buffer(&self) -> wgpu::Buffer {
        self.uniform("step", bytemuck::bytes_of(&Step { n: 0, start_pos: 0 }))
    }

    /// Sets the rows and start position of the next pass.
    pub fn write_step(&self, step: &wgpu::Buffer, n: usize, start_pos: usize) {
        let s = Step { n: n as u32, start_pos: start_pos as u32 };
        self.queue.write_buffer(step, 0, bytemuck::bytes_of(&s));
    }
}
