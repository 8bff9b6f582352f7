//! Checks, before touching the kernel, that this process may load BPF
//! programs and open system-wide perf events, so the user reads "needs
//! CAP_BPF" instead of a bare EPERM.

use super::SamplingError;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Ok when the effective capabilities allow loading the sampler: root's full
/// set, CAP_SYS_ADMIN, or CAP_BPF together with CAP_PERFMON (Linux ≥ 5.8).
pub fn check_privileges() -> Result<(), SamplingError> {
    let effective = effective_capabilities().unwrap_or(0);
    let has = |cap: u32| effective & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let mut have: Vec<&str> = Vec::new();
    if has(CAP_BPF) {
        have.push("CAP_BPF");
    }
    if has(CAP_PERFMON) {
        have.push("CAP_PERFMON");
    }
    let have = if have.is_empty() {
        "neither".to_string()
    } else {
        format!("only {}", have.join(" and "))
    };
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string());
    Err(SamplingError::Privileges { have, paranoid })
}

/// The `CapEff` bit set from /proc/self/status.
fn effective_capabilities() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_cap_eff(&status)
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_effective_capabilities() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(parse_cap_eff(status), Some(0x1ff_ffff_ffff));
        assert_eq!(parse_cap_eff("Name: x\n"), None);
    }
}
