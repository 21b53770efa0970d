//! Typed storage buffers.

use std::marker::PhantomData;

use super::Gpu;

/// Marker for buffers of f16 values packed two per u32 (low half first), readable without `shader-f16`.
#[derive(Clone, Copy, Debug)]
pub struct PackedF16;

/// A storage buffer of `len` elements of `T` (`f32`, `u32` or [`PackedF16`]).
pub struct GpuBuffer<T> {
    pub raw: wgpu::Buffer,
    pub len: usize,
    _t: PhantomData<T>,
}

const STORAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

fn create(gpu: &Gpu, label: &str, bytes: u64) -> wgpu::Buffer {
    gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes.next_multiple_of(16).max(16),
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

impl GpuBuffer<PackedF16> {
    /// A buffer holding `data` as packed f16 pairs (an odd tail is padded with a zero).
    pub fn from_f16(gpu: &Gpu, label: &str, data: &[half::f16]) -> Self {
        let b =
            GpuBuffer { raw: create(gpu, label, data.len() as u64 * 2), len: data.len(), _t: PhantomData };
        let even = data.len() / 2 * 2;
        gpu.queue.write_buffer(&b.raw, 0, bytemuck::cast_slice(&data[..even]));
        if let Some(last) = data.get(even) {
            gpu.queue.write_buffer(&b.raw, even as u64 * 2, bytemuck::cast_slice(&[*last, half::f16::ZERO]));
        }
        b
    }
}
