//! Unwinding in the agent: the tables (built by the profiler-unwind crate,
//! re-exported here) loaded into the BPF walker's arrays. `store` loads each
//! object's table once per node into the BPF arrays (`arrays`), shared by
//! every process that maps it, within a memory bound; `service` runs the
//! building and loading on a thread of its own, off the sampling path.

mod allocator;
mod arrays;
mod service;
mod store;

pub use profiler_unwind::*;

pub use arrays::{ArrayError, MappedArray};
pub use service::{UnwindTables, table_mappings};
pub use store::{
    TableMapping, TableObject, TableStore, UnwindArrays, UnwindOccupancy, UnwindTableStats,
};
