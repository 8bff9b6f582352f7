//! A CPython interpreter in an object file: the executable of a statically
//! linked `python3.X` (Debian's), or `libpython3.X.so` (source builds with
//! `--enable-shared`, embedding applications).
//!
//! Found by what the interpreter exports, never by the file's name:
//! `_PyRuntime` (the runtime state, also in its own `.PyRuntime` section),
//! `_PyEval_EvalFrameDefault` (the eval loop), `PyCode_Type`, and the
//! version: `Py_Version` (3.11 on) or, for 3.10, the version string in
//! `.rodata`. Stripped distribution builds keep all of these in `.dynsym`.
//!
//! The eval loop may have a cold part: GCC moves its unlikely paths into
//! `_PyEval_EvalFrameDefault.cold`, a separate function with no exported
//! symbol; newer GCCs move almost the whole dispatch loop there (Debian's
//! 3.13.18 and 3.14 builds keep 0x950 and 0x4a0 bytes under the symbol),
//! so return addresses of eval activations are found in it. It is the
//! `.eh_frame` function that the hot part's jumps lead into.

use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSymbol};

/// What an object says of the interpreter it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterpreterFile {
    /// The interpreter's version: (minor, micro), e.g. (11, 2).
    pub minor: u8,
    pub micro: Option<u8>,
    /// ELF virtual addresses of `_PyRuntime` and `PyCode_Type`.
    pub runtime: u64,
    pub code_type: Option<u64>,
    /// The eval loop's code: its symbol's range, and the cold part's.
    pub eval_ranges: Vec<(u64, u64)>,
}

/// Why an object holding `_PyRuntime` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterpreterError {
    #[error("it exports _PyRuntime but no _PyEval_EvalFrameDefault")]
    NoEvalLoop,
    #[error("its Python version is not in the binary (no Py_Version, no version string)")]
    NoVersion,
    #[error("Python {0} is older than 3.10, which the agent does not read")]
    TooOld(String),
}

/// The interpreter in `file`, if it holds one: None for any object that
/// does not export `_PyRuntime`.
pub fn find(file: &object::File<'_>) -> Option<Result<InterpreterFile, InterpreterError>> {
    let symbol = |name: &str| {
        file.dynamic_symbols()
            .chain(file.symbols())
            .find(|s| s.name() == Ok(name) && s.address() != 0)
    };
    let runtime = symbol("_PyRuntime")?;
    Some(read(file, runtime.address(), &symbol))
}

fn read<'a>(
    file: &object::File<'a>,
    runtime: u64,
    symbol: &dyn Fn(&str) -> Option<object::Symbol<'a, 'a>>,
) -> Result<InterpreterFile, InterpreterError> {
    let eval = symbol("_PyEval_EvalFrameDefault").ok_or(InterpreterError::NoEvalLoop)?;
    let hot = (eval.address(), eval.address() + eval.size().max(1));
    let (minor, micro) = match symbol("Py_Version") {
        Some(version) => {
            let hex = read_u64(file, version.address()).ok_or(InterpreterError::NoVersion)?;
            (((hex >> 16) & 0xff) as u8, Some(((hex >> 8) & 0xff) as u8))
        }
        None => version_string(file).ok_or(InterpreterError::NoVersion)?,
    };
    if minor < 10 {
        return Err(InterpreterError::TooOld(format!("3.{minor}")));
    }
    let mut eval_ranges = vec![hot];
    if let Some(cold) = cold_part(file, hot) {
        eval_ranges.push(cold);
    }
    Ok(InterpreterFile {
        minor,
        micro,
        runtime,
        code_type: symbol("PyCode_Type").map(|s| s.address()),
        eval_ranges,
    })
}

/// The 8 bytes at virtual address `address`, from the file.
fn read_u64(file: &object::File<'_>, address: u64) -> Option<u64> {
    let section = file
        .sections()
        .find(|s| s.address() <= address && address + 8 <= s.address() + s.size())?;
    let data = section.data().ok()?;
    let at = (address - section.address()) as usize;
    Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?))
}

/// 3.10 has no `Py_Version`: its version string (`PY_VERSION`, "3.10.13")
/// is in `.rodata`, possibly as the tail of a longer string the linker
/// merged it into (a pyenv build's prefix, ".../versions/3.10.13"), so it
/// is found as 3.1X.Y followed by a NUL and preceded by neither a digit
/// nor a dot. Every such string must agree.
fn version_string(file: &object::File<'_>) -> Option<(u8, Option<u8>)> {
    let data = file.section_by_name(".rodata")?.data().ok()?;
    let mut found: Option<(u8, u8)> = None;
    let mut at = 0;
    while let Some(offset) = find_bytes(&data[at..], b"3.1") {
        let start = at + offset;
        at = start + 1;
        if start > 0 && (data[start - 1].is_ascii_digit() || data[start - 1] == b'.') {
            continue;
        }
        let rest = &data[start + 2..];
        let minor_digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if minor_digits != 2 || rest.get(minor_digits) != Some(&b'.') {
            continue;
        }
        let micro = &rest[minor_digits + 1..];
        let micro_digits = micro.iter().take_while(|b| b.is_ascii_digit()).count();
        if micro_digits == 0 || micro_digits > 2 {
            continue;
        }
        // Pre-releases ("3.10.0rc2") end in letters and digits.
        let tail = &micro[micro_digits..];
        let suffix = tail
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'+')
            .count();
        if tail.get(suffix) != Some(&0) {
            continue;
        }
        let minor: u8 = std::str::from_utf8(&rest[..minor_digits])
            .ok()?
            .parse()
            .ok()?;
        let micro: u8 = std::str::from_utf8(&micro[..micro_digits])
            .ok()?
            .parse()
            .ok()?;
        match found {
            None => found = Some((minor, micro)),
            Some(previous) if previous == (minor, micro) => {}
            Some(_) => return None,
        }
    }
    found.map(|(minor, micro)| (minor, Some(micro)))
}

fn find_bytes(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The eval loop's cold part: the `.eh_frame` function (outside the hot
/// range, not starting at an exported symbol) that most of the hot part's
/// jumps lead into, if at least three do (a tail call into another
/// function is one or two).
fn cold_part(file: &object::File<'_>, hot: (u64, u64)) -> Option<(u64, u64)> {
    if file.architecture() != object::Architecture::X86_64 {
        // Debian's arm64 builds keep the whole loop in one function.
        return None;
    }
    let text = file
        .sections()
        .find(|s| s.address() <= hot.0 && hot.1 <= s.address() + s.size())?;
    let data = text.data().ok()?;
    let code = data.get((hot.0 - text.address()) as usize..(hot.1 - text.address()) as usize)?;
    let fdes = profiler_symbolize::elf::fde::FdeBounds::of(file);
    let exported: std::collections::HashSet<u64> =
        file.dynamic_symbols().map(|s| s.address()).collect();
    let mut hits: std::collections::HashMap<(u64, u64), u32> = Default::default();
    let mut decoder = iced_x86::Decoder::with_ip(64, code, hot.0, iced_x86::DecoderOptions::NONE);
    let mut instruction = iced_x86::Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        let jumps = matches!(
            instruction.flow_control(),
            iced_x86::FlowControl::UnconditionalBranch | iced_x86::FlowControl::ConditionalBranch
        );
        if !jumps || !instruction.is_jmp_short_or_near() && !instruction.is_jcc_short_or_near() {
            continue;
        }
        let target = instruction.near_branch_target();
        if hot.0 <= target && target < hot.1 {
            continue;
        }
        if let Some(range) = fdes.range_of(target)
            && !exported.contains(&range.0)
        {
            *hits.entry(range).or_default() += 1;
        }
    }
    let (range, count) = hits.into_iter().max_by_key(|&(_, count)| count)?;
    (count >= 3).then_some(range)
}

/// Interpreter files read once per object (the registry keeps them).
pub type Shared = Arc<InterpreterFile>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machines_python_is_found_with_its_version() {
        // The interpreter the test suite runs under (the machine's
        // python3), and whichever 3.1X it is.
        let output = std::process::Command::new("python3")
            .args([
                "-c",
                "import sys; print(sys.executable, sys.version_info.minor)",
            ])
            .output()
            .expect("python3");
        let text = String::from_utf8_lossy(&output.stdout);
        let mut words = text.split_whitespace();
        let executable = words.next().unwrap();
        let minor: u8 = words.next().unwrap().parse().unwrap();
        // A shared build's interpreter is in its libpython.
        let maps = std::process::Command::new(executable)
            .args(["-c", "print(open('/proc/self/maps').read())"])
            .output()
            .unwrap();
        let maps = String::from_utf8_lossy(&maps.stdout);
        let object = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("libpython3"))
            .unwrap_or(executable)
            .to_string();
        let data = std::fs::read(&object).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let interpreter = find(&file).expect("_PyRuntime").unwrap();
        assert_eq!(interpreter.minor, minor, "{object}");
        assert!(!interpreter.eval_ranges.is_empty());
        assert!(interpreter.code_type.is_some());
    }

    #[test]
    fn version_strings_are_found_as_cpython_writes_them() {
        let mut rodata = b"xx\x00/opt/python/3.10.13\x00build 3.10.13\x00".to_vec();
        rodata.extend_from_slice(b"13.10.5\x00"); // preceded by a digit: not one
        let (minor, micro) = scan(&rodata).unwrap();
        assert_eq!((minor, micro), (10, Some(13)));
        assert_eq!(scan(b"3.10.1\x003.10.2\x00"), None, "two versions");
        assert_eq!(scan(b"3.10.0rc2\x00"), Some((10, Some(0))));
        assert_eq!(scan(b"nothing\x00"), None);
    }

    /// `version_string` over bytes given as `.rodata`.
    fn scan(rodata: &[u8]) -> Option<(u8, Option<u8>)> {
        use object::write::{Object as Writer, StandardSection};
        let mut writer = Writer::new(
            object::BinaryFormat::Elf,
            object::Architecture::X86_64,
            object::Endianness::Little,
        );
        let section = writer.section_id(StandardSection::ReadOnlyData);
        writer.append_section_data(section, rodata, 1);
        let bytes = writer.write().unwrap();
        let file = object::File::parse(&*bytes).unwrap();
        version_string(&file)
    }
}
