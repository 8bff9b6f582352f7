//! Stopping a process for an exact goroutine dump (`goroutines --stop`):
//! every thread is seized and interrupted with ptrace, so nothing moves
//! while the runtime is read, and the registers of the threads running
//! goroutines give those goroutines' stacks. Dropping the freeze lets
//! every thread go on; the process sees no signal (PTRACE_SEIZE and
//! PTRACE_INTERRUPT stop it without one).

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::time::{Duration, Instant};

use super::StateError;

/// `NT_PRSTATUS`: the general registers' register set.
const NT_PRSTATUS: libc::c_ulong = 1;
/// Rounds of seizing threads the process started meanwhile.
const ROUNDS: usize = 10;

/// The registers a stack walk starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registers {
    pub pc: u64,
    pub sp: u64,
    /// The link register (arm64), for a leaf function's return address.
    pub lr: Option<u64>,
}

/// A process whose threads are all stopped until this is dropped.
pub struct Freeze {
    pub pid: u32,
    stopped: Vec<u32>,
    registers: HashMap<u32, Registers>,
    /// How long the threads took to stop.
    pub took: Duration,
}

impl Freeze {
    /// Stops every thread of `pid` (and those it starts meanwhile).
    pub fn new(pid: u32) -> Result<Freeze, StateError> {
        let started = Instant::now();
        let mut freeze = Freeze {
            pid,
            stopped: Vec::new(),
            registers: HashMap::new(),
            took: Duration::ZERO,
        };
        for _ in 0..ROUNDS {
            let threads = threads(pid).map_err(|e| StateError::Process {
                pid,
                reason: format!("listing its threads: {e} (is the process running?)"),
            })?;
            let new: Vec<u32> = threads
                .into_iter()
                .filter(|t| !freeze.stopped.contains(t))
                .collect();
            if new.is_empty() {
                freeze.took = started.elapsed();
                return Ok(freeze);
            }
            for tid in new {
                match stop(tid) {
                    Ok(()) => {
                        freeze.stopped.push(tid);
                        if let Some(registers) = registers(tid) {
                            freeze.registers.insert(tid, registers);
                        }
                    }
                    // A thread that exited meanwhile is no thread to stop.
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(e) => {
                        return Err(StateError::Process {
                            pid,
                            reason: format!(
                                "stopping thread {tid} with ptrace: {e} (is a debugger attached? \
                                 is ptrace allowed: CAP_SYS_PTRACE, kernel.yama.ptrace_scope?)"
                            ),
                        });
                    }
                }
            }
        }
        Err(StateError::Process {
            pid,
            reason: format!(
                "it kept starting threads while {} were stopped",
                freeze.stopped.len()
            ),
        })
    }

    /// The registers of thread `tid`, when it is one of the process's.
    pub fn registers(&self, tid: u32) -> Option<Registers> {
        self.registers.get(&tid).copied()
    }

    /// Threads stopped.
    pub fn threads(&self) -> usize {
        self.stopped.len()
    }
}

impl Drop for Freeze {
    fn drop(&mut self) {
        for &tid in &self.stopped {
            // SAFETY: ptrace on a thread we seized; detaching resumes it.
            unsafe {
                libc::ptrace(libc::PTRACE_DETACH, tid as libc::pid_t, 0, 0);
            }
        }
    }
}

/// The process's threads now.
fn threads(pid: u32) -> io::Result<BTreeSet<u32>> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// Seizes thread `tid` and waits until it stops.
fn stop(tid: u32) -> io::Result<()> {
    let tid = tid as libc::pid_t;
    // SAFETY: plain ptrace requests on a thread id; no memory is passed.
    unsafe {
        if libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) != 0 {
            let error = io::Error::last_os_error();
            libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0);
            return Err(error);
        }
        let mut status = 0;
        if libc::waitpid(tid, &mut status, libc::__WALL) < 0 {
            let error = io::Error::last_os_error();
            libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0);
            return Err(error);
        }
    }
    Ok(())
}

/// A stopped thread's PC and SP (and LR on arm64).
fn registers(tid: u32) -> Option<Registers> {
    // SAFETY: all-zero is a valid user_regs_struct (plain integers).
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec {
        iov_base: (&mut regs as *mut libc::user_regs_struct).cast(),
        iov_len: std::mem::size_of::<libc::user_regs_struct>(),
    };
    // SAFETY: the kernel writes at most iov_len bytes into `regs`.
    let done = unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGSET,
            tid as libc::pid_t,
            NT_PRSTATUS,
            &mut iov as *mut libc::iovec,
        )
    };
    if done != 0 {
        return None;
    }
    Some(from_regs(&regs))
}

#[cfg(target_arch = "x86_64")]
fn from_regs(regs: &libc::user_regs_struct) -> Registers {
    Registers {
        pc: regs.rip,
        sp: regs.rsp,
        lr: None,
    }
}

#[cfg(target_arch = "aarch64")]
fn from_regs(regs: &libc::user_regs_struct) -> Registers {
    Registers {
        pc: regs.pc,
        sp: regs.sp,
        lr: Some(regs.regs[30]),
    }
}
