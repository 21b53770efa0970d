//! The transformer: config, checkpoint access, weights on the GPU, the forward pass; random-weight
//! models of real shapes ([`synthetic`]).

pub mod checkpoint;
pub mod config;
pub mod eagle;
pub mod medusa;
pub mod synthetic;
pub mod transformer;
pub mod weights;

pub use checkpoint::{Checkpoint, HostData, HostTensor, Precision};
pub use config::{Arch, Config, RopeScaling};
pub use eagle::{
    DraftedTree, EagleHead, EagleLayout, HeadChain, HeadRows, Ranked, TreeShape, EAGLE_STORE_SLOTS,
    MAX_EAGLE_DEPTH, MAX_EAGLE_WIDTH,
};
pub use medusa::{MedusaConfig, MedusaHeads, MAX_MEDUSA_HEADS, MEDUSA_ROWS};
pub use transformer::{
    LoadOptions, MemoryBill, Model, OpProfile, SeqRows, DEFAULT_READ_BYTES, MAX_BATCH, MAX_PASSES,
};
pub use weights::{LayerTensors, LoadProgress, Matrix, TensorRole, TensorSpec, TensorTable, Weights};
