//! Types each language runtime's BPF walker shares with user space, one
//! module per runtime (its user-space home is profiler-runtimes).

pub mod go;
