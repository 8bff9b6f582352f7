//! The Go version (`.go.buildinfo`) and Go build id (`.note.go.buildid`).

use object::{Object, ObjectSection};

use super::image::Image;
use super::reader::{Endian, uvarint64};

/// "\xff Go buildinf:" (debug/buildinfo/buildinfo.go), 16-byte aligned.
const BUILDINFO_MAGIC: &[u8] = b"\xff Go buildinf:";

/// The Go version the binary was built with ("go1.21.13"), read from the
/// build-info blob: `.go.buildinfo`, or found in the data segments when
/// section headers are gone.
pub(crate) fn go_version(file: &object::File<'_>, image: &Image<'_>) -> Option<String> {
    let blob = match file.section_by_name(".go.buildinfo") {
        Some(section) => section.data().ok()?,
        None => find_buildinfo(image)?,
    };
    parse_version(blob, image)
}

/// Scans writable data for the build-info magic at 16-byte alignment.
fn find_buildinfo<'data>(image: &Image<'data>) -> Option<&'data [u8]> {
    image.data_segments().find_map(|segment| {
        let start = (segment.address.wrapping_neg() & 15) as usize;
        (start..segment.bytes.len())
            .step_by(16)
            .find(|&at| segment.bytes[at..].starts_with(BUILDINFO_MAGIC))
            .map(|at| &segment.bytes[at..])
    })
}

/// debug/buildinfo: after the 14-byte magic come the pointer size and a
/// flags byte. Flag 2 (Go 1.18+): the version is inline at offset 32 as a
/// uvarint length and bytes. Otherwise two pointers at 16 lead to Go
/// string headers {data pointer, length}; flag 1 means big-endian.
pub(crate) fn parse_version(blob: &[u8], image: &Image<'_>) -> Option<String> {
    if !blob.starts_with(BUILDINFO_MAGIC) {
        return None;
    }
    let ptr_size = *blob.get(14)?;
    let flags = *blob.get(15)?;
    let bytes = if flags & 2 != 0 {
        let mut pos = 32;
        let len = usize::try_from(uvarint64(blob, &mut pos)?).ok()?;
        blob.get(pos..pos.checked_add(len)?)?
    } else {
        let endian = if flags & 1 != 0 {
            Endian::Big
        } else {
            Endian::Little
        };
        let header = endian.word(blob, 16, ptr_size)?;
        let raw = image.read(header, 2 * usize::from(ptr_size))?;
        let data = endian.word(raw, 0, ptr_size)?;
        let len = usize::try_from(endian.word(raw, usize::from(ptr_size), ptr_size)?).ok()?;
        if len > 256 {
            return None;
        }
        image.read(data, len)?
    };
    let version = std::str::from_utf8(bytes).ok()?;
    version.starts_with("go").then(|| version.to_string())
}

/// The Go build id ("actionID/contentID" parts joined by '/'): the
/// descriptor of the ELF note named "Go" of type 4 (cmd/internal/buildid
/// note.go), in `.note.go.buildid`.
pub(crate) fn go_build_id(file: &object::File<'_>) -> Option<String> {
    let section = file.section_by_name(".note.go.buildid")?;
    let data = section.data().ok()?;
    let endian = if file.is_little_endian() {
        Endian::Little
    } else {
        Endian::Big
    };
    parse_note(data, endian)
}

/// Finds the Go build-id note in a run of ELF notes
/// (`namesz, descsz, type`, then name and descriptor padded to 4 bytes).
pub(crate) fn parse_note(mut data: &[u8], endian: Endian) -> Option<String> {
    let pad = |n: usize| n.checked_add(3).map(|n| n & !3);
    while data.len() >= 12 {
        let namesz = endian.u32(data, 0)? as usize;
        let descsz = endian.u32(data, 4)? as usize;
        let kind = endian.u32(data, 8)?;
        let name_end = 12usize.checked_add(pad(namesz)?)?;
        let desc_end = name_end.checked_add(pad(descsz)?)?;
        let name = data.get(12..12 + namesz)?;
        let desc = data.get(name_end..name_end.checked_add(descsz)?)?;
        if name.split(|&b| b == 0).next() == Some(&b"Go"[..]) && kind == 4 {
            return std::str::from_utf8(desc).ok().map(str::to_string);
        }
        data = data.get(desc_end..)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_version_and_note() {
        let mut blob = BUILDINFO_MAGIC.to_vec();
        blob.extend([8, 2]);
        blob.resize(32, 0);
        blob.push(9);
        blob.extend(b"go1.27.3x");
        let image = Image {
            segments: Vec::new(),
        };
        assert_eq!(parse_version(&blob, &image).as_deref(), Some("go1.27.3x"));
        blob[32] = 200; // length past the end
        assert_eq!(parse_version(&blob, &image), None);

        let mut note = Vec::new();
        for v in [4u32, 5, 4] {
            note.extend(v.to_le_bytes());
        }
        note.extend(b"Go\0\0ab/cd\0\0\0");
        assert_eq!(parse_note(&note, Endian::Little).as_deref(), Some("ab/cd"));
        assert_eq!(parse_note(&note[..20], Endian::Little), None);
    }
}
