//! The compute kernels: one `.wgsl` file per op, one pipeline per kernel, built once per device.

use crate::error::{Error, Result};

/// Every compute kernel the crate runs. Each maps to one file in `shaders/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    EmbedF32,
    EmbedF16,
    RmsNorm,
    MatmulF32,
    MatmulF16,
    Rope,
    Attention,
    SiluMul,
    Add,
    Argmax,
}

impl Kernel {
    /// All kernels, in a fixed order (the index into the pipeline table).
    pub const ALL: [Kernel; 10] = [
        Kernel::EmbedF32,
        Kernel::EmbedF16,
        Kernel::RmsNorm,
        Kernel::MatmulF32,
        Kernel::MatmulF16,
        Kernel::Rope,
        Kernel::Attention,
        Kernel::SiluMul,
        Kernel::Add,
        Kernel::Argmax,
    ];

    /// Position of this kernel in [`Kernel::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The kernel's WGSL source.
    pub fn source(self) -> &'static str {
        match self {
            Kernel::EmbedF32 => include_str!("../../shaders/embed_f32.wgsl"),
            Kernel::EmbedF16 => include_str!("../../shaders/embed_f16.wgsl"),
            Kernel::RmsNorm => include_str!("../../shaders/rmsnorm.wgsl"),
            Kernel::MatmulF32 => include_str!("../../shaders/matmul_f32.wgsl"),
            Kernel::MatmulF16 => include_str!("../../shaders/matmul_f16.wgsl"),
            Kernel::Rope => include_str!("../../shaders/rope.wgsl"),
            Kernel::Attention => include_str!("../../shaders/attention.wgsl"),
            Kernel::SiluMul => include_str!("../../shaders/silu_mul.wgsl"),
            Kernel::Add => include_str!("../../shaders/add.wgsl"),
            Kernel::Argmax => include_str!("../../shaders/argmax.wgsl"),
        }
    }

    /// Threads per workgroup along x (every kernel uses 64).
    pub const WORKGROUP: u32 = 64;
}

/// Compiled pipelines for every [`Kernel`], built once when the device is created.
pub struct Pipelines {
    table: Vec<wgpu::ComputePipeline>,
}

impl Pipelines {
    /// Compiles every kernel. Shader errors surface as [`Error::Gpu`] naming the kernel.
    pub async fn build(device: &wgpu::Device) -> Result<Pipelines> {
        let mut table = Vec::with_capacity(Kernel::ALL.len());
        for kernel in Kernel::ALL {
            let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&format!("{kernel:?}")),
                source: wgpu::ShaderSource::Wgsl(kernel.source().into()),
            });
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&format!("{kernel:?}")),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
            if let Some(err) = scope.pop().await {
                return Err(Error::Gpu(format!("kernel {kernel:?} failed to build: {err}")));
            }
            table.push(pipeline);
        }
        Ok(Pipelines { table })
    }

    /// The pipeline of `kernel`.
    pub fn get(&self, kernel: Kernel) -> &wgpu::ComputePipeline {
        &self.table[kernel.index()]
    }
}
