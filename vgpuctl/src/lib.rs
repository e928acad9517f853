//! The library half of `vgpuctl`: what the binary's commands are made of,
//! public so that benchmarks and tests can drive them.
//!
//! - [`cli`]: the clap declaration
//! - [`snapshot`]: the format-neutral model of a region, and the JSON schema
//! - [`read`]: one read-only reader per region layout
//! - [`scan`]: HAMi's and Volcano's containers directories
//! - [`housekeeping`]: removing the regions of gone pods (`serve`)
//! - [`table`]: the human table
//! - [`serve`]: the Prometheus exporter
//! - [`oversub`]: the node's oversubscription board, for `vgpuctl oversub`

pub mod cli;
pub mod housekeeping;
pub mod oversub;
pub mod read;
pub mod scan;
pub mod serve;
pub mod snapshot;
pub mod table;
