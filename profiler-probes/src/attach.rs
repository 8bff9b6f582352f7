//! Attaching a loaded BPF program to a uprobe we open ourselves.
//!
//! aya 0.14 cannot pass a uprobe's `ref_ctr_offset`, and without it the
//! kernel does not raise a USDT probe's semaphore, so semaphore-guarded
//! probes (all of Python's, PostgreSQL's) never fire. We open the perf
//! event ourselves (Linux ≥ 4.20 reads `config = ref_ctr_offset << 32 |
//! retprobe_bit`, `config1` = path, `config2` = file offset; see
//! kernel/events/core.c `perf_uprobe_init` and PROBES.md), attach the
//! aya-loaded program with `BPF_LINK_CREATE` on the perf event, and enable
//! it.
//!
//! `BPF_LINK_CREATE` (Linux ≥ 5.15) instead of `PERF_EVENT_IOC_SET_BPF`:
//! the two attach the program to the event the same way
//! (`perf_event_set_bpf_prog`), but only the link carries a BPF cookie, and
//! the cookie tells our one program which probe site fired (each USDT site
//! has its own argument locations).
//!
//! Scope (kernel/trace/trace_uprobe.c, `uprobe_perf_filter`): with a pid,
//! the event fires for every thread sharing that process's mm; with pid
//! -1 (which perf requires to come with a cpu, any cpu: the BPF program of
//! a uprobe runs on whichever CPU hits it), it fires in every process that
//! maps the file, including processes started later. Closing the event
//! unregisters the uprobe and the kernel lowers the semaphore again.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const UPROBE_PMU: &str = "/sys/bus/event_source/devices/uprobe";

/// `enum bpf_cmd` BPF_LINK_CREATE and `enum bpf_attach_type`
/// BPF_PERF_EVENT (include/uapi/linux/bpf.h).
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PERF_EVENT: u32 = 41;

/// `_IO('$', 0)`, `_IO('$', 1)` (include/uapi/linux/perf_event.h).
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// Where to put one uprobe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UprobeTarget {
    /// The file, as this process can open it (e.g. `/proc/PID/root/...`).
    pub path: PathBuf,
    /// Offset of the instruction in the file.
    pub file_offset: u64,
    /// File offset of the USDT semaphore the kernel raises while the probe
    /// is attached.
    pub ref_ctr_offset: Option<u64>,
    /// Fire on return (a uretprobe) instead of at the instruction.
    pub retprobe: bool,
    /// Only this process; `None` for every process mapping the file.
    pub pid: Option<u32>,
}

/// An attached uprobe. Dropping it detaches: the link and the perf event
/// are closed (in that order: the link holds a reference to the event),
/// which unregisters the uprobe and lowers its semaphore.
#[derive(Debug)]
pub struct AttachedUprobe {
    link: OwnedFd,
    perf_event: OwnedFd,
}

impl AttachedUprobe {
    /// Stops the event without closing it (the kernel keeps the uprobe).
    pub fn disable(&self) {
        // SAFETY: an ioctl without argument on a perf event fd we own.
        unsafe { libc::ioctl(self.perf_event.as_raw_fd(), PERF_EVENT_IOC_DISABLE, 0) };
    }

    pub fn link_fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.link.as_fd()
    }
}

/// The uprobe PMU's dynamic type and its retprobe config bit, read from
/// sysfs once per run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UprobePmu {
    pub perf_type: u32,
    pub retprobe_bit: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(
        "this kernel has no uprobe perf PMU ({path}: {reason}); uprobes need \
         CONFIG_UPROBE_EVENTS (Linux ≥ 4.17 for perf-based uprobes)"
    )]
    NoPmu { path: String, reason: String },

    #[error("cannot understand {path} ({text:?}): expected `config:N`")]
    PmuFormat { path: String, text: String },

    #[error(
        "attaching to {} at file offset {offset:#x}{}: permission denied ({errno}); \
         run as root, or grant CAP_BPF and CAP_PERFMON \
         (`sudo setcap cap_bpf,cap_perfmon+ep $(which profiler-agent)`)",
        path.display(), pid_text(*pid)
    )]
    Permission {
        path: PathBuf,
        offset: u64,
        pid: Option<u32>,
        errno: std::io::Error,
    },

    #[error(
        "attaching to {} at file offset {offset:#x} with semaphore at {ref_ctr_offset:#x}: \
         the kernel refused (EINVAL). The usual cause is another tracer (bpftrace, bcc, perf, \
         a second profiler-agent) holding a uprobe on the same instruction with a different \
         semaphore offset, or without one (dmesg says `ref_ctr_offset mismatch`). Stop that \
         tracer and try again",
        path.display()
    )]
    RefCtrMismatch {
        path: PathBuf,
        offset: u64,
        ref_ctr_offset: u64,
    },

    #[error("attaching to {}: no such file", path.display())]
    NoFile { path: PathBuf },

    #[error("attaching to {}: no process {pid} (did it exit?)", path.display())]
    NoProcess { path: PathBuf, pid: u32 },

    #[error(
        "opening a uprobe on {} at file offset {offset:#x}{}: {errno}",
        path.display(), pid_text(*pid)
    )]
    Open {
        path: PathBuf,
        offset: u64,
        pid: Option<u32>,
        errno: std::io::Error,
    },

    #[error(
        "attaching the BPF program to the uprobe on {} at {offset:#x}: {errno} \
         (BPF links on perf events with cookies need Linux ≥ 5.15)",
        path.display()
    )]
    Link {
        path: PathBuf,
        offset: u64,
        errno: std::io::Error,
    },

    #[error("enabling the uprobe on {} at {offset:#x}: {errno}", path.display())]
    Enable {
        path: PathBuf,
        offset: u64,
        errno: std::io::Error,
    },
}

fn pid_text(pid: Option<u32>) -> String {
    match pid {
        Some(pid) => format!(" in pid {pid}"),
        None => String::new(),
    }
}

impl UprobePmu {
    /// Reads `/sys/bus/event_source/devices/uprobe/{type,format/retprobe}`.
    pub fn read() -> Result<UprobePmu, AttachError> {
        UprobePmu::read_from(Path::new(UPROBE_PMU))
    }

    pub fn read_from(dir: &Path) -> Result<UprobePmu, AttachError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|error| AttachError::NoPmu {
                path: path.display().to_string(),
                reason: error.to_string(),
            })
        };
        let type_text = read("type")?;
        let perf_type = type_text
            .trim()
            .parse()
            .map_err(|_| AttachError::PmuFormat {
                path: dir.join("type").display().to_string(),
                text: type_text.clone(),
            })?;
        let format = read("format/retprobe")?;
        let retprobe_bit = parse_config_bit(&format).ok_or_else(|| AttachError::PmuFormat {
            path: dir.join("format/retprobe").display().to_string(),
            text: format.clone(),
        })?;
        Ok(UprobePmu {
            perf_type,
            retprobe_bit,
        })
    }

    /// `perf_event_attr.config` for a probe.
    pub fn config(&self, ref_ctr_offset: Option<u64>, retprobe: bool) -> u64 {
        let mut config = ref_ctr_offset.unwrap_or(0) << 32;
        if retprobe {
            config |= 1 << self.retprobe_bit;
        }
        config
    }
}

/// `config:0` → 0 (a sysfs PMU format file naming one bit).
pub fn parse_config_bit(text: &str) -> Option<u32> {
    let bit: u32 = text.trim().strip_prefix("config:")?.parse().ok()?;
    (bit < 32).then_some(bit)
}

/// `struct perf_event_attr` up to `PERF_ATTR_SIZE_VER5` (112 bytes), the
/// fields a uprobe needs; the kernel accepts any published size.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    /// `uprobe_path` for the uprobe PMU.
    config1: u64,
    /// `probe_offset` for the uprobe PMU.
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved: u16,
}

/// The `link_create` member of `union bpf_attr`, perf-event variant,
/// padded with zeros (the kernel requires unused bytes to be zero).
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    bpf_cookie: u64,
    zero: [u64; 8],
}

/// Opens the uprobe, attaches `program` to it with `cookie`, and enables it.
pub fn attach_uprobe(
    pmu: &UprobePmu,
    program: BorrowedFd<'_>,
    target: &UprobeTarget,
    cookie: u64,
) -> Result<AttachedUprobe, AttachError> {
    let perf_event = open_uprobe(pmu, target)?;
    let attr = LinkCreateAttr {
        prog_fd: program.as_raw_fd() as u32,
        target_fd: perf_event.as_raw_fd() as u32,
        attach_type: BPF_PERF_EVENT,
        bpf_cookie: cookie,
        ..Default::default()
    };
    // SAFETY: bpf(2) with a valid, fully initialised attr of the size we pass.
    let link = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_CREATE,
            &attr as *const LinkCreateAttr,
            std::mem::size_of::<LinkCreateAttr>() as u32,
        )
    };
    if link < 0 {
        return Err(AttachError::Link {
            path: target.path.clone(),
            offset: target.file_offset,
            errno: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: bpf(BPF_LINK_CREATE) returned a new fd that nobody else owns.
    let link = unsafe { OwnedFd::from_raw_fd(link as i32) };
    // SAFETY: an ioctl without argument on a perf event fd we own.
    if unsafe { libc::ioctl(perf_event.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) } < 0 {
        return Err(AttachError::Enable {
            path: target.path.clone(),
            offset: target.file_offset,
            errno: std::io::Error::last_os_error(),
        });
    }
    Ok(AttachedUprobe { link, perf_event })
}

fn open_uprobe(pmu: &UprobePmu, target: &UprobeTarget) -> Result<OwnedFd, AttachError> {
    let path =
        CString::new(target.path.as_os_str().as_bytes()).map_err(|_| AttachError::NoFile {
            path: target.path.clone(),
        })?;
    let attr = PerfEventAttr {
        type_: pmu.perf_type,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: pmu.config(target.ref_ctr_offset, target.retprobe),
        config1: path.as_ptr() as u64,
        config2: target.file_offset,
        ..Default::default()
    };
    // perf requires a cpu when pid is -1; for a uprobe it only names where
    // the event is "owned", the program runs on every CPU (libbpf does the
    // same: pid -1 with cpu 0, a pid with cpu -1).
    let (pid, cpu) = match target.pid {
        Some(pid) => (pid as libc::pid_t, -1),
        None => (-1, 0),
    };
    // SAFETY: perf_event_open(2) with a valid attr; `path` outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            pid,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(open_error(target, std::io::Error::last_os_error()));
    }
    // SAFETY: perf_event_open returned a new fd that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn open_error(target: &UprobeTarget, errno: std::io::Error) -> AttachError {
    let path = target.path.clone();
    let offset = target.file_offset;
    match errno.raw_os_error() {
        Some(libc::EPERM | libc::EACCES) => AttachError::Permission {
            path,
            offset,
            pid: target.pid,
            errno,
        },
        Some(libc::EINVAL) if target.ref_ctr_offset.is_some() => AttachError::RefCtrMismatch {
            path,
            offset,
            ref_ctr_offset: target.ref_ctr_offset.unwrap_or(0),
        },
        Some(libc::ENOENT) => AttachError::NoFile { path },
        Some(libc::ESRCH) => AttachError::NoProcess {
            path,
            pid: target.pid.unwrap_or(0),
        },
        _ => AttachError::Open {
            path,
            offset,
            pid: target.pid,
            errno,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_bits() {
        assert_eq!(parse_config_bit("config:0\n"), Some(0));
        assert_eq!(parse_config_bit("config:7"), Some(7));
        assert_eq!(parse_config_bit("config1:0"), None);
        assert_eq!(parse_config_bit("config:64"), None);
        let pmu = UprobePmu {
            perf_type: 9,
            retprobe_bit: 0,
        };
        assert_eq!(pmu.config(None, false), 0);
        assert_eq!(pmu.config(None, true), 1);
        assert_eq!(pmu.config(Some(0x3a2c), false), 0x3a2c_0000_0000);
        assert_eq!(pmu.config(Some(0x10), true), 0x10_0000_0001);
    }

    #[test]
    fn struct_sizes_match_the_kernel_abi() {
        // PERF_ATTR_SIZE_VER5; link_create's perf_event.bpf_cookie at 16.
        assert_eq!(std::mem::size_of::<PerfEventAttr>(), 112);
        assert_eq!(std::mem::offset_of!(PerfEventAttr, config1), 56);
        assert_eq!(std::mem::offset_of!(PerfEventAttr, config2), 64);
        assert_eq!(std::mem::offset_of!(LinkCreateAttr, bpf_cookie), 16);
    }

    #[test]
    fn reads_the_pmu_from_sysfs_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("format")).unwrap();
        std::fs::write(dir.path().join("type"), "8\n").unwrap();
        std::fs::write(dir.path().join("format/retprobe"), "config:0\n").unwrap();
        assert_eq!(
            UprobePmu::read_from(dir.path()).unwrap(),
            UprobePmu {
                perf_type: 8,
                retprobe_bit: 0
            }
        );
        std::fs::write(dir.path().join("format/retprobe"), "bogus").unwrap();
        assert!(matches!(
            UprobePmu::read_from(dir.path()),
            Err(AttachError::PmuFormat { .. })
        ));
    }

    #[test]
    fn errno_becomes_an_explanation() {
        let target = UprobeTarget {
            path: "/usr/bin/python3.11".into(),
            file_offset: 0x1000,
            ref_ctr_offset: Some(0x2000),
            retprobe: false,
            pid: None,
        };
        let error = open_error(&target, std::io::Error::from_raw_os_error(libc::EINVAL));
        assert!(
            error.to_string().contains("ref_ctr_offset mismatch"),
            "{error}"
        );
        let error = open_error(&target, std::io::Error::from_raw_os_error(libc::EPERM));
        assert!(
            error.to_string().contains("CAP_BPF and CAP_PERFMON"),
            "{error}"
        );
    }
}
