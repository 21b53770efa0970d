//! Typed storage buffers.

use std::marker::PhantomData;

use super::Gpu;

/// A storage buffer of `len` elements of `T` (`f32` or `u32`).
pub struct GpuBuffer<T> {
    pub raw: wgpu::Buffer,
    pub len: usize,
    _t: PhantomData<T>,
}

const STORAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

/// The bytes a buffer of `bytes` takes on the device: rounded up to 16, at least 16 (what
/// [`GpuBuffer`]'s allocations, and the memory bills counting them, use).
pub fn allocated_bytes(bytes: u64) -> u64 {
    bytes.next_multiple_of(16).max(16)
}

/// The bytes a table of buffers takes on the device: each row `(label, 4-byte words, how many
/// buffers)` as [`allocated_bytes`] rounds it (a memory bill's one sum).
pub fn table_bytes(table: &[(&str, usize, usize)]) -> u64 {
    table.iter().map(|&(_, words, count)| allocated_bytes(4 * words as u64) * count as u64).sum()
}

fn create(gpu: &Gpu, label: &str, bytes: u64) -> wgpu::Buffer {
    gpu.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: allocated_bytes(bytes),
        usage: STORAGE,
        mapped_at_creation: false,
    })
}

impl GpuBuffer<f32> {
    /// A zeroed buffer of `len` f32.
    pub fn zeros(gpu: &Gpu, label: &str, len: usize) -> Self {
        GpuBuffer { raw: create(gpu, label, len as u64 * 4), len, _t: PhantomData }
    }
    /// A buffer holding `data`.
    pub fn from_slice(gpu: &Gpu, label: &str, data: &[f32]) -> Self {
        let b = Self::zeros(gpu, label, data.len());
        gpu.queue.write_buffer(&b.raw, 0, bytemuck::cast_slice(data));
        b
    }
}

impl GpuBuffer<u32> {
    /// A zeroed buffer of `len` u32.
    pub fn zeros(gpu: &Gpu, label: &str, len: usize) -> Self {
        GpuBuffer { raw: create(gpu, label, len as u64 * 4), len, _t: PhantomData }
    }
    /// A buffer holding `data`.
    pub fn from_slice(gpu: &Gpu, label: &str, data: &[u32]) -> Self {
        let b = Self::zeros(gpu, label, data.len());
        gpu.queue.write_buffer(&b.raw, 0, bytemuck::cast_slice(data));
        b
    }
}
