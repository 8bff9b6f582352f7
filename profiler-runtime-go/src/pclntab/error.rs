//! What can go wrong reading Go symbol tables.

use std::path::PathBuf;

/// Why a Go binary's symbol table could not be read. Every variant says
/// where (an address of the ELF file) and what is wrong; [`GoError::File`]
/// adds the file's path when the caller knows it.
#[derive(Debug, thiserror::Error)]
pub enum GoError {
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: Box<GoError>,
    },
    #[error("cannot read the file: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a readable ELF file: {0}")]
    Elf(#[from] object::Error),
    #[error(
        "no Go pclntab found (no .gopclntab section, no runtime.pclntab symbol, \
         no valid table in the non-executable segments)"
    )]
    NotFound,
    #[error("pclntab at {address:#x}: unknown magic {magic:#010x}")]
    UnknownMagic { address: u64, magic: u32 },
    #[error("pclntab at {address:#x}: {what}")]
    Malformed { address: u64, what: String },
    #[error(
        "pclntab at {address:#x}: the start of the text is unknown (no runtime.text \
         symbol, no moduledata, and the header's textStart is 0 as from Go 1.26)"
    )]
    NoTextStart { address: u64 },
}

impl GoError {
    pub(super) fn malformed(address: u64, what: impl Into<String>) -> Self {
        GoError::Malformed {
            address,
            what: what.into(),
        }
    }
}
