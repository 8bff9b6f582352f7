//! Runtime offsets by Go minor version, for binaries without DWARF.
//!
//! Read from the DWARF of binaries each toolchain built (1.19.8, 1.20.6,
//! 1.21.13, 1.22.10, 1.23.9, 1.24.11, 1.25.5, 1.26.6, 1.27.3; earlier
//! patch releases of 1.23 to 1.27 agree), static and cgo, amd64 and arm64
//! (identical: no field before these depends on the architecture), and
//! checked at run time by a program reading its own g through them. The
//! end-to-end tests compare the rows of every installed toolchain with the
//! DWARF of the fixture it builds (tests/e2e/go_labels.rs). A version not
//! listed is read only from DWARF.

use super::Offsets;

/// `(minor, g.m, g.goid, g.labels, m.curg)`.
const TABLE: &[(u32, u16, u16, u16, u16)] = &[
    (19, 48, 152, 360, 192),
    (20, 48, 152, 360, 192),
    (21, 48, 152, 344, 192),
    (22, 48, 152, 344, 192),
    // g.syscallbp (1.23) moved goid.
    (23, 48, 160, 352, 192),
    (24, 48, 160, 352, 192),
    // gobuf.ret went (1.25): g.sched and m.morebuf shrank.
    (25, 48, 152, 344, 184),
    (26, 48, 152, 352, 184),
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
