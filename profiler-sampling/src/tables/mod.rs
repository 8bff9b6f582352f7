//! Unwind tables in the BPF walker's arrays: the tables (built by the
//! profiler-unwind crate, with the runtimes' rows) loaded where the
//! sampling program's walker reads them. `store` loads each
//! object's table once per node into the BPF arrays (`arrays`), shared by
//! every process that maps it, within a memory bound; `service` runs the
//! building and loading on a thread of its own, off the sampling path.

mod allocator;
mod arrays;
mod service;
mod store;

pub use arrays::{ArrayError, MappedArray};
pub use service::{UnwindTables, table_mappings};
pub use store::{
    TableMapping, TableObject, TableStore, UnwindArrays, UnwindOccupancy, UnwindTableStats,
};
