//! Steps every BPF loader shares (the sampler, the latency probes, the
//! runtimes' glue): the memlock limit, and errors that keep aya's sources.

/// Lifts RLIMIT_MEMLOCK: kernels before 5.11 charge BPF maps to it, and a
/// low default makes map creation fail with EPERM. Newer kernels ignore it.
pub fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid struct; failure only matters on
    // old kernels, where loading reports it.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
}

/// The error and its sources on one line, so a verifier log or errno that
/// aya keeps in a source is not lost.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The system's page size: the smallest ring buffer (some arm64 kernels
/// use 64 KiB pages).
pub fn page_size() -> u32 {
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(page).unwrap_or(4096).max(4096)
}
