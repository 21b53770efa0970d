//! `wgspec bench --roofline`: the adapter's ceilings and every kernel of a decode step (and of a
//! verify pass) against them, measured in the same run.

use std::collections::BTreeMap;
use std::path::Path;

use wgspec::gpu::{Ceilings, Gpu};
use wgspec::model::{Model, OpProfile};
use wgspec::{Error, Result};

/// Timed runs of each op.
const REPS: usize = 3;

#[derive(Default, serde::Serialize)]
struct KernelRow {
    ops: usize,
    seconds: f64,
    bytes: u64,
    flops: u64,
    /// Fraction of the binding ceiling: floor(bytes, flops) / seconds.
    roofline_fraction: f64,
}

#[derive(serde::Serialize)]
struct PassReport {
    rows: usize,
    /// The whole pass, timed as one submission.
    seconds: f64,
    /// Its floor on this adapter: max(bytes / bandwidth, flops / arithmetic).
    floor_seconds: f64,
    bytes: u64,
    flops: u64,
    dispatches: usize,
    by_kernel: BTreeMap<String, KernelRow>,
}

fn report(ceil: &Ceilings, rows: usize, seconds: f64, ops: &[OpProfile]) -> PassReport {
    let mut by_kernel: BTreeMap<String, KernelRow> = BTreeMap::new();
    for op in ops {
        let row = by_kernel.entry(format!("{:?}", op.kernel)).or_default();
        row.ops += 1;
        row.seconds += op.seconds;
        row.bytes += op.bytes;
        row.flops += op.flops;
    }
    for row in by_kernel.values_mut() {
        row.roofline_fraction = ceil.floor(row.bytes, row.flops) / row.seconds.max(1e-12);
    }
    let bytes = ops.iter().map(|o| o.bytes).sum();
    let flops = ops.iter().map(|o| o.flops).sum();
    PassReport {
        rows,
        seconds,
        floor_seconds: ceil.floor(bytes, flops),
        bytes,
        flops,
        dispatches: ops.len(),
        by_kernel,
    }
}

fn print(p: &PassReport) {
    eprintln!(
        "\n{}-row pass: {:.2} ms ({} dispatches), floor {:.2} ms ({:.1} MB, {:.2} GFLOP): {:.1}% of roofline",
        p.rows,
        p.seconds * 1e3,
        p.dispatches,
        p.floor_seconds * 1e3,
        p.bytes as f64 / 1e6,
        p.flops as f64 / 1e9,
        100.0 * p.floor_seconds / p.seconds.max(1e-12)
    );
    eprintln!(
        "  {:<16} {:>5} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "kernel", "ops", "ms", "MB", "GB/s", "GFLOP/s", "roofline"
    );
    for (name, r) in &p.by_kernel {
        eprintln!(
            "  {:<16} {:>5} {:>10.3} {:>10.2} {:>10.2} {:>10.2} {:>7.1}%",
            name,
            r.ops,
            r.seconds * 1e3,
            r.bytes as f64 / 1e6,
            r.bytes as f64 / r.seconds.max(1e-12) / 1e9,
            r.flops as f64 / r.seconds.max(1e-12) / 1e9,
            100.0 * r.roofline_fraction
        );
    }
}

/// Measures the ceilings, fills `past` cache positions (at most what the context leaves), then
/// profiles a 1-row decode step and a `verify_rows`-row verify pass of `target`; prints tables and
/// writes JSON to `out`.
pub async fn run(
    gpu: &Gpu,
    target: &mut Model,
    name: &str,
    verify_rows: usize,
    past: usize,
    out: &Path,
) -> Result<()> {
    let ceil = gpu.ceilings(256 << 20).await?;
    eprintln!(
        "ceilings: copy {:.2} GB/s, fma {:.2} GFLOP/s",
        ceil.bytes_per_second / 1e9,
        ceil.flops_per_second / 1e9
    );
    let past = past.min(target.context().saturating_sub(verify_rows + 1));
    let filler: Vec<u32> = (0..past as u32).map(|i| i % target.config.vocab_size as u32).collect();
    target.truncate(0);
    for (i, chunk) in filler.chunks(wgspec::model::MAX_BATCH).enumerate() {
        target.prefill(chunk, i * wgspec::model::MAX_BATCH)?;
    }
    let mut passes = Vec::new();
    for rows in [1, verify_rows] {
        target.truncate(past);
        let ops = target.profile(rows, REPS).await?;
        target.truncate(past);
        let seconds = target.time_forward(rows, REPS).await?;
        let p = report(&ceil, rows, seconds, &ops);
        print(&p);
        passes.push(p);
    }
    let verify_cost = passes[1].seconds / passes[0].seconds.max(1e-12);
    eprintln!("\nverify_cost({} rows) = {verify_cost:.2}", verify_rows);
    let json = serde_json::json!({
        "adapter": gpu.describe(),
        "model": name,
        "gpu_weight_bytes": target.weight_bytes(),
        "file_weight_bytes": target.file_weight_bytes(),
        "cached_positions": past,
        "ceilings": ceil,
        "passes": passes,
        "verify_cost": verify_cost,
    });
    let text =
        serde_json::to_string_pretty(&json).map_err(|e| Error::InvalidArgument(format!("json: {e}")))?;
    std::fs::write(out, text).map_err(|e| Error::io(out.display(), e))?;
    eprintln!("wrote {}", out.display());
    Ok(())
}
