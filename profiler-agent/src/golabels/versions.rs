//! Runtime offsets by Go minor version, for binaries without DWARF.
//!
//! Read from the DWARF of binaries each toolchain built (amd64 and arm64
//! agree: no field before these depends on the architecture), and checked
//! in the end-to-end tests against the DWARF of the same fixtures built
//! plain (tests/e2e/go_labels.rs). A version not listed is read only from
//! DWARF.

use super::Offsets;

/// `(minor, g.m, g.goid, g.labels, m.curg)`.
const TABLE: &[(u32, u16, u16, u16, u16)] = &[
    (19, 48, 152, 360, 192),
    (21, 48, 152, 344, 192),
    (23, 48, 160, 352, 192),
    (25, 48, 152, 344, 184),
    (27, 48, 152, 352, 184),
];

/// The offsets of Go 1.`minor`, when known.
pub fn offsets(minor: u32) -> Option<Offsets> {
    TABLE
        .iter()
        .find(|row| row.0 == minor)
        .map(|&(_, g_m, g_goid, g_labels, m_curg)| Offsets {
            g_m,
            g_goid,
            g_labels,
            m_curg,
        })
}
