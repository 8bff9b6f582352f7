//! A unit's line table: sorted sequences of (address, file, line) rows and
//! the file names of its line program header, rendered as addr2line
//! renders them (`comp_dir` / directory / file name, absolute parts
//! replacing what came before).

use std::cmp::Ordering;

use gimli::Reader as _;

use super::sections::{SectionReader, UnitRef};

struct Sequence {
    start: u64,
    end: u64,
    rows: Box<[Row]>,
}

/// A row; `line` 0 means unknown. Columns are not kept (frames have none).
#[derive(Clone, Copy)]
struct Row {
    address: u64,
    /// Index into `Lines::files`, saturated (an index past the table is
    /// as unknown as a huge one).
    file: u32,
    line: u32,
}

pub(super) struct Lines {
    files: Box<[String]>,
    sequences: Box<[Sequence]>,
}

/// A file and line of the line table; either may be unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Location<'a> {
    pub file: Option<&'a str>,
    pub line: Option<u32>,
}

impl Lines {
    /// Runs the line program of `unit` (consumed: pass a clone).
    pub fn parse(
        unit: UnitRef<'_>,
        program: gimli::IncompleteLineProgram<SectionReader, usize>,
    ) -> gimli::Result<Self> {
        let mut sequences = Vec::new();
        let mut current = Vec::<Row>::new();
        let mut rows = program.rows();
        while let Some((_, row)) = rows.next_row()? {
            if row.end_sequence() {
                if let Some(start) = current.first().map(|r| r.address) {
                    sequences.push(Sequence {
                        start,
                        end: row.address(),
                        rows: std::mem::take(&mut current).into_boxed_slice(),
                    });
                }
                continue;
            }
            let new = Row {
                address: row.address(),
                file: u32::try_from(row.file_index()).unwrap_or(u32::MAX),
                line: row.line().map_or(0, |l| l.get() as u32),
            };
            // Several rows at one address: the last one describes it.
            match current.last_mut() {
                Some(last) if last.address == new.address => *last = new,
                _ => current.push(new),
            }
        }
        sequences.sort_by_key(|s| s.start);

        // After the program ran: DW_LNE_define_file may have added files.
        let header = rows.header();
        let mut files = Vec::new();
        match header.file(0) {
            Some(file) => files.push(render_file(unit, file, header)?),
            // DWARF 4 and earlier have no file 0.
            None => files.push(String::new()),
        }
        let mut index = 1;
        while let Some(file) = header.file(index) {
            files.push(render_file(unit, file, header)?);
            index += 1;
        }
        Ok(Lines {
            files: files.into_boxed_slice(),
            sequences: sequences.into_boxed_slice(),
        })
    }

    /// The rendered name of file `index` of the line program header.
    pub fn file(&self, index: u64) -> Option<&str> {
        let index = usize::try_from(index).ok()?;
        self.files.get(index).map(String::as_str)
    }

    /// The address ranges of the sequences.
    pub fn ranges(&self) -> impl Iterator<Item = gimli::Range> + '_ {
        self.sequences.iter().map(|s| gimli::Range {
            begin: s.start,
            end: s.end,
        })
    }

    /// The row describing `probe`, if a sequence covers it.
    pub fn find_location(&self, probe: u64) -> Option<Location<'_>> {
        let sequence = self.sequences.binary_search_by(|s| {
            if probe < s.start {
                Ordering::Greater
            } else if probe >= s.end {
                Ordering::Less
            } else {
                Ordering::Equal
            }
        });
        let sequence = &self.sequences[sequence.ok()?];
        let row = match sequence.rows.binary_search_by(|r| r.address.cmp(&probe)) {
            Ok(i) => i,
            Err(0) => return None,
            Err(i) => i - 1,
        };
        let row = sequence.rows[row];
        Some(Location {
            file: self.files.get(row.file as usize).map(String::as_str),
            line: (row.line != 0).then_some(row.line),
        })
    }

    /// Heap bytes held (approximately).
    pub fn heap_bytes(&self) -> usize {
        size_of_val(&*self.files)
            + self.files.iter().map(String::capacity).sum::<usize>()
            + size_of_val(&*self.sequences)
            + self
                .sequences
                .iter()
                .map(|s| size_of_val(&*s.rows))
                .sum::<usize>()
    }
}

fn render_file(
    unit: UnitRef<'_>,
    file: &gimli::FileEntry<SectionReader, usize>,
    header: &gimli::LineProgramHeader<SectionReader, usize>,
) -> gimli::Result<String> {
    let mut path = match &unit.comp_dir {
        Some(dir) => dir.to_string_lossy()?.into_owned(),
        None => String::new(),
    };
    // Directory 0 is the compilation directory (DWARF 5 lists it; DWARF 4
    // means it by 0).
    if file.directory_index() != 0
        && let Some(directory) = file.directory(header)
    {
        path_push(&mut path, &unit.attr_string(directory)?.to_string_lossy()?);
    }
    path_push(
        &mut path,
        &unit.attr_string(file.path_name())?.to_string_lossy()?,
    );
    Ok(path)
}

fn path_push(path: &mut String, part: &str) {
    if has_unix_root(part) || has_windows_root(part) {
        *path = part.to_string();
    } else {
        let separator = if has_windows_root(path) { '\\' } else { '/' };
        if !path.is_empty() && !path.ends_with(separator) {
            path.push(separator);
        }
        path.push_str(part);
    }
}

fn has_unix_root(path: &str) -> bool {
    path.starts_with('/')
}

fn has_windows_root(path: &str) -> bool {
    path.starts_with('\\') || path.get(1..3) == Some(":\\")
}

#[cfg(test)]
mod tests {
    use super::path_push;

    #[test]
    fn paths_join_like_addr2line() {
        let join = |parts: &[&str]| {
            let mut path = String::new();
            for part in parts {
                path_push(&mut path, part);
            }
            path
        };
        assert_eq!(
            join(&["/build/glibc", "stdlib", "abort.c"]),
            "/build/glibc/stdlib/abort.c"
        );
        assert_eq!(
            join(&["/build/", "./stdlib/abort.c"]),
            "/build/./stdlib/abort.c"
        );
        assert_eq!(
            join(&["/build", "/usr/include", "stdio.h"]),
            "/usr/include/stdio.h"
        );
        assert_eq!(join(&["", "./x.c"]), "./x.c");
        assert_eq!(join(&["C:\\src", "a.c"]), "C:\\src\\a.c");
    }
}
