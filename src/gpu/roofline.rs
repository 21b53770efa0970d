//! The adapter's two ceilings, measured in the same run as the kernels they bound: bandwidth (a
//! large copy) and arithmetic (independent fused multiply-adds on registers). `wgspec bench
//! --roofline` reports every kernel of a decode step against them.

use web_time::Instant;

use super::layout::gpu_struct;
use super::{Gpu, GpuBuffer, Grid, Kernel, Op};
use crate::error::Result;

/// Measured ceilings of an adapter.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Ceilings {
    /// Bytes moved per second by a large copy (read + write).
    pub bytes_per_second: f64,
    /// f32 flops per second of register-resident fused multiply-adds.
    pub flops_per_second: f64,
}

impl Ceilings {
    /// The floor of an op or a pass: max(bytes / bandwidth, flops / arithmetic), in seconds.
    pub fn floor(&self, bytes: u64, flops: u64) -> f64 {
        (bytes as f64 / self.bytes_per_second.max(1.0)).max(flops as f64 / self.flops_per_second.max(1.0))
    }
}

/// A clock for timed runs: seconds since some fixed start. [`wall_clock`], or (native tools) the
/// process's CPU time, which on a CPU adapter counts the shaders' work on the process's threads and
/// not the time a shared machine's other tenants take.
pub type Clock = fn() -> f64;

/// Wall-clock seconds since the first call.
pub fn wall_clock() -> f64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

impl Gpu {
    /// Runs `ops` (a pass of `n` rows; the pass uniform already written) `reps` times in one
    /// submission, after one warm-up run, and returns the seconds per run on `clock`.
    pub async fn time_ops(&self, ops: &[Op], n: u32, reps: usize, clock: Clock) -> Result<f64> {
        let dummy = GpuBuffer::<u32>::zeros(self, "timing", 4);
        let mut enc = self.encoder();
        self.encode(&mut enc, ops, n);
        self.submit_and_read(enc, &dummy.raw, 0, 4).await?;
        let t = clock();
        let mut enc = self.encoder();
        for _ in 0..reps.max(1) {
            self.encode(&mut enc, ops, n);
        }
        self.submit_and_read(enc, &dummy.raw, 0, 4).await?;
        Ok((clock() - t) / reps.max(1) as f64)
    }

    /// Measures both ceilings on `clock`: a copy of `bytes` (capped by the largest binding) and
    /// `invocations` x `iters` rounds of 32 fused multiply-adds.
    pub async fn ceilings(&self, bytes: u64, clock: Clock) -> Result<Ceilings> {
        let step = self.step_buffer();
        self.write_step(&step, 1, 0);
        let len = (bytes.min(self.max_binding_bytes()) / 16) as usize;
        let src = GpuBuffer::<u32>::zeros(self, "copy src", len * 4);
        let dst = GpuBuffer::<u32>::zeros(self, "copy dst", len * 4);
        let params = self
            .uniform("copy params", bytemuck::bytes_of(&BenchCopyParams { len: len as u32, _pad: [0; 3] }));
        let per_row = 65535 * 64;
        let grid = Grid::Fixed([(len.min(per_row) as u32).div_ceil(64), len.div_ceil(per_row) as u32, 1]);
        let copy = self.op(Kernel::BenchCopy, &step, &params, &[&src.raw, &dst.raw], grid);
        let copy_s = self.time_ops(std::slice::from_ref(&copy), 1, 4, clock).await?;

        let (groups, iters) = (4096u32, 1024u32);
        let out = GpuBuffer::<f32>::zeros(self, "fma out", groups as usize * 64);
        let params = self.uniform("fma params", bytemuck::bytes_of(&BenchFmaParams { iters, _pad: [0; 3] }));
        let fma = self.op(Kernel::BenchFma, &step, &params, &[&out.raw], Grid::Fixed([groups, 1, 1]));
        let fma_s = self.time_ops(std::slice::from_ref(&fma), 1, 2, clock).await?;
        let flops = groups as f64 * 64.0 * iters as f64 * 8.0 * 4.0 * 2.0;
        Ok(Ceilings { bytes_per_second: 2.0 * (len * 16) as f64 / copy_s, flops_per_second: flops / fma_s })
    }
}

gpu_struct! {
    /// `shaders/bench_copy.wgsl`'s parameters.
    pub(super) struct BenchCopyParams => Params {
        /// vec4 elements to copy.
        len: u32,
        _pad: [u32; 3],
    }
}

gpu_struct! {
    /// `shaders/bench_fma.wgsl`'s parameters.
    pub(super) struct BenchFmaParams => Params {
        /// Rounds of 32 fused multiply-adds per invocation.
        iters: u32,
        _pad: [u32; 3],
    }
}
