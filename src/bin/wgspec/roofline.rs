//! `wgspec bench --roofline`: the adapter's ceilings and every kernel of a decode step (and of a
//! verify pass) against them, measured in the same run.

use std::collections::BTreeMap;
use std::path::Path;

use wgspec::gpu::{wall_clock, Ceilings, Clock, Gpu};
use wgspec::model::{Model, OpProfile};
use wgspec::{Error, Result};

/// The process's CPU seconds (user + system, every thread: on a CPU adapter the shaders run on
/// the process's own threads), from Linux's /proc/self/stat (in USER_HZ ticks: 100 per second);
/// `None` where that cannot be read.
fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // the fields after the command name (which may hold spaces, in parentheses): state is the
    // first, utime the 12th, stime the 13th
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn cpu_clock() -> f64 {
    process_cpu_seconds().unwrap_or(0.0)
}

/// How `wgspec bench --roofline` times: `reps` runs of each op and pass, on the wall clock or
/// (`cpu_time`) as the process's CPU time.
pub struct Timing {
    reps: usize,
    cpu_time: bool,
    clock: Clock,
}

impl Timing {
    /// Checked as soon as the adapter is known, before a model loads: the process's CPU time
    /// counts an adapter's work only where it runs on the CPU, and needs /proc/self/stat.
    pub fn new(reps: usize, cpu_time: bool, gpu: &Gpu) -> Result<Timing> {
        if !cpu_time {
            return Ok(Timing { reps, cpu_time, clock: wall_clock });
        }
        if !gpu.runs_on_cpu() {
            return Err(Error::InvalidArgument(format!(
                "--cpu-time times adapters that run on the CPU (lavapipe); {} works off the process",
                gpu.info.name
            )));
        }
        if process_cpu_seconds().is_none() {
            return Err(Error::InvalidArgument(
                "--cpu-time reads the process's CPU time from /proc/self/stat, which this system lacks"
                    .into(),
            ));
        }
        Ok(Timing { reps, cpu_time, clock: cpu_clock })
    }
}

#[derive(Default, serde::Serialize)]
struct KernelRow {
    ops: usize,
    seconds: f64,
    bytes: u64,
    flops: u64,
    /// Fraction of the binding ceiling: floor(bytes, flops) / seconds (0 when no time was
    /// measured: a kernel under one tick of the --cpu-time clock).
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
        // (0 where the clock did not tick: --cpu-time's 10 ms resolution)
        row.roofline_fraction =
            if row.seconds > 0.0 { ceil.floor(row.bytes, row.flops) / row.seconds } else { 0.0 };
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
    let of_roofline = if p.seconds > 0.0 {
        format!("{:.1}% of roofline", 100.0 * p.floor_seconds / p.seconds)
    } else {
        "under one tick of the clock".to_string()
    };
    eprintln!(
        "\n{}-row pass: {:.2} ms ({} dispatches), floor {:.2} ms ({:.1} MB, {:.2} GFLOP): {of_roofline}",
        p.rows,
        p.seconds * 1e3,
        p.dispatches,
        p.floor_seconds * 1e3,
        p.bytes as f64 / 1e6,
        p.flops as f64 / 1e9,
    );
    eprintln!(
        "  {:<16} {:>5} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "kernel", "ops", "ms", "MB", "GB/s", "GFLOP/s", "roofline"
    );
    for (name, r) in &p.by_kernel {
        if r.seconds <= 0.0 {
            let mb = r.bytes as f64 / 1e6;
            eprintln!("  {:<16} {:>5} {:>10} {:>10.2} (under one tick of the clock)", name, r.ops, "0", mb);
            continue;
        }
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

/// Compute units of the GPU the shape facts count waves on: an H100's or H200's 132 SMs.
const SHAPE_UNITS: u64 = 132;

/// The shape facts of a pass of `rows` rows (`pass`: "step" or "verify"), printed by kernel
/// (dispatches, workgroups of the smallest and largest, the longest serial loop, waves on
/// [`SHAPE_UNITS`] units, bytes), and as JSON rows, one per dispatch.
fn shapes(target: &Model, rows: usize, past: usize, pass: &str) -> Vec<serde_json::Value> {
    let ops = target.shapes(rows, past);
    eprintln!(
        "\n{rows}-row pass ({pass}): {} dispatches ({} per layer); shape facts, waves on {SHAPE_UNITS} compute units",
        ops.len(),
        target.dispatches_per_layer()
    );
    eprintln!(
        "  {:<20} {:>5} {:>16} {:>5} {:>9} {:>12} {:>10}",
        "kernel", "ops", "workgroups", "inv.", "serial", "waves", "MB"
    );
    let mut by_kernel: BTreeMap<&str, Vec<&wgspec::gpu::OpShape>> = BTreeMap::new();
    for op in &ops {
        by_kernel.entry(op.kernel.as_str()).or_default().push(op);
    }
    for (kernel, all) in &by_kernel {
        let groups = |f: fn(&u64, &u64) -> bool| {
            all.iter().map(|o| o.workgroups).reduce(|a, b| if f(&a, &b) { a } else { b }).unwrap_or(0)
        };
        let (least, most) = (groups(|a, b| a <= b), groups(|a, b| a >= b));
        let serial = all.iter().map(|o| o.serial_iterations).max().unwrap_or(0);
        let waves = all.iter().map(|o| o.waves(SHAPE_UNITS)).fold(f64::INFINITY, f64::min);
        let mb = all.iter().map(|o| o.bytes).sum::<u64>() as f64 / 1e6;
        eprintln!(
            "  {:<20} {:>5} {:>16} {:>5} {:>9} {:>12} {:>10.2}",
            kernel,
            all.len(),
            format!("{least}..{most}"),
            all[0].invocations,
            serial,
            format!("{waves:.2} (min)"),
            mb
        );
    }
    ops.iter()
        .map(|o| {
            serde_json::json!({
                "kernel": o.kernel,
                "pass": pass,
                "workgroups": o.workgroups,
                "invocations": o.invocations,
                "serial_iterations": o.serial_iterations,
                "bytes": o.bytes,
            })
        })
        .collect()
}

/// Fills `past` cache positions of `target` (at most what the context leaves room for, beside
/// a pass of `rows`); returns how many.
fn fill_cache(target: &mut Model, past: usize, rows: usize) -> Result<usize> {
    let past = past.min(target.context().saturating_sub(rows + 1));
    let filler: Vec<u32> = (0..past as u32).map(|i| i % target.config.vocab_size as u32).collect();
    target.truncate(0);
    for (i, chunk) in filler.chunks(wgspec::model::MAX_BATCH).enumerate() {
        target.prefill(chunk, i * wgspec::model::MAX_BATCH)?;
    }
    Ok(past)
}

/// `wgspec bench --roofline --shape-only`: the shape facts of a 1-row step and a
/// `verify_rows`-row pass after `past` cached positions, printed and written as JSON to `out`;
/// nothing is run.
pub fn shape_only(
    gpu: &Gpu,
    target: &Model,
    name: &str,
    verify_rows: usize,
    past: usize,
    out: &Path,
) -> Result<()> {
    let past = past.min(target.context().saturating_sub(verify_rows + 1));
    let mut ops = shapes(target, 1, past, "step");
    let dispatches_per_step = ops.len();
    ops.extend(shapes(target, verify_rows, past, "verify"));
    write_json(
        out,
        serde_json::json!({
            "adapter": gpu.describe(),
            "model": name,
            "cached_positions": past,
            "dispatches_per_step": dispatches_per_step,
            "dispatches_per_layer": target.dispatches_per_layer(),
            "ops": ops,
        }),
    )
}

fn write_json(out: &Path, json: serde_json::Value) -> Result<()> {
    let text =
        serde_json::to_string_pretty(&json).map_err(|e| Error::InvalidArgument(format!("json: {e}")))?;
    std::fs::write(out, text).map_err(|e| Error::io(out.display(), e))?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// Measures the ceilings, fills `past` cache positions (at most what the context leaves), then
/// profiles a 1-row decode step and a `verify_rows`-row verify pass of `target`; prints tables and
/// the passes' shape facts and writes JSON to `out`.
pub async fn run(
    gpu: &Gpu,
    target: &mut Model,
    name: &str,
    verify_rows: usize,
    past: usize,
    timing: &Timing,
    out: &Path,
) -> Result<()> {
    let clock = timing.clock;
    let seconds_are = if timing.cpu_time { "process CPU seconds" } else { "wall-clock seconds" };
    eprintln!("timed in {seconds_are}, runs of each op and pass: {}", timing.reps);
    let ceil = gpu.ceilings(256 << 20, clock).await?;
    eprintln!(
        "ceilings: copy {:.2} GB/s, fma {:.2} GFLOP/s",
        ceil.bytes_per_second / 1e9,
        ceil.flops_per_second / 1e9
    );
    let past = fill_cache(target, past, verify_rows)?;
    let mut passes = Vec::new();
    let mut shape_rows = Vec::new();
    for rows in [1, verify_rows] {
        target.truncate(past);
        let ops = target.profile(rows, timing.reps, clock).await?;
        target.truncate(past);
        let seconds = target.time_forward(rows, timing.reps, clock).await?;
        let p = report(&ceil, rows, seconds, &ops);
        print(&p);
        shape_rows.extend(shapes(target, rows, past, if rows == 1 { "step" } else { "verify" }));
        if timing.cpu_time && seconds * (timing.reps as f64) < 0.1 {
            eprintln!("  (the pass took under 10 ticks of the CPU clock in all: raise --reps for figures)");
        }
        passes.push(p);
    }
    // (0 where the 1-row pass took no tick of the --cpu-time clock)
    let verify_cost = if passes[0].seconds > 0.0 { passes[1].seconds / passes[0].seconds } else { 0.0 };
    eprintln!("\nverify_cost({} rows) = {verify_cost:.2}", verify_rows);
    let json = serde_json::json!({
        "adapter": gpu.describe(),
        "model": name,
        "gpu_weight_bytes": target.weight_bytes(),
        "file_weight_bytes": target.file_weight_bytes(),
        "cached_positions": past,
        "clock": if timing.cpu_time { "process_cpu" } else { "wall" },
        "reps": timing.reps,
        "ceilings": ceil,
        "passes": passes,
        "verify_cost": verify_cost,
        "dispatches_per_step": shape_rows.iter().filter(|o| o["pass"] == "step").count(),
        "dispatches_per_layer": target.dispatches_per_layer(),
        "ops": shape_rows,
    });
    write_json(out, json)
}
