//! Reading another process's memory (`process_vm_readv`), as the runtimes
//! read their interpreters' and schedulers' state from outside: no ptrace
//! stop, no change in the target.
//!
//! Everything read is the target's to forge: reads are bounded by the
//! caller's buffer, and a read that crosses into unmapped memory is an
//! error, never a partial answer taken for a whole one.

use std::io;

/// Largest single read (a string, a line table); a target that claims more
/// is cut or refused by the caller.
pub const MAX_READ: usize = 1 << 20;

/// Memory the runtimes read: a process's, or (tests, fuzz targets) an
/// image of one.
pub trait Memory {
    /// Fills `buffer` from `address`; an error unless all of it was read.
    fn read(&self, address: u64, buffer: &mut [u8]) -> io::Result<()>;

    /// Reads `N` bytes.
    fn array<const N: usize>(&self, address: u64) -> io::Result<[u8; N]> {
        let mut bytes = [0u8; N];
        self.read(address, &mut bytes)?;
        Ok(bytes)
    }

    fn u64(&self, address: u64) -> io::Result<u64> {
        self.array::<8>(address).map(u64::from_le_bytes)
    }

    fn u32(&self, address: u64) -> io::Result<u32> {
        self.array::<4>(address).map(u32::from_le_bytes)
    }

    fn i32(&self, address: u64) -> io::Result<i32> {
        self.array::<4>(address).map(i32::from_le_bytes)
    }

    fn u8(&self, address: u64) -> io::Result<u8> {
        self.array::<1>(address).map(|b| b[0])
    }

    /// `len` bytes at `address` (at most `MAX_READ`).
    fn bytes(&self, address: u64, len: usize) -> io::Result<Vec<u8>> {
        if len > MAX_READ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a read of {len} bytes is over the bound"),
            ));
        }
        let mut bytes = vec![0u8; len];
        self.read(address, &mut bytes)?;
        Ok(bytes)
    }

    /// A NUL-terminated string of at most `max` bytes (read in chunks, so
    /// one near the end of a mapping is found).
    fn c_string(&self, address: u64, max: usize) -> io::Result<String> {
        let mut out = Vec::new();
        let mut at = address;
        while out.len() < max {
            let mut chunk = [0u8; 64];
            // The chunk may cross into unmapped memory: fall back to bytes.
            let got = match self.read(at, &mut chunk) {
                Ok(()) => &chunk[..],
                Err(_) => {
                    self.read(at, &mut chunk[..1])?;
                    &chunk[..1]
                }
            };
            if let Some(end) = got.iter().position(|&b| b == 0) {
                out.extend_from_slice(&got[..end]);
                out.truncate(max);
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            out.extend_from_slice(got);
            at = at.wrapping_add(got.len() as u64);
        }
        out.truncate(max);
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// The memory of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    pub pid: u32,
}

impl ProcessMemory {
    pub fn new(pid: u32) -> Self {
        ProcessMemory { pid }
    }
}

impl Memory for ProcessMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> io::Result<()> {
        if buffer.is_empty() {
            return Ok(());
        }
        if buffer.len() > MAX_READ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a read of {} bytes is over the bound", buffer.len()),
            ));
        }
        let local = libc::iovec {
            iov_base: buffer.as_mut_ptr().cast(),
            iov_len: buffer.len(),
        };
        let remote = libc::iovec {
            iov_base: address as usize as *mut libc::c_void,
            iov_len: buffer.len(),
        };
        // SAFETY: `local` describes `buffer`, which we own mutably for the
        // call; the kernel checks the remote range in the target.
        let read =
            unsafe { libc::process_vm_readv(self.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if read < 0 {
            return Err(io::Error::last_os_error());
        }
        if read as usize != buffer.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{read} of {} bytes at {address:#x}", buffer.len()),
            ));
        }
        Ok(())
    }
}

impl ProcessMemory {
    /// Writes `bytes` at `address` in the process (`process_vm_writev`):
    /// only for what the user asked to change in it.
    pub fn write(&self, address: u64, bytes: &[u8]) -> io::Result<()> {
        let local = libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        let remote = libc::iovec {
            iov_base: address as usize as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        // SAFETY: `local` describes `bytes`, which the kernel only reads;
        // it checks the remote range in the target.
        let written =
            unsafe { libc::process_vm_writev(self.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if written < 0 {
            return Err(io::Error::last_os_error());
        }
        if written as usize != bytes.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{written} of {} bytes written at {address:#x}", bytes.len()),
            ));
        }
        Ok(())
    }
}

/// An image of memory: `bytes` at `base`, nothing elsewhere.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageMemory {
    pub base: u64,
    pub bytes: Vec<u8>,
}

impl Memory for ImageMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> io::Result<()> {
        let start = address
            .checked_sub(self.base)
            .and_then(|s| usize::try_from(s).ok());
        let range = start.and_then(|s| Some(s..s.checked_add(buffer.len())?));
        match range.and_then(|r| self.bytes.get(r)) {
            Some(bytes) => {
                buffer.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{} bytes at {address:#x} are not in the image",
                    buffer.len()
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_answers_inside_itself_only() {
        let image = ImageMemory {
            base: 0x1000,
            bytes: b"abc\0".to_vec(),
        };
        assert_eq!(image.c_string(0x1000, 10).unwrap(), "abc");
        assert!(image.u64(0x1000).is_err());
        assert!(image.u8(u64::MAX).is_err());
    }

    #[test]
    fn reads_this_process_and_refuses_what_is_not_mapped() {
        let value: u64 = 0x1122_3344_5566_7788;
        let memory = ProcessMemory::new(std::process::id());
        assert_eq!(memory.u64(&value as *const u64 as u64).unwrap(), value);
        let text = b"hello\0world";
        assert_eq!(memory.c_string(text.as_ptr() as u64, 100).unwrap(), "hello");
        assert_eq!(memory.c_string(text.as_ptr() as u64, 3).unwrap(), "hel");
        assert!(memory.u64(8).is_err(), "page zero is never mapped");
        assert!(memory.bytes(0x1000, MAX_READ + 1).is_err());
    }
}
