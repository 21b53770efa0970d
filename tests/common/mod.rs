//! Shared test helpers: the GPU, seeded random data, tolerance checks.
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use wgspec::gpu::{Gpu, KernelShape};

/// The test GPU (lavapipe in CI). Fails loudly when there is none: a silent skip hides a broken install.
pub fn gpu() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let g = pollster::block_on(Gpu::new()).unwrap_or_else(|e| {
            panic!("GPU setup failed: {e}. (No adapter? ./build.sh setup installs lavapipe.)")
        });
        eprintln!("adapter: {}", g.describe());
        Arc::new(g)
    })
    .clone()
}

/// The test adapter with its kernels in their GPU shape, whatever its default (CPU adapters
/// default to 1 lane and one-pass attention): the matmul with 16 lanes per column quad and
/// fixed-tree reductions in workgroup memory, the attention split over the cache in chunks.
pub fn gpu_shaped() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let shape = KernelShape { matmul_lanes: Some(16), split_attention: Some(true), shuffle_loads: None };
        let g = pollster::block_on(Gpu::with_shape(shape)).expect("GPU in the GPU shape");
        eprintln!("adapter (GPU shape): {}", g.describe());
        Arc::new(g)
    })
    .clone()
}

/// The test adapter's default shape with each invocation loading what it reads, as where
/// there are no subgroups (browsers): lavapipe's default shares the loads by subgroup shuffles.
pub fn gpu_unshared() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let shape = KernelShape { shuffle_loads: Some(false), ..Default::default() };
        let g = pollster::block_on(Gpu::with_shape(shape)).expect("GPU without shuffled loads");
        eprintln!("adapter (loads unshared): {}", g.describe());
        Arc::new(g)
    })
    .clone()
}

/// The kernel shapes on the test adapter: its default, its default with every load its own,
/// and the GPU shape.
pub fn gpus() -> [Arc<Gpu>; 3] {
    [gpu(), gpu_unshared(), gpu_shaped()]
}

pub fn rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

/// `len` values uniform in [-scale, scale).
pub fn rand_vec(rng: &mut SmallRng, len: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|_| rng.gen_range(-scale..scale)).collect()
}

pub fn read_f32(gpu: &Gpu, b: &wgpu::Buffer, len: usize) -> Vec<f32> {
    let bytes = pollster::block_on(gpu.read_buffer(b)).expect("read back");
    bytemuck::pod_collect_to_vec::<u8, f32>(&bytes)[..len].to_vec()
}

pub fn read_u32(gpu: &Gpu, b: &wgpu::Buffer, len: usize) -> Vec<u32> {
    let bytes = pollster::block_on(gpu.read_buffer(b)).expect("read back");
    bytemuck::pod_collect_to_vec::<u8, u32>(&bytes)[..len].to_vec()
}

/// Asserts `|got - want| <= abs + rel * |want|` elementwise, naming the first failure.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], abs: f32, rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        assert!(err <= abs + rel * w.abs() && g.is_finite(), "{what}[{i}]: got {g}, want {w} (err {err})");
        worst = worst.max(err);
    }
    assert!(got.iter().any(|v| *v != 0.0) || want.iter().all(|v| *v == 0.0), "{what}: all zeros");
}

pub mod goldens;
pub mod tiny;

/// Plain (no draft) generation of `prompt` with `model`, to the end: the reference the
/// speculative runs are compared with.
pub fn plain(
    model: &mut wgspec::model::Model,
    prompt: &[u32],
    opts: &wgspec::generation::GenerateOptions,
) -> wgspec::Result<wgspec::speculative::SpecGeneration> {
    let k = wgspec::speculative::KPolicy::default();
    pollster::block_on(wgspec::speculative::generate(
        model,
        wgspec::speculative::Drafter::None,
        prompt,
        opts,
        k,
        &mut |_, _| true,
    ))
}

/// Pearson's statistic of `counts` against probabilities `want` (bins expecting fewer than 5
/// draws pooled), and its degrees of freedom.
pub fn chi_square(counts: &[usize], want: &[f64]) -> (f64, usize) {
    let n: usize = counts.iter().sum();
    let (mut stat, mut bins) = (0.0, 0usize);
    let (mut pooled_n, mut pooled_e) = (0usize, 0.0);
    for (&c, &p) in counts.iter().zip(want) {
        let e = p * n as f64;
        if e >= 5.0 {
            stat += (c as f64 - e).powi(2) / e;
            bins += 1;
        } else {
            pooled_n += c;
            pooled_e += e;
        }
    }
    if pooled_e > 0.0 || pooled_n > 0 {
        stat += (pooled_n as f64 - pooled_e).powi(2) / pooled_e.max(1e-9);
        bins += 1;
    }
    (stat, bins.saturating_sub(1))
}

/// Asserts draws fit a distribution: the statistic below df + 6 sqrt(2 df) (p < 1e-5 for these
/// degrees of freedom; the seeds are fixed, so the test is deterministic).
pub fn assert_fits(what: &str, counts: &[usize], want: &[f64]) {
    let (stat, df) = chi_square(counts, want);
    let bound = df as f64 + 6.0 * (2.0 * df as f64).sqrt();
    eprintln!("{what}: chi-square {stat:.1} on {df} degrees of freedom (bound {bound:.1})");
    assert!(df >= 1, "{what}: {df} degrees of freedom (too peaked to test)");
    assert!(
        stat < bound,
        "{what}: chi-square {stat:.1} >= {bound:.1}: the draws do not follow the distribution"
    );
}
