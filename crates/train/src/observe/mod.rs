//! Observation: what a run writes and shows about itself, and the instruments that measure
//! the machine.
//!
//! - [`records`]: the records of `metrics.jsonl` and `samples.jsonl`; [`log`] writes them.
//! - [`progress`]: the progress line or bar; [`dashboard`]: burn-train's live dashboard.
//! - [`moe`]: the worst MoE layer of a step and the collapse warning.
//! - [`metrics`]: FLOPs per token, for MFU; [`peak`]: the peak FLOP/s it divides by.
//! - [`plot`]: PNG plots of runs; [`bench`]: the `bench` command's measurements.

pub mod bench;
pub mod dashboard;
pub mod log;
pub mod metrics;
pub mod moe;
pub mod peak;
pub mod plot;
pub mod progress;
pub mod records;
pub mod tensorboard;
