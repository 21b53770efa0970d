//! GPU core: the adapter and device (with the adapter's real limits), typed buffers, the kernel
//! pipelines compiled on first use, op lists encoded into one command buffer, and async readback.
//!
//! Everything here is `async` without blocking assumptions, so the same code runs natively and in
//! wasm32 (where the browser drives the futures). Native callers block on it with `pollster`.

mod buffer;
mod format;
mod kernel;
pub(crate) mod layout;
mod ops;
mod roofline;

pub use buffer::{allocated_bytes, table_bytes, GpuBuffer};
pub use format::{pack_f32_rows, pack_rows, units, PackedRows, WeightBuffer, UNIT};
pub(crate) use kernel::row_group;
pub use kernel::{matmul_lanes, Kernel, Pipelines, MATMUL_WORKGROUPS, MAX_MATMUL_LANES};
pub use ops::{
    argmax_scratch, reduce_slices, sample_scratch_len, AttentionShape, EagleTreeMode, EagleTreeParams,
    HeadNormIo, KeepParams, KvOut, MatmulOut, NormIn, RopeLayout, RopeOut, SampleConfig, SampleSeed,
    SideOutput, Step, TopKScratch, EAGLE_TREE_MANY, EAGLE_TREE_NEWEST, EAGLE_TREE_OUT, EAGLE_TREE_RESULT,
    EAGLE_TREE_SLOTS, EAGLE_TREE_STATE, EAGLE_TREE_STEP, EAGLE_TREE_TOKENS, KV_PAGE, MATMUL_ROW_STEP,
    MAX_NORMED_HEAD, MAX_TOP_K, MAX_TREE, PASS_ROWS, REDUCE_SLICE,
};
pub use roofline::{wall_clock, Ceilings, Clock};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// An adapter, its device and queue, its limits, and its kernels (compiled on first use).
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    /// What the adapter says about itself (name, backend, driver).
    pub info: wgpu::AdapterInfo,
    /// The limits the device was created with: the adapter's own, not WebGPU's defaults.
    pub limits: wgpu::Limits,
    /// Matmul invocations per output column: 16 on GPUs, 1 where invocations run on a CPU.
    matmul_lanes: u32,
    /// The invocations of a subgroup share the loads they all need by shuffles: the matmul's of
    /// x, the one-pass attention's of q and the scores (CPU adapters with subgroups of at least 8:
    /// `shaders/share/shuffle.wgsl`).
    shuffle_loads: bool,
    /// Attention split over the cache in chunks (GPUs), or one pass per head and row (CPU adapters).
    split_attention: bool,
    pipelines: Pipelines,
    /// Bound where an op leaves a writable binding unused (a matmul without a KV split).
    unused_output: wgpu::Buffer,
    /// Command submissions and read-backs so far (see [`Gpu::round_trips`]).
    submits: AtomicU64,
    readbacks: AtomicU64,
    readback_bytes: AtomicU64,
    /// Dispatches encoded so far, and the host's nanoseconds encoding and submitting them.
    dispatches: AtomicU64,
    host_nanos: AtomicU64,
    /// Bytes of the buffers created so far that a memory bill counts (all but uniforms and
    /// read-back staging: see [`Gpu::create_buffer`]).
    billed_bytes: AtomicU64,
    /// The first GPU error no error scope caught (an out-of-memory while allocating, ...), kept
    /// for [`Gpu::take_error`] instead of wgpu's default handler, which panics.
    uncaptured: Arc<Mutex<Option<String>>>,
}

/// Error scopes opened by [`Gpu::build_scope`] (natively, on the calling thread).
pub struct BuildScope {
    validation: wgpu::ErrorScopeGuard,
    internal: wgpu::ErrorScopeGuard,
    /// The device's uncaptured errors ([`Gpu::take_error`]), where a browser's arrive.
    #[cfg(target_arch = "wasm32")]
    sink: Arc<Mutex<Option<String>>>,
}

impl BuildScope {
    /// Closes the scopes: the first error they caught. They are popped before the returned
    /// future runs, so it holds no scope across an await.
    pub fn errors(self) -> impl std::future::Future<Output = Option<wgpu::Error>> + use<> {
        let (internal, validation) = (self.internal.pop(), self.validation.pop());
        async move { internal.await.or(validation.await) }
    }

    /// Closes the scopes without waiting. Natively their errors are known at once: the first (a
    /// kernel that failed to build, with its label) is [`Error::Gpu`] about `what`. In a browser
    /// they arrive later, and the first goes where uncaptured errors go: the next read-back
    /// reports it (a load cannot wait for it: [`crate::model::Model::load`] polls once).
    pub fn close(self, what: &str) -> Result<()> {
        let what = what.to_string();
        #[cfg(target_arch = "wasm32")]
        let sink = self.sink.clone();
        let first = self.errors();
        #[cfg(not(target_arch = "wasm32"))]
        {
            use std::future::Future;
            use std::task::{Context, Poll, Waker};
            let mut first = std::pin::pin!(first);
            match first.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(Some(e)) => Err(Error::Gpu(format!("{what}: {e}"))),
                // (wgpu-core pops its scopes at once: never pending)
                Poll::Ready(None) | Poll::Pending => Ok(()),
            }
        }
        #[cfg(target_arch = "wasm32")]
        {
            wasm_bindgen_futures::spawn_local(async move {
                if let Some(e) = first.await {
                    if let Ok(mut slot) = sink.lock() {
                        slot.get_or_insert(format!("{what}: {e}"));
                    }
                }
            });
            Ok(())
        }
    }
}

/// Submissions and read-backs counted by a [`Gpu`]: the round trips that cost latency in a browser.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundTrips {
    pub submits: u64,
    pub readbacks: u64,
    /// Bytes those read-backs returned.
    pub readback_bytes: u64,
    /// Compute dispatches encoded.
    pub dispatches: u64,
    /// Host time encoding ops into command buffers and submitting them, in nanoseconds (what a
    /// GPU waits on between the cycles it is given).
    pub host_nanos: u64,
}

impl std::ops::Sub for RoundTrips {
    type Output = RoundTrips;
    fn sub(self, earlier: RoundTrips) -> RoundTrips {
        RoundTrips {
            submits: self.submits.saturating_sub(earlier.submits),
            readbacks: self.readbacks.saturating_sub(earlier.readbacks),
            readback_bytes: self.readback_bytes.saturating_sub(earlier.readback_bytes),
            dispatches: self.dispatches.saturating_sub(earlier.dispatches),
            host_nanos: self.host_nanos.saturating_sub(earlier.host_nanos),
        }
    }
}

/// How many workgroups an op dispatches, possibly depending on the rows `n` in the pass.
#[derive(Clone, Copy, Debug)]
pub enum Grid {
    /// Always these counts.
    Fixed([u32; 3]),
    /// `[x, n, 1]`: x groups for each row.
    PerRow(u32),
    /// `[n, 1, 1]`: one group per row.
    Rows,
    /// `[ceil(n / rows), y, 1]`: y groups (tiles of columns) for each group of `rows` rows. The
    /// row groups run along x so that a CPU adapter, which splits the linear order of workgroups
    /// between its threads, gives each thread its share of every row group.
    RowGroups { y: u32, rows: u32 },
}

impl Grid {
    fn counts(self, n: u32) -> [u32; 3] {
        match self {
            Grid::Fixed(c) => c,
            Grid::PerRow(x) => [x, n, 1],
            Grid::Rows => [n, 1, 1],
            Grid::RowGroups { y, rows } => [n.div_ceil(rows), y, 1],
        }
    }
}

/// Rows one matmul workgroup takes in a pass of `n` rows, a pipeline's groups being of `rows`:
/// past them, on a device with wide pipelines (`wide`: GPUs), the wide one's [`kernel::WIDE_ROWS`].
fn group_rows(rows: u32, wide: bool, n: u32) -> u32 {
    if wide && n > rows {
        kernel::WIDE_ROWS
    } else {
        rows
    }
}

/// One dispatch of one kernel over buffers bound once. Built at model load, replayed every pass.
pub struct Op {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    grid: Grid,
    cost: Cost,
    serial: Serial,
    /// (matmuls) invocations per column quad of its pipeline ([`kernel::matmul_lanes`]); the
    /// device's own for other kernels.
    lanes: u32,
}

/// The longest loop one invocation of an op runs, in iterations (nested loops multiplied, a
/// workgroup's tree reductions counted as their steps; a loop whose trips depend on the pass's
/// rows at its bound): `fixed`, plus `per_step` for every `positions_per_step` cached positions
/// its row attends to (attention), as the op's constructor reads it from the kernel's loops and
/// its parameters. What latency a GPU cannot hide behind other workgroups: its dependent steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Serial {
    pub fixed: u64,
    pub per_step: u64,
    pub positions_per_step: u64,
}

impl Serial {
    /// A loop of `iterations` whatever the cache.
    pub fn fixed(iterations: u64) -> Serial {
        Serial { fixed: iterations, ..Serial::default() }
    }

    /// Iterations for a row that attends to `positions` cached positions.
    pub fn at(&self, positions: u64) -> u64 {
        match self.positions_per_step {
            0 => self.fixed,
            p => self.fixed + self.per_step * positions.div_ceil(p),
        }
    }
}

/// What a GPU waits on in one dispatch of an op (its shape facts), computed from its grid and
/// parameters as [`Gpu::encode`] dispatches it: its workgroups, the invocations of each, the
/// longest serial loop of one invocation, and the bytes it reads and writes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OpShape {
    pub kernel: String,
    pub workgroups: u64,
    pub invocations: u32,
    pub serial_iterations: u64,
    pub bytes: u64,
}

impl OpShape {
    /// Waves of workgroups on a GPU of `units` compute units holding one workgroup each at a
    /// time (a lower bound on its waves; 132 SMs on an H100 or H200).
    pub fn waves(&self, units: u64) -> f64 {
        self.workgroups as f64 / units as f64
    }
}

/// What an op moves and computes, for roofline reports: a fixed part (weights), a part per row
/// of the pass (activations), and a part per row and cached position (attention over the cache).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    pub fixed_bytes: u64,
    pub row_bytes: u64,
    pub row_flops: u64,
    pub pos_row_bytes: u64,
    pub pos_row_flops: u64,
}

impl Cost {
    /// (bytes, flops) of a pass of `n` rows whose last row sits at position `pos`.
    pub fn at(&self, n: u64, pos: u64) -> (u64, u64) {
        let positions = n * (pos + 1);
        (
            self.fixed_bytes + n * self.row_bytes + positions * self.pos_row_bytes,
            n * self.row_flops + positions * self.pos_row_flops,
        )
    }
}

impl Op {
    /// The kernel this op runs.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// What it moves and computes.
    pub fn cost(&self) -> Cost {
        self.cost
    }

    /// The same op with its cost set.
    pub fn with_cost(self, cost: Cost) -> Op {
        Op { cost, ..self }
    }

    /// The longest loop one of its invocations runs.
    pub fn serial(&self) -> Serial {
        self.serial
    }

    /// The same op with its longest loop set.
    pub fn with_serial(self, serial: Serial) -> Op {
        Op { serial, ..self }
    }

    /// (matmuls) Its pipeline's invocations per column quad.
    pub fn lanes(&self) -> u32 {
        self.lanes
    }

    /// The same op run by its kernel's pipeline of `lanes` (matmuls; [`Gpu::matmul_lanes_for`]).
    fn with_lanes(self, lanes: u32) -> Op {
        Op { lanes, ..self }
    }
}

/// Workgroups needed to cover `items` with 64-thread groups.
pub fn groups(items: usize) -> u32 {
    items.div_ceil(Kernel::WORKGROUP as usize) as u32
}

/// How the kernels are shaped for an adapter ([`Gpu::with_shape`]); `None` takes the adapter's
/// default. Every shape gives each row the same bits whatever the rows of its pass (each is
/// batch-invariant on its own), but two shapes may differ from each other in the last bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelShape {
    /// Matmul invocations per column quad splitting k, a power of two from 1 to 64: 16 on GPUs,
    /// 1 where invocations run on a CPU. Above 1, the fewest: narrow matrices double it
    /// ([`matmul_lanes`]).
    pub matmul_lanes: Option<u32>,
    /// Attention split over the cache in chunks of keys, the query heads of a KV group sharing
    /// each load (`attention_chunks.wgsl` + `attention_merge.wgsl`): on by default on GPUs. Off:
    /// one workgroup per row and block of up to 4 query heads of a KV group walks every key,
    /// loading each once for the block (`attention.wgsl`), CPU adapters' default.
    pub split_attention: Option<bool>,
    /// The invocations of a subgroup load each value they all need once and pass it on by a
    /// subgroup shuffle (`shaders/share/shuffle.wgsl`: the matmul's x, the one-pass attention's
    /// q and scores) instead of each loading it: on by default where the matmul has 1 lane and
    /// the adapter has subgroups of at least 8 invocations (lavapipe); the same bits either way.
    /// Needs both.
    pub shuffle_loads: Option<bool>,
}

/// Whether the adapter runs invocations on CPU cores (lavapipe / llvmpipe, SwiftShader, WARP):
/// there a workgroup barrier is a context switch, so the matmul gives each column one invocation.
fn runs_on_cpu(info: &wgpu::AdapterInfo) -> bool {
    let name = info.name.to_lowercase();
    info.device_type == wgpu::DeviceType::Cpu
        || ["llvmpipe", "lavapipe", "swiftshader", "warp"].iter().any(|n| name.contains(n))
}

impl Gpu {
    /// Picks the highest-performance adapter and creates a device with the adapter's full limits.
    pub async fn new() -> Result<Gpu> {
        Self::with_shape(KernelShape::default()).await
    }

    /// As [`Gpu::new`], with the kernels' shape forced where `shape` says so instead of the
    /// adapter's default: tests run the GPU shape on a CPU adapter, benchmarks compare shapes.
    pub async fn with_shape(shape: KernelShape) -> Result<Gpu> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::NoGpu(format!("no adapter found: {e}")))?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let invocations =
            limits.max_compute_invocations_per_workgroup.min(limits.max_compute_workgroup_size_x);
        if invocations < Kernel::LARGEST_WORKGROUP || limits.max_storage_buffers_per_shader_stage < 8 {
            return Err(Error::GpuLimit(format!(
                "adapter {} allows {} invocations per workgroup and {} storage buffers per stage; \
                 wgspec needs {} (WebGPU's default) and 8",
                info.name,
                invocations,
                limits.max_storage_buffers_per_shader_stage,
                Kernel::LARGEST_WORKGROUP
            )));
        }
        let split_attention = shape.split_attention.unwrap_or(!runs_on_cpu(&info));
        let matmul_lanes = match shape.matmul_lanes {
            Some(l) if l.is_power_of_two() && l <= Kernel::WORKGROUP => l,
            Some(l) => {
                return Err(Error::InvalidArgument(format!("matmul lanes {l}: a power of two up to 64")))
            }
            None if runs_on_cpu(&info) => 1,
            None => 16,
        };
        // a subgroup of 8 or more whose invocations all read x at the same offsets (1 lane)
        let can_shuffle = matmul_lanes == 1
            && adapter.features().contains(wgpu::Features::SUBGROUP)
            && info.subgroup_min_size >= 8;
        let shuffle_loads = match shape.shuffle_loads {
            Some(true) if !can_shuffle => {
                return Err(Error::InvalidArgument(format!(
                    "shuffled loads: need 1 matmul lane (not {matmul_lanes}) and subgroups of at least 8 \
                     invocations (adapter {}: {}, {}..{})",
                    info.name,
                    if adapter.features().contains(wgpu::Features::SUBGROUP) {
                        "subgroups"
                    } else {
                        "no subgroups"
                    },
                    info.subgroup_min_size,
                    info.subgroup_max_size
                )))
            }
            Some(on) => on,
            None => can_shuffle,
        };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("wgspec"),
                required_features: if shuffle_loads {
                    wgpu::Features::SUBGROUP
                } else {
                    wgpu::Features::empty()
                },
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| Error::NoGpu(format!("adapter {} refused a device: {e}", info.name)))?;
        let uncaptured = Arc::new(Mutex::new(None));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let msg = match &e {
                wgpu::Error::OutOfMemory { .. } => format!("out of GPU memory: {e}"),
                _ => e.to_string(),
            };
            log::error!("uncaptured GPU error: {msg}");
            if let Ok(mut first) = sink.lock() {
                first.get_or_insert(msg);
            }
        }));
        let pipelines = Pipelines::new(&device, matmul_lanes, shuffle_loads);
        let unused_output = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("unused output"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Ok(Gpu {
            device,
            queue,
            info,
            limits,
            matmul_lanes,
            shuffle_loads,
            split_attention,
            pipelines,
            unused_output,
            submits: AtomicU64::new(0),
            readbacks: AtomicU64::new(0),
            readback_bytes: AtomicU64::new(0),
            dispatches: AtomicU64::new(0),
            host_nanos: AtomicU64::new(0),
            billed_bytes: AtomicU64::new(0),
            uncaptured,
        })
    }

    /// Compiles every kernel not compiled yet, each inside its own error scopes (validation and
    /// internal errors): the first that fails to build on this adapter is [`Error::Gpu`] naming
    /// it; then any GPU error no scope caught before ([`Gpu::take_error`]). Kernels otherwise
    /// compile the first time an op of theirs is built. (Tests check every kernel this way.)
    pub async fn check_kernels(&self) -> Result<()> {
        for kernel in Kernel::all() {
            let scope = self.build_scope();
            for lanes in self.pipelines.matmul_lane_counts() {
                self.pipelines.get_with(kernel, lanes);
            }
            if let Some(err) = scope.errors().await {
                return Err(Error::Gpu(format!("kernel {kernel:?} failed to build: {err}")));
            }
        }
        self.take_error()
    }

    /// Opens the error scopes (validation and internal errors) that catch a kernel failing to
    /// build while ops are built: kernels compile on first use, so a load wraps the recording of
    /// its ops in one and closes it before it returns ([`BuildScope::close`]).
    pub fn build_scope(&self) -> BuildScope {
        BuildScope {
            validation: self.device.push_error_scope(wgpu::ErrorFilter::Validation),
            internal: self.device.push_error_scope(wgpu::ErrorFilter::Internal),
            #[cfg(target_arch = "wasm32")]
            sink: self.uncaptured.clone(),
        }
    }

    /// The kernels this device has compiled so far (of [`Kernel::all`]).
    pub fn compiled_kernels(&self) -> Vec<Kernel> {
        self.pipelines.compiled_kernels()
    }

    /// Rows whose blocks a weight buffer interleaves ([`kernel::row_group`]): weight
    /// buffers start at multiples of it, and rows are packed for it ([`pack_rows`]).
    pub fn row_group(&self) -> usize {
        kernel::row_group(self.matmul_lanes) as usize
    }

    /// Rows of a pass one matmul workgroup takes ([`kernel::matmul_rows`]).
    pub fn matmul_rows(&self) -> u32 {
        kernel::matmul_rows(self.matmul_lanes)
    }

    /// The groups of rows each matmul of a pass of `n` rows runs, each reading every weight once
    /// (what a pass's matmuls are dispatched with): on a CPU adapter groups of [`Gpu::matmul_rows`] (8); on
    /// a GPU one group up to its decode pipeline's rows (4), then the wide pipeline's groups of
    /// [`kernel::WIDE_ROWS`] (16). A pass's cost steps up where its rows need one more.
    pub fn matmul_row_groups(&self, n: usize) -> usize {
        n.div_ceil(group_rows(self.matmul_rows(), self.pipelines.matmul_wide(), n as u32) as usize)
    }

    /// Output columns one matmul workgroup computes with the device's own lanes (4 per
    /// invocation, 64 / lanes invocations), the most of any of its matmuls.
    pub fn matmul_columns_per_group(&self) -> usize {
        kernel::matmul_columns_per_group(self.matmul_lanes)
    }

    /// The device's own matmul invocations per column quad: 1 on CPU adapters, 16 on GPUs (the
    /// fewest of any of its matmuls).
    pub fn matmul_lanes(&self) -> u32 {
        self.matmul_lanes
    }

    /// Invocations per column quad of the matmul of a weight matrix of `cols` rows and `units`
    /// 32-weight units per row on this device ([`kernel::matmul_lanes`]).
    pub fn matmul_lanes_for(&self, cols: usize, units: usize) -> u32 {
        kernel::matmul_lanes(self.matmul_lanes, cols, units)
    }

    /// Whether the invocations of a subgroup share the loads they all need by shuffles
    /// ([`KernelShape::shuffle_loads`]).
    pub fn shuffles_loads(&self) -> bool {
        self.shuffle_loads
    }

    /// Whether the adapter runs invocations on the CPU (lavapipe, SwiftShader, WARP): its work is
    /// then the process's own CPU time.
    pub fn runs_on_cpu(&self) -> bool {
        runs_on_cpu(&self.info)
    }

    /// A one-line description of the adapter, for logs and benchmark records.
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {}; matmul lanes {}{}{}, attention {})",
            self.info.name,
            self.info.backend,
            self.info.driver_info,
            self.matmul_lanes,
            if self.matmul_lanes > 1 { " (up to 64 for narrow matrices)" } else { "" },
            if self.shuffle_loads { ", loads shared by subgroup shuffles" } else { "" },
            if self.split_attention { "split" } else { "one pass" }
        )
    }

    /// The largest buffer that one binding may cover, in bytes (a multiple of 256).
    pub fn max_binding_bytes(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size.min(self.limits.max_buffer_size) / 256 * 256
    }

    /// Creates a buffer, counting its bytes in [`Gpu::billed_bytes`] unless it is a uniform or a
    /// read-back's staging buffer (which memory bills leave out: small, or gone after use).
    pub fn create_buffer(&self, desc: &wgpu::BufferDescriptor) -> wgpu::Buffer {
        let unbilled = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::MAP_READ;
        if !desc.usage.intersects(unbilled) {
            self.billed_bytes.fetch_add(desc.size, Ordering::Relaxed);
        }
        self.device.create_buffer(desc)
    }

    /// Bytes of the buffers created so far that memory bills count ([`Model::plan`]'s and the
    /// heads' `plan`s): a load's growth of it is what its bill said.
    ///
    /// [`Model::plan`]: crate::model::Model::plan
    pub fn billed_bytes(&self) -> u64 {
        self.billed_bytes.load(Ordering::Relaxed)
    }

    /// Refuses a table of buffers (`(label, 4-byte words, how many)`, as the memory bills hold
    /// them) with one that a binding cannot cover on this adapter: checked before anything is
    /// allocated.
    pub fn check_bindings(&self, table: &[(&str, usize, usize)]) -> Result<()> {
        for &(label, words, _) in table {
            // (u64: a 32-bit usize in the browser must not wrap)
            let bytes = 4 * words as u64;
            if bytes > self.max_binding_bytes() {
                return Err(Error::GpuLimit(format!(
                    "{label} needs {bytes} bytes in one binding; the adapter allows {} (maxStorageBufferBindingSize, maxBufferSize)",
                    self.max_binding_bytes()
                )));
            }
        }
        Ok(())
    }

    /// A uniform buffer holding `data` (padded to 16 bytes).
    pub fn uniform(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let size = (data.len() as u64).max(16).next_multiple_of(16);
        let buffer = self.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.queue.write_buffer(&buffer, 0, data);
        buffer
    }

    /// Builds an op: `kernel` bound to the step uniform, its own params, then `storage` in binding order.
    pub fn op(
        &self,
        kernel: Kernel,
        step: &wgpu::Buffer,
        params: &wgpu::Buffer,
        storage: &[&wgpu::Buffer],
        grid: Grid,
    ) -> Op {
        let layout = self.pipelines.bind_group_layout(kernel);
        let mut entries = vec![
            wgpu::BindGroupEntry { binding: 0, resource: step.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 1, resource: params.as_entire_binding() },
        ];
        for (i, b) in storage.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry { binding: 2 + i as u32, resource: b.as_entire_binding() });
        }
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&format!("{kernel:?}")),
            layout: &layout,
            entries: &entries,
        });
        Op {
            kernel,
            bind_group,
            grid,
            cost: Cost::default(),
            serial: Serial::default(),
            lanes: self.matmul_lanes,
        }
    }

    /// As [`Gpu::op`], with a second uniform (binding 2) before the storage buffers.
    pub fn op_with_uniform(
        &self,
        kernel: Kernel,
        step: &wgpu::Buffer,
        params: &wgpu::Buffer,
        uniform: &wgpu::Buffer,
        storage: &[&wgpu::Buffer],
        grid: Grid,
    ) -> Op {
        let all: Vec<&wgpu::Buffer> = std::iter::once(uniform).chain(storage.iter().copied()).collect();
        self.op(kernel, step, params, &all, grid)
    }

    /// Records `ops` for a pass of `n` rows into one compute pass of `encoder`.
    pub fn encode(&self, encoder: &mut wgpu::CommandEncoder, ops: &[Op], n: u32) {
        let start = web_time::Instant::now();
        let mut dispatches = 0;
        let mut pass =
            encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
        for op in ops {
            let Some((wide, [x, y, z])) = self.dispatch(op, n) else {
                continue;
            };
            let narrow = || self.pipelines.get_with(op.kernel, op.lanes);
            let pipeline = match wide {
                true => self.pipelines.wide(op.kernel, op.lanes).unwrap_or_else(narrow),
                false => narrow(),
            };
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &op.bind_group, &[]);
            pass.dispatch_workgroups(x, y, z);
            dispatches += 1;
        }
        drop(pass);
        self.dispatches.fetch_add(dispatches, Ordering::Relaxed);
        self.count_host(start);
    }

    /// Adds the host time since `start` to [`RoundTrips::host_nanos`].
    fn count_host(&self, start: web_time::Instant) {
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.host_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// How `op` is dispatched in a pass of `n` rows: whether by its wide pipeline, and its
    /// workgroup counts (`None`: not at all, an empty grid).
    fn dispatch(&self, op: &Op, n: u32) -> Option<(bool, [u32; 3])> {
        let (wide, grid) = match (op.grid, self.pipelines.has_wide(op.kernel)) {
            // (GPUs) a pass of more rows than a matmul group takes: the pipeline whose groups
            // take WIDE_ROWS (the same bits for every row)
            (Grid::RowGroups { y, rows }, wide) => {
                let group = group_rows(rows, wide, n);
                (group != rows, Grid::RowGroups { y, rows: group })
            }
            (grid, _) => (false, grid),
        };
        let [x, y, z] = grid.counts(n);
        (x > 0 && y > 0 && z > 0).then_some((wide, [x, y, z]))
    }

    /// The shape facts of `op` in a pass of `n` rows whose last row sits at cache position `pos`
    /// (`None` where the pass dispatches none of it).
    pub fn shape(&self, op: &Op, n: usize, pos: usize) -> Option<OpShape> {
        let (_, [x, y, z]) = self.dispatch(op, n as u32)?;
        Some(OpShape {
            kernel: format!("{:?}", op.kernel),
            workgroups: x as u64 * y as u64 * z as u64,
            invocations: op.kernel.invocations(),
            serial_iterations: op.serial.at(pos as u64 + 1),
            bytes: op.cost.at(n as u64, pos as u64).0,
        })
    }

    /// A new command encoder.
    pub fn encoder(&self) -> wgpu::CommandEncoder {
        self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
    }

    /// Submits `encoder` after copying `bytes` bytes of `src` from `offset` (a multiple of 4) into a
    /// fresh read-back buffer, waits for the GPU and returns the bytes. One submission, one small map.
    pub async fn submit_and_read(
        &self,
        mut encoder: wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> Result<Vec<u8>> {
        let size = bytes.next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT).max(4);
        let staging = self.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        encoder.copy_buffer_to_buffer(src, offset, &staging, 0, size);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let start = web_time::Instant::now();
        self.queue.submit([encoder.finish()]);
        self.count_host(start);
        self.submits.fetch_add(1, Ordering::Relaxed);
        self.readbacks.fetch_add(1, Ordering::Relaxed);
        self.readback_bytes.fetch_add(bytes, Ordering::Relaxed);
        let (tx, rx) = futures_channel::oneshot::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        if let Some(err) = scope.pop().await {
            return Err(Error::Gpu(format!("validation: {err}")));
        }
        rx.await
            .map_err(|_| Error::Gpu("read-back cancelled".into()))?
            .map_err(|e| Error::Gpu(format!("mapping the read-back buffer: {e}")))?;
        // In a browser uncaptured errors arrive as events: by the time the map resolves, those of
        // the work before it (an allocation that failed while loading, ...) have been delivered.
        self.take_error()?;
        let view = staging.get_mapped_range(..).map_err(|e| Error::Gpu(format!("mapped range: {e}")))?;
        let mut out = view.to_vec();
        drop(view);
        staging.unmap();
        out.truncate(bytes as usize);
        Ok(out)
    }

    /// Submits `encoder` without reading anything back.
    pub fn submit(&self, encoder: wgpu::CommandEncoder) {
        let start = web_time::Instant::now();
        self.queue.submit([encoder.finish()]);
        self.count_host(start);
        self.submits.fetch_add(1, Ordering::Relaxed);
    }

    /// Submissions, read-backs and bytes read back on this GPU so far.
    pub fn round_trips(&self) -> RoundTrips {
        RoundTrips {
            submits: self.submits.load(Ordering::Relaxed),
            readbacks: self.readbacks.load(Ordering::Relaxed),
            readback_bytes: self.readback_bytes.load(Ordering::Relaxed),
            dispatches: self.dispatches.load(Ordering::Relaxed),
            host_nanos: self.host_nanos.load(Ordering::Relaxed),
        }
    }

    /// Native: blocks until the queue is idle and callbacks have run. Browser: the event loop does it.
    fn wait(&self) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("waiting for the GPU: {e}")))?;
        self.take_error()
    }

    /// The first GPU error that no error scope caught since the last call (out of memory while
    /// allocating, ...), as [`Error::Gpu`]; `Ok` when there was none. Loading and every read-back
    /// check it, so such an error fails the operation instead of the process.
    pub fn take_error(&self) -> Result<()> {
        match self.uncaptured.lock().ok().and_then(|mut first| first.take()) {
            Some(msg) => Err(Error::Gpu(msg)),
            None => Ok(()),
        }
    }

    /// Reads a whole buffer back (tests and debugging; the model reads through `submit_and_read`).
    pub async fn read_buffer(&self, src: &wgpu::Buffer) -> Result<Vec<u8>> {
        self.submit_and_read(self.encoder(), src, 0, src.size()).await
    }
}
