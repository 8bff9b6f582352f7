//! What can go wrong while loading and attaching the probes' programs, in
//! words a user can act on (shared by the session and the stacks at hits).

use profiler_probes::attach::AttachError;

/// Why a latency session (or its stacks at hits) could not start.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(
        "latency probes need root, or the capabilities CAP_BPF and CAP_PERFMON \
         (`sudo setcap cap_bpf,cap_perfmon+ep $(which profiler-agent)`): {0}"
    )]
    Privileges(String),
    #[error("the kernel refused to load the latency BPF object: {0}")]
    Load(String),
    #[error("the kernel refused the BPF program {program}: {reason}")]
    Program {
        program: &'static str,
        reason: String,
    },
    #[error("BPF map {0}: {1}")]
    Map(&'static str, String),
    // The reason is in the message, not a `source` too: the CLI prints the
    // chain, which would say it twice.
    #[error("{site}: {reason}")]
    Attach { site: String, reason: AttachError },
    #[error("{0}")]
    Pmu(AttachError),
}
