//! MiniDebugInfo: the xz-compressed ELF file in a `.gnu_debugdata` section
//! that Fedora, RHEL and CentOS ship in their stripped binaries. It holds a
//! `.symtab` of the functions `.dynsym` does not name (static functions
//! among them), so gdb, elfutils and systemd-coredump name frames of
//! stripped code without the debug package. The section is read from a
//! file the profiled process controls: decompression stops at
//! `MAX_MINIDEBUGINFO_BYTES`, and the result is parsed like any ELF file.

use std::io::Write;

/// Most bytes a `.gnu_debugdata` section may decompress to (real ones are
/// well under a MiB; an xz bomb stops here).
pub const MAX_MINIDEBUGINFO_BYTES: usize = 64 << 20;

/// The ELF image inside a `.gnu_debugdata` section's bytes.
pub fn decompress(section: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Bounded {
        bytes: Vec::new(),
        max: MAX_MINIDEBUGINFO_BYTES,
    };
    lzma_rs::xz_decompress(&mut std::io::BufReader::new(section), &mut out)
        .map_err(|e| format!(".gnu_debugdata: {e}"))?;
    Ok(out.bytes)
}

/// A writer that refuses to grow past `max` bytes.
struct Bounded {
    bytes: Vec<u8>,
    max: usize,
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.max {
            return Err(std::io::Error::other(format!(
                "decompresses to more than {} bytes; refused",
                self.max
            )));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_xz_stream_is_decompressed_and_garbage_is_an_error() {
        let mut compressed = Vec::new();
        lzma_rs::xz_compress(&mut &b"\x7fELF and the rest"[..], &mut compressed).unwrap();
        assert_eq!(decompress(&compressed).unwrap(), b"\x7fELF and the rest");
        assert!(decompress(b"not xz").is_err());
        assert!(decompress(&compressed[..compressed.len() / 2]).is_err());
    }

    #[test]
    fn a_bomb_stops_at_the_cap() {
        let zeros = vec![0u8; MAX_MINIDEBUGINFO_BYTES + 1];
        let mut compressed = Vec::new();
        lzma_rs::xz_compress(&mut &zeros[..], &mut compressed).unwrap();
        let error = decompress(&compressed).unwrap_err();
        assert!(error.contains("refused"), "{error}");
    }
}
