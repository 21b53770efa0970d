//! The compute kernels: one `.wgsl` file per op, one pipeline per kernel, compiled on a device the
//! first time an op of it is built.

use std::borrow::Cow;
use std::sync::OnceLock;

use super::layout::{wgsl_constants, GpuStruct, Layout};
use crate::loader::DType;

/// Every compute kernel the crate runs. Each maps to one file in `shaders/`; the ops that read
/// weight matrices exist once per stored type (its `shaders/formats/` file is placed ahead of the
/// op's), the attention ops once per KV cache type (`shaders/kv/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    Embed(DType),
    Matmul(DType),
    /// The one-pass attention over a KV cache of this type (F32 or F16): one workgroup per query
    /// head and row (CPU adapters).
    Attention(DType),
    /// Attention split over the cache (GPUs): one chunk of keys per workgroup ...
    AttentionChunks(DType),
    /// ... and the chunks of each head and row combined.
    AttentionMerge,
    Argmax,
    AcceptGreedy,
    /// Draws from each row's sampling distribution (Gumbel-max) and scores drafted tokens.
    Sample,
    /// Speculative sampling's acceptance over [`Kernel::Sample`]'s rows.
    AcceptSampled,
    KvKeep,
    TopK,
    GatherRows,
    /// Per-head RMSNorm of q and k, RoPE, and q|k|v to their places (Qwen3's attention input).
    HeadNorm,
    /// A sub-block's output normed, then added to the residual stream (Gemma's post-norms).
    NormAdd,
    MapIds,
    EagleTree,
    Concat,
    /// Benchmarks only: the adapter's bandwidth ceiling.
    BenchCopy,
    /// Benchmarks only: the adapter's arithmetic ceiling.
    BenchFma,
}

/// Declares the kernels that do not read weight matrices once, in their order: the `PLAIN` table
/// and the match that gives each its place ([`Kernel::index`]), which must name every kernel
/// (the compiler refuses a kernel left without a place). The attention kernels exist once per
/// KV cache type (F32, F16).
macro_rules! plain_kernels {
    ($($slot:ident = $kernel:ident $(($kv:ident))?),+ $(,)?) => {
        /// A place in `PLAIN`, by name.
        #[derive(Clone, Copy)]
        enum Plain { $($slot),+ }

        /// The kernels that do not read weight matrices, in the order of [`Kernel::index`].
        const PLAIN: &[Kernel] = &[$(Kernel::$kernel $((DType::$kv))?),+];

        impl Kernel {
            /// The place in `PLAIN`; `None` for the kernels of a weight format (embed, matmul)
            /// and attention over a type no KV cache has.
            fn plain_index(self) -> Option<usize> {
                match self {
                    $(Kernel::$kernel $((DType::$kv))? => Some(Plain::$slot as usize),)+
                    Kernel::Embed(_) | Kernel::Matmul(_) | Kernel::Attention(_) | Kernel::AttentionChunks(_) => None,
                }
            }
        }
    };
}

plain_kernels! {
    AttentionF32 = Attention(F32),
    Argmax = Argmax,
    AcceptGreedy = AcceptGreedy,
    KvKeep = KvKeep,
    TopK = TopK,
    GatherRows = GatherRows,
    Concat = Concat,
    BenchCopy = BenchCopy,
    BenchFma = BenchFma,
    MapIds = MapIds,
    EagleTree = EagleTree,
    AttentionChunksF32 = AttentionChunks(F32),
    AttentionMerge = AttentionMerge,
    Sample = Sample,
    AcceptSampled = AcceptSampled,
    AttentionF16 = Attention(F16),
    AttentionChunksF16 = AttentionChunks(F16),
    HeadNorm = HeadNorm,
    NormAdd = NormAdd,
}

impl Kernel {
    /// All kernels, in a fixed order (the index into the pipeline table): embed and matmul per
    /// weight format, then `PLAIN`.
    pub fn all() -> Vec<Kernel> {
        let mut all = Vec::with_capacity(PLAIN.len() + 2 * DType::ALL.len());
        all.extend(DType::ALL.map(Kernel::Embed));
        all.extend(DType::ALL.map(Kernel::Matmul));
        all.extend(PLAIN);
        all
    }

    /// Position of this kernel in [`Kernel::all`] (attention over a type no KV cache has: the
    /// F32 cache's kernel, as [`super::ops`] never asks for one).
    pub fn index(self) -> usize {
        let formats = DType::ALL.len();
        let f = |w: DType| DType::ALL.iter().position(|x| *x == w).unwrap_or(0);
        let plain = |p: Plain| 2 * formats + p as usize;
        match (self, self.plain_index()) {
            (Kernel::Embed(w), _) => f(w),
            (Kernel::Matmul(w), _) => formats + f(w),
            (_, Some(i)) => 2 * formats + i,
            (Kernel::AttentionChunks(_), None) => plain(Plain::AttentionChunksF32),
            (_, None) => plain(Plain::AttentionF32),
        }
    }

    /// The kernel's WGSL source: the op's file, preceded by its weight format's or KV cache's file
    /// if it has one (and the matmul and the one-pass attention by a file of `shaders/share/`:
    /// with `shuffle`, a subgroup shares the loads its invocations all need by shuffles; the
    /// argmax and the top-k by `shaders/share/rank.wgsl`).
    pub fn source(self, shuffle: bool) -> Cow<'static, str> {
        // the uniform structs and host constants, declared in Rust ahead of every op's file
        let prelude = self.prelude();
        // where the pass's rows sit (shaders/share/rows.wgsl), for the ops that place rows
        let rows = if self.places_rows() { include_str!("../../shaders/share/rows.wgsl") } else { "" };
        Cow::Owned(format!("{prelude}\n{rows}\n{}", self.file_source(shuffle)))
    }

    /// Whether the op places its rows at their positions or cache rows (RoPE, the KV cache, the
    /// attention, a draw's noise): its source gets shaders/share/rows.wgsl.
    fn places_rows(self) -> bool {
        matches!(
            self,
            Kernel::Matmul(_)
                | Kernel::HeadNorm
                | Kernel::Attention(_)
                | Kernel::AttentionChunks(_)
                | Kernel::AttentionMerge
                | Kernel::Sample
        )
    }

    /// The uniform structs the kernel binds, as their Rust declarations lay them out (declared
    /// once: [`super::layout`]): [`Step`](super::Step) at binding 0, its parameters at 1, and
    /// (the draws) [`SampleSeed`](super::SampleSeed) at 2.
    pub(crate) fn uniforms(self) -> Vec<Layout> {
        use super::ops::*;
        use super::roofline::{BenchCopyParams, BenchFmaParams};
        let params = match self {
            Kernel::Embed(_) => EmbedParams::layout(),
            Kernel::Matmul(_) => MatmulParams::layout(),
            Kernel::Attention(_) => AttentionParams::layout(),
            Kernel::AttentionChunks(_) => ChunksParams::layout(),
            Kernel::AttentionMerge => MergeParams::layout(),
            Kernel::Argmax => ArgmaxParams::layout(),
            Kernel::AcceptGreedy => AcceptParams::layout(),
            Kernel::Sample => SampleParams::layout(),
            Kernel::AcceptSampled => AcceptSampledParams::layout(),
            Kernel::KvKeep => KeepParams::layout(),
            Kernel::TopK => TopKParams::layout(),
            Kernel::GatherRows => GatherParams::layout(),
            Kernel::HeadNorm => HeadNormParams::layout(),
            Kernel::NormAdd => NormAddParams::layout(),
            Kernel::MapIds => MapIdsParams::layout(),
            Kernel::EagleTree => EagleTreeParams::layout(),
            Kernel::Concat => ConcatParams::layout(),
            Kernel::BenchCopy => BenchCopyParams::layout(),
            Kernel::BenchFma => BenchFmaParams::layout(),
        };
        let mut all = vec![Step::layout(), params];
        if self == Kernel::Sample {
            all.push(SampleSeed::layout());
        }
        all
    }

    /// The WGSL ahead of the kernel's files: its uniform structs, and the host's constants its
    /// source must agree with (the slice of logits a workgroup of the argmax's, top-k's and
    /// sampling's slice stages takes, which the host sizes their grids by; the EAGLE tree's output offsets and
    /// modes).
    fn prelude(self) -> String {
        use super::ops::*;
        let mut s: String = self.uniforms().iter().map(Layout::wgsl).collect();
        if matches!(self, Kernel::Argmax | Kernel::TopK | Kernel::Sample) {
            s.push_str(&wgsl_constants(&[("SLICE", REDUCE_SLICE as u64)]));
        }
        if matches!(self, Kernel::Attention(_) | Kernel::AttentionChunks(_)) {
            s.push_str(&wgsl_constants(&[("PAGE", KV_PAGE as u64)]));
        }
        if matches!(self, Kernel::Attention(_)) {
            s.push_str(&wgsl_constants(&[("HB", ONE_PASS_HEAD_BLOCK as u64)]));
        }
        if self == Kernel::EagleTree {
            s.push_str(&wgsl_constants(&[
                ("O_STEP", EAGLE_TREE_STEP),
                ("O_MANY", EAGLE_TREE_MANY),
                ("O_SLOTS", EAGLE_TREE_SLOTS),
                ("O_NEWEST", EAGLE_TREE_NEWEST),
                ("O_TOKENS", EAGLE_TREE_TOKENS),
                ("O_RESULT", EAGLE_TREE_RESULT),
                ("STATE_WORDS", EAGLE_TREE_STATE as u64),
                ("OUT_WORDS", EAGLE_TREE_OUT as u64),
                ("START", EagleTreeMode::START as u64),
                ("EXPAND", EagleTreeMode::EXPAND as u64),
                ("FINISH", EagleTreeMode::FINISH as u64),
            ]));
        }
        s
    }

    /// The op's file, preceded by its weight format's or KV cache's file if it has one (see
    /// [`Kernel::source`]).
    fn file_source(self, shuffle: bool) -> Cow<'static, str> {
        let with_format = |w: DType, op: &str| Cow::Owned(format!("{}\n{op}", w.format_source()));
        // the KV cache's format file (shaders/kv/) and its page table ahead of an attention op
        let with_kv = |kv: DType, op: &str| {
            let format = match kv {
                DType::F16 => include_str!("../../shaders/kv/f16.wgsl"),
                _ => include_str!("../../shaders/kv/f32.wgsl"),
            };
            let pages = include_str!("../../shaders/kv/pages.wgsl");
            Cow::Owned(format!("{format}\n{pages}\n{op}"))
        };
        // the argmax's and top-k's order and pick (shaders/share/rank.wgsl)
        let with_rank = |op: &str| {
            let rank = include_str!("../../shaders/share/rank.wgsl");
            Cow::Owned(format!("{rank}\n{op}"))
        };
        // shaders/share/dot.wgsl: a dot product no compiler can contract differently
        const DOT: &str = include_str!("../../shaders/share/dot.wgsl");
        // shaders/share/: whether a subgroup shares the loads its invocations all need
        let share = if shuffle {
            include_str!("../../shaders/share/shuffle.wgsl")
        } else {
            include_str!("../../shaders/share/load.wgsl")
        };
        match self {
            Kernel::Embed(w) => with_format(w, include_str!("../../shaders/embed.wgsl")),
            Kernel::Matmul(w) => {
                with_format(w, &format!("{share}\n{}", include_str!("../../shaders/matmul.wgsl")))
            }
            Kernel::Attention(kv) => {
                with_kv(kv, &format!("{share}\n{DOT}\n{}", include_str!("../../shaders/attention.wgsl")))
            }
            Kernel::AttentionChunks(kv) => {
                with_kv(kv, &format!("{DOT}\n{}", include_str!("../../shaders/attention_chunks.wgsl")))
            }
            Kernel::AttentionMerge => Cow::Borrowed(include_str!("../../shaders/attention_merge.wgsl")),
            Kernel::Argmax => with_rank(include_str!("../../shaders/argmax.wgsl")),
            Kernel::AcceptGreedy => Cow::Borrowed(include_str!("../../shaders/accept_greedy.wgsl")),
            Kernel::Sample => Cow::Borrowed(include_str!("../../shaders/sample.wgsl")),
            Kernel::AcceptSampled => Cow::Borrowed(include_str!("../../shaders/accept_sampled.wgsl")),
            Kernel::KvKeep => Cow::Borrowed(include_str!("../../shaders/kv_keep.wgsl")),
            Kernel::TopK => with_rank(include_str!("../../shaders/top_k.wgsl")),
            Kernel::GatherRows => Cow::Borrowed(include_str!("../../shaders/gather_rows.wgsl")),
            Kernel::HeadNorm => Cow::Borrowed(include_str!("../../shaders/head_norm.wgsl")),
            Kernel::NormAdd => Cow::Borrowed(include_str!("../../shaders/norm_add.wgsl")),
            Kernel::MapIds => Cow::Borrowed(include_str!("../../shaders/map_ids.wgsl")),
            Kernel::EagleTree => Cow::Borrowed(include_str!("../../shaders/eagle_tree.wgsl")),
            Kernel::Concat => Cow::Borrowed(include_str!("../../shaders/concat.wgsl")),
            Kernel::BenchCopy => Cow::Borrowed(include_str!("../../shaders/bench_copy.wgsl")),
            Kernel::BenchFma => Cow::Borrowed(include_str!("../../shaders/bench_fma.wgsl")),
        }
    }

    /// Threads per workgroup along x (every kernel uses 64 but [`Kernel::EagleTree`], 256).
    pub const WORKGROUP: u32 = 64;

    /// The invocations of one of its workgroups, as its source declares them
    /// (`@workgroup_size(N)`, or the value of the constant N names).
    pub fn invocations(self) -> u32 {
        static TABLE: OnceLock<Vec<u32>> = OnceLock::new();
        let table = TABLE
            .get_or_init(|| Kernel::all().into_iter().map(|k| workgroup_size(&k.source(false))).collect());
        table.get(self.index()).copied().unwrap_or(Kernel::WORKGROUP)
    }

    /// The largest workgroup of any kernel ([`Kernel::EagleTree`]'s 256, WebGPU's default limit).
    pub const LARGEST_WORKGROUP: u32 = 256;
}

/// The x size of the entry point's `@workgroup_size` in a kernel's WGSL: a number, or a constant
/// (`const WG: u32 = 64u;`) of the source; 0 where neither is found.
fn workgroup_size(source: &str) -> u32 {
    let number = |text: &str| text.trim().trim_end_matches('u').parse::<u32>().ok();
    let Some(after) = source.split("@workgroup_size(").nth(1) else {
        return 0;
    };
    let arg = after.split([')', ',']).next().unwrap_or("").trim();
    number(arg)
        .or_else(|| {
            let decl = format!("const {arg}: u32 =");
            let value = source.split(decl.as_str()).nth(1)?.split(';').next()?;
            number(value)
        })
        .unwrap_or(0)
}

/// Rows of a pass one workgroup of the GPUs' second matmul pipeline takes: a verify pass or a
/// tree of up to 16 rows reads each weight once (with 4-row groups a 5-row pass read them twice,
/// a 16-row pass four times).
pub const WIDE_ROWS: u32 = 16;

/// Rows of a pass one matmul workgroup takes (`ROWS` in `shaders/matmul.wgsl`) with `lanes`
/// invocations per column quad: 8 with one (CPU adapters), 4 on GPUs, where the wider branches
/// would hold registers that a decode step's occupancy needs. GPUs run passes of more rows with
/// a second pipeline of [`WIDE_ROWS`] ([`Pipelines::wide`]).
pub fn matmul_rows(lanes: u32) -> u32 {
    if lanes == 1 {
        8
    } else {
        4
    }
}

/// Workgroups a matmul that moves weights aims for on a GPU: two waves of a 132-SM GPU (an H100
/// or H200), one workgroup resident per SM at the least ([`matmul_lanes`]).
pub const MATMUL_WORKGROUPS: usize = 264;

/// The most matmul invocations per column quad (the whole workgroup: 4 columns per workgroup).
pub const MAX_MATMUL_LANES: u32 = Kernel::WORKGROUP;

/// Matmul invocations per column quad (`LANES`) for a weight matrix of `cols` rows (output
/// columns) and `units` 32-weight units per row, on a device whose matmul has `base` lanes: on
/// CPU adapters (`base` 1) always 1; on GPUs `base` (16), doubled up to [`MAX_MATMUL_LANES`] while
/// the grid has fewer than [`MATMUL_WORKGROUPS`] column tiles and the row has more units than
/// lanes (so more than half the doubled lanes have a unit: 48 units take 64 lanes, 16 of them
/// idle). A narrow matrix then launches more, narrower workgroups, each lane walking fewer
/// units (Qwen2.5-1.5B's q|k|v, `wo` and `down`: 96-128 workgroups of 16 columns become 384-512 of
/// 4). The lanes depend on the matrix and the device only, never on the rows of a pass, so a row's
/// bits do not either (the lanes' fixed tree is part of the sum's order).
pub fn matmul_lanes(base: u32, cols: usize, units: usize) -> u32 {
    let mut lanes = base;
    if lanes <= 1 {
        return lanes;
    }
    while lanes < MAX_MATMUL_LANES
        && (lanes as usize) < units
        && cols.div_ceil(matmul_columns_per_group(lanes)) < MATMUL_WORKGROUPS
    {
        lanes *= 2;
    }
    lanes
}

/// Output columns one matmul workgroup computes with `lanes` invocations per column quad (4 per
/// quad, 64 / lanes quads).
pub const fn matmul_columns_per_group(lanes: u32) -> usize {
    (4 * Kernel::WORKGROUP / lanes) as usize
}

/// Rows whose blocks a weight buffer interleaves (`GROUP` in
/// `shaders/formats/interleave.wgsl`) with `lanes` matmul invocations per column quad: 8 on CPU
/// adapters (lanes 1), whose invocations walk the blocks of four rows in step (two of them one
/// run); 1 on GPUs, rows in order. On lavapipe a decode step of Qwen2.5-Coder-1.5B took 8% less
/// time (BENCHMARKS.md, session 18): the loads move forward through memory, which the CPU
/// prefetches.
pub const fn row_group(lanes: u32) -> u32 {
    if lanes == 1 {
        8
    } else {
        1
    }
}

/// The pipelines of every [`Kernel`], each compiled the first time an op of it is built
/// ([`Pipelines::get`]): a device compiles the kernels its models use, not all of them. A model
/// of one weight format needs 2 of the 10 formats' matmuls, and a CPU adapter in a browser
/// (SwiftShader) spent about 17 seconds compiling all of them before each load.
pub struct Pipelines {
    device: wgpu::Device,
    /// The matmul's `LANES` override.
    matmul_lanes: u32,
    /// Whether the matmul and the one-pass attention share loads by subgroup shuffles.
    shuffle: bool,
    /// (GPUs) the matmuls' bindings, spelled out: an op's bind group serves every pipeline of a
    /// format (its lanes, narrow and wide; a layout a pipeline derives itself serves that
    /// pipeline only).
    matmul_layout: Option<(wgpu::BindGroupLayout, wgpu::PipelineLayout)>,
    /// Each kernel's pipelines once compiled, at [`Kernel::index`], then at log2 of the
    /// matmul's lanes ([`matmul_lanes`]; other kernels at 0).
    table: Vec<[OnceLock<Compiled>; LANE_SLOTS]>,
}

/// Lanes 1, 2, 4, .. [`MAX_MATMUL_LANES`]: one pipeline slot each.
const LANE_SLOTS: usize = MAX_MATMUL_LANES.ilog2() as usize + 1;

/// One kernel's pipelines.
struct Compiled {
    pipeline: wgpu::ComputePipeline,
    /// (GPUs, matmuls) the same module with groups of [`WIDE_ROWS`] rows ([`Pipelines::wide`]).
    wide: Option<wgpu::ComputePipeline>,
}

impl Pipelines {
    /// Pipelines of `device`, none compiled yet. `matmul_lanes` sets the matmul's invocations per
    /// column (its `LANES` override), `shuffle` the sharing of loads by subgroup shuffles in the
    /// matmul and the one-pass attention (the device must have [`wgpu::Features::SUBGROUP`]).
    pub fn new(device: &wgpu::Device, matmul_lanes: u32, shuffle: bool) -> Pipelines {
        Pipelines {
            device: device.clone(),
            matmul_lanes,
            shuffle,
            matmul_layout: (matmul_lanes > 1).then(|| matmul_layout(device)),
            table: Kernel::all().iter().map(|_| std::array::from_fn(|_| OnceLock::new())).collect(),
        }
    }

    /// The pipeline of `kernel` (a matmul: with the device's own lanes), compiled on first use
    /// (its errors go to the error scopes open then: `Gpu::build_scope`, or else the device's
    /// uncaptured errors).
    pub fn get(&self, kernel: Kernel) -> &wgpu::ComputePipeline {
        self.get_with(kernel, self.matmul_lanes)
    }

    /// As [`Pipelines::get`], a matmul's with `lanes` invocations per column quad (a power of
    /// two from the device's lanes to [`MAX_MATMUL_LANES`]; other kernels ignore it).
    pub fn get_with(&self, kernel: Kernel, lanes: u32) -> &wgpu::ComputePipeline {
        &self.compiled(kernel, lanes).pipeline
    }

    /// (GPUs) The matmul pipeline of `kernel` with `lanes` whose workgroups take [`WIDE_ROWS`]
    /// rows, if the device has one.
    pub fn wide(&self, kernel: Kernel, lanes: u32) -> Option<&wgpu::ComputePipeline> {
        match kernel {
            Kernel::Matmul(_) => self.compiled(kernel, lanes).wide.as_ref(),
            _ => None,
        }
    }

    /// The layout of `kernel`'s bindings (a matmul's on GPUs: the one all its pipelines share,
    /// without compiling any).
    pub fn bind_group_layout(&self, kernel: Kernel) -> wgpu::BindGroupLayout {
        match (kernel, &self.matmul_layout) {
            (Kernel::Matmul(_), Some((bindings, _))) => bindings.clone(),
            _ => self.get(kernel).get_bind_group_layout(0),
        }
    }

    /// Every lane count a matmul of this device may be given ([`matmul_lanes`]): the device's
    /// own, and on GPUs each doubling up to [`MAX_MATMUL_LANES`].
    pub fn matmul_lane_counts(&self) -> Vec<u32> {
        (0..LANE_SLOTS).map(|i| 1 << i).filter(|&l| self.has_lanes(l)).collect()
    }

    /// Whether `lanes` is one of [`Pipelines::matmul_lane_counts`].
    fn has_lanes(&self, lanes: u32) -> bool {
        let base = self.matmul_lanes;
        lanes.is_power_of_two() && (base..=MAX_MATMUL_LANES).contains(&lanes) && (base > 1 || lanes == 1)
    }

    /// Whether `kernel` has a [`Pipelines::wide`] pipeline on this device (without compiling it).
    pub fn has_wide(&self, kernel: Kernel) -> bool {
        matches!(kernel, Kernel::Matmul(_)) && self.matmul_wide()
    }

    /// Whether the matmuls have [`Pipelines::wide`] pipelines on this device (GPUs).
    pub fn matmul_wide(&self) -> bool {
        self.matmul_layout.is_some()
    }

    /// The kernels compiled so far (any of their pipelines), in [`Kernel::all`]'s order.
    pub fn compiled_kernels(&self) -> Vec<Kernel> {
        Kernel::all()
            .into_iter()
            .filter(|k| self.table[k.index()].iter().any(|slot| slot.get().is_some()))
            .collect()
    }

    /// The matmul lanes of `kernel` at `lanes` (the device's own where `lanes` is none of this
    /// device's; other kernels: their one slot)
    fn compiled(&self, kernel: Kernel, lanes: u32) -> &Compiled {
        let own = self.has_lanes(lanes);
        debug_assert!(
            own || !matches!(kernel, Kernel::Matmul(_)),
            "matmul lanes {lanes} on a device of {}",
            self.matmul_lanes
        );
        let lanes = match kernel {
            Kernel::Matmul(_) if own => lanes,
            Kernel::Matmul(_) => self.matmul_lanes,
            _ => 1,
        };
        self.table[kernel.index()][lanes.ilog2() as usize].get_or_init(|| self.compile(kernel, lanes))
    }

    fn compile(&self, kernel: Kernel, lanes: u32) -> Compiled {
        let group = ("GROUP", row_group(self.matmul_lanes) as f64);
        let matmul = |rows: u32| {
            [
                ("LANES", lanes as f64),
                ("ROWS", rows as f64),
                ("PARTIAL", (Kernel::WORKGROUP * rows.min(8)) as f64),
                ("SQUARES", (Kernel::WORKGROUP * rows / 4) as f64),
                group,
            ]
        };
        let narrow = matmul(matmul_rows(self.matmul_lanes));
        let (constants, layout): (&[(&str, f64)], _) = match kernel {
            Kernel::Matmul(_) => (&narrow, self.matmul_layout.as_ref().map(|(_, layout)| layout)),
            Kernel::Embed(_) => (std::slice::from_ref(&group), None),
            _ => (&[], None),
        };
        let label = match kernel {
            Kernel::Matmul(_) if lanes != self.matmul_lanes => format!("{kernel:?} lanes {lanes}"),
            _ => format!("{kernel:?}"),
        };
        let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(kernel.source(self.shuffle)),
        });
        let pipeline = self.pipeline(&label, &module, constants, layout);
        // (GPUs) the same module, its 16-row groups: Pipelines::wide
        let wide = match (kernel, layout) {
            (Kernel::Matmul(_), Some(layout)) => {
                Some(self.pipeline(&format!("{label} wide"), &module, &matmul(WIDE_ROWS), Some(layout)))
            }
            _ => None,
        };
        Compiled { pipeline, wide }
    }

    /// The pipeline `label` of `module` with these override `constants` (and `layout`, else its own).
    fn pipeline(
        &self,
        label: &str,
        module: &wgpu::ShaderModule,
        constants: &[(&str, f64)],
        layout: Option<&wgpu::PipelineLayout>,
    ) -> wgpu::ComputePipeline {
        self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout,
            module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants,
                // Every kernel writes its workgroup memory before reading it.
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        })
    }
}

/// The bindings of `shaders/matmul.wgsl`: the step and the params (uniforms), then its storage
/// buffers in binding order (x, w, bias, y, second, cos_sin, x_raw, gamma), y and second written.
fn matmul_layout(device: &wgpu::Device) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
    let entry = |binding: u32, ty: wgpu::BufferBindingType| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer { ty, has_dynamic_offset: false, min_binding_size: None },
        count: None,
    };
    let storage = |binding: u32, written: bool| {
        entry(binding, wgpu::BufferBindingType::Storage { read_only: !written })
    };
    let entries = [
        entry(0, wgpu::BufferBindingType::Uniform),
        entry(1, wgpu::BufferBindingType::Uniform),
        storage(2, false),
        storage(3, false),
        storage(4, false),
        storage(5, true),
        storage(6, true),
        storage(7, false),
        storage(8, false),
        storage(9, false),
    ];
    let bind_group_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("matmul bindings"),
        entries: &entries,
    });
    let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some("matmul"),
        bind_group_layouts: &[Some(&bind_group_layout)],
        immediate_size: 0,
    });
    (bind_group_layout, layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_declares_its_workgroup() {
        for k in Kernel::all() {
            let want = match k {
                Kernel::EagleTree => 256,
                _ => Kernel::WORKGROUP,
            };
            assert_eq!(k.invocations(), want, "{k:?}");
        }
        assert_eq!(workgroup_size("const WG: u32 = 64u;\n@compute @workgroup_size(WG)\nfn main() {}"), 64);
        assert_eq!(workgroup_size("@compute @workgroup_size(8, 8)"), 8);
    }

    #[test]
    fn narrow_matrices_take_more_lanes_while_their_units_outnumber_them() {
        // (base lanes, columns, units per row) -> lanes: Qwen2.5-1.5B's q|k|v (2,048 x 1,536),
        // wo, down (1,536 x 8,960), gate|up (17,920 columns: wide enough); Qwen2.5-0.5B's down
        // (896 columns: 224 workgroups of 4, as many as 4-column tiles give); Llama-3.1-8B's wo
        // (4,096: 256 workgroups of 16, 512 of 8); a tiny matrix of 8 units; CPU adapters.
        let cases = [
            ((16, 2048, 48), 64),
            ((16, 1536, 48), 64),
            ((16, 1536, 280), 64),
            ((16, 17_920, 48), 16),
            ((16, 896, 152), 64),
            ((16, 4096, 128), 32),
            ((16, 64, 8), 16),
            ((16, 64, 24), 32),
            ((1, 64, 280), 1),
            ((64, 64, 280), 64),
        ];
        for ((base, cols, units), want) in cases {
            let lanes = matmul_lanes(base, cols, units);
            assert_eq!(lanes, want, "{cols} columns of {units} units on {base} lanes");
            let groups = cols.div_ceil(matmul_columns_per_group(lanes));
            if lanes < MAX_MATMUL_LANES && lanes > base {
                assert!(groups >= MATMUL_WORKGROUPS || lanes as usize >= units, "{cols}: {groups} groups");
            }
        }
    }

    #[test]
    fn every_kernel_sits_at_its_index() {
        for (i, k) in Kernel::all().into_iter().enumerate() {
            assert_eq!(k.index(), i, "{k:?}");
        }
    }
}
