//! pprof encoding (github.com/google/pprof proto/profile.proto), shaped like
//! Go's own CPU profile so `go tool pprof` reads it as one: sample types
//! `samples/count` and `cpu/nanoseconds`, period type `cpu/nanoseconds`.
//! An off-CPU profile adds `off_cpu/nanoseconds` and makes it the default
//! (`go tool pprof -sample_index=cpu` shows the CPU side); a wall-clock
//! profile has `samples/count` and `wall/nanoseconds`, as fgprof's.

use std::collections::HashMap;
use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;

use super::{Profile, ProfileKind};

/// The protobuf messages of profile.proto, generated from
/// `proto/profile.proto` at build time (see build.rs).
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

/// pprof's string table: index 0 is always "".
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut strings = Strings::default();
        strings.get("");
        strings
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// Converts the model to pprof messages. Ids are 1-based indices.
pub fn to_proto(profile: &Profile) -> proto::Profile {
    let mut strings = Strings::new();
    let header = Header::of(profile, &mut strings);
    let sample = profile
        .samples
        .iter()
        .map(|s| proto_sample(profile, s, &mut strings))
        .collect();
    let mut message = rest(profile, header, strings);
    message.sample = sample;
    message
}

/// The sample and period types, and the default sample type.
struct Header {
    sample_type: Vec<proto::ValueType>,
    period_type: proto::ValueType,
    default_sample_type: i64,
}

impl Header {
    fn of(profile: &Profile, strings: &mut Strings) -> Header {
        let value_type = |strings: &mut Strings, t: &str, u: &str| proto::ValueType {
            r#type: strings.get(t),
            unit: strings.get(u),
        };
        // Operations at probe hits are counted, not sampled.
        let counted = if profile.kind == ProfileKind::Latency {
            "count"
        } else {
            "samples"
        };
        let mut sample_type = match profile.kind {
            // As runtime/pprof writes them: no "samples" first.
            ProfileKind::Heap | ProfileKind::Goroutine => Vec::new(),
            _ => vec![value_type(strings, counted, "count")],
        };
        let mut default_sample_type = 0;
        let period_type = match profile.kind {
            ProfileKind::Heap => {
                for (t, u) in [
                    ("alloc_objects", "count"),
                    ("alloc_space", "bytes"),
                    ("inuse_objects", "count"),
                    ("inuse_space", "bytes"),
                ] {
                    sample_type.push(value_type(strings, t, u));
                }
                value_type(strings, "space", "bytes")
            }
            ProfileKind::Goroutine => {
                sample_type.push(value_type(strings, "goroutine", "count"));
                value_type(strings, "goroutine", "count")
            }
            ProfileKind::Cpu => {
                sample_type.push(value_type(strings, "cpu", "nanoseconds"));
                value_type(strings, "cpu", "nanoseconds")
            }
            ProfileKind::OffCpu => {
                sample_type.push(value_type(strings, "cpu", "nanoseconds"));
                sample_type.push(value_type(strings, "off_cpu", "nanoseconds"));
                default_sample_type = strings.get("off_cpu");
                value_type(strings, "cpu", "nanoseconds")
            }
            ProfileKind::Wall => {
                sample_type.push(value_type(strings, "wall", "nanoseconds"));
                default_sample_type = strings.get("wall");
                value_type(strings, "wall", "nanoseconds")
            }
            ProfileKind::PageFaults => {
                sample_type.push(value_type(strings, "page_faults", "count"));
                default_sample_type = strings.get("page_faults");
                value_type(strings, "page_faults", "count")
            }
            ProfileKind::Latency => {
                sample_type.push(value_type(strings, "latency", "nanoseconds"));
                default_sample_type = strings.get("latency");
                value_type(strings, "latency", "nanoseconds")
            }
        };
        Header {
            sample_type,
            period_type,
            default_sample_type,
        }
    }
}

/// One sample's message; its label strings join the table.
fn proto_sample(profile: &Profile, s: &super::Sample, strings: &mut Strings) -> proto::Sample {
    let cpu = s.count as i64 * profile.period_ns;
    let value = match profile.kind {
        ProfileKind::Cpu => vec![s.count as i64, cpu],
        ProfileKind::OffCpu => vec![s.count as i64, cpu, s.off_cpu_ns as i64],
        ProfileKind::Wall => vec![s.count as i64, profile.wall_ns(s) as i64],
        ProfileKind::Latency => vec![s.count as i64, s.off_cpu_ns as i64],
        ProfileKind::PageFaults => vec![s.count as i64, cpu],
        ProfileKind::Heap | ProfileKind::Goroutine => s.values.clone(),
    };
    let mut label: Vec<proto::Label> = s
        .labels
        .iter()
        .map(|(k, v)| proto::Label {
            key: strings.get(k),
            str: strings.get(v),
            ..Default::default()
        })
        .collect();
    for (k, n, unit) in &s.numeric_labels {
        label.push(proto::Label {
            key: strings.get(k),
            num: *n,
            num_unit: strings.get(unit),
            ..Default::default()
        });
    }
    proto::Sample {
        location_id: s.locations.iter().map(|&l| l as u64 + 1).collect(),
        value,
        label,
    }
}

/// Everything but the samples: mappings, locations, functions, comments
/// and the string table (which must come after every other user of it).
fn rest(profile: &Profile, header: Header, mut strings: Strings) -> proto::Profile {
    let has_lines = |mapping: usize| {
        profile
            .locations
            .iter()
            .any(|l| l.mapping == Some(mapping) && l.lines.iter().any(|line| line.line != 0))
    };
    let mapping = profile
        .mappings
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let lines = has_lines(i);
            proto::Mapping {
                id: i as u64 + 1,
                memory_start: m.start,
                memory_limit: m.limit,
                file_offset: m.file_offset,
                filename: strings.get(&m.file),
                build_id: strings.get(&m.build_id),
                has_functions: m.has_functions,
                has_filenames: lines,
                has_line_numbers: lines,
                has_inline_frames: lines,
            }
        })
        .collect();

    let location = profile
        .locations
        .iter()
        .enumerate()
        .map(|(i, l)| proto::Location {
            id: i as u64 + 1,
            mapping_id: l.mapping.map_or(0, |m| m as u64 + 1),
            address: l.address,
            line: l
                .lines
                .iter()
                .map(|line| proto::Line {
                    function_id: line.function as u64 + 1,
                    line: i64::from(line.line),
                    column: 0,
                })
                .collect(),
            is_folded: false,
        })
        .collect();

    let function = profile
        .functions
        .iter()
        .enumerate()
        .map(|(i, f)| proto::Function {
            id: i as u64 + 1,
            name: strings.get(&f.name),
            system_name: strings.get(if f.system_name.is_empty() {
                &f.name
            } else {
                &f.system_name
            }),
            filename: strings.get(&f.file),
            start_line: 0,
        })
        .collect();

    let comment = profile.comments.iter().map(|c| strings.get(c)).collect();

    proto::Profile {
        sample_type: header.sample_type,
        sample: Vec::new(),
        mapping,
        location,
        function,
        string_table: strings.table,
        time_nanos: profile.start_unix_ns,
        duration_nanos: profile.duration_ns,
        period_type: Some(header.period_type),
        period: profile.period_ns,
        comment,
        default_sample_type: header.default_sample_type,
        ..Default::default()
    }
}

/// The gzip-compressed protobuf bytes, as `go tool pprof` reads them.
///
/// Each sample is encoded and compressed as it is converted, so neither
/// all the samples' messages nor the whole uncompressed profile are ever
/// held at once: with tens of thousands of deep stacks those were most of
/// `record`'s peak memory. Protobuf lets a message's fields come in any
/// order and repeated ones be spread out, so the samples go first and the
/// rest (string table last) after them.
pub fn encode_gzip(profile: &Profile) -> std::io::Result<Vec<u8>> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    let mut strings = Strings::new();
    let header = Header::of(profile, &mut strings);
    let mut buffer = Vec::new();
    for sample in &profile.samples {
        buffer.clear();
        prost::encoding::message::encode(
            SAMPLE_FIELD,
            &proto_sample(profile, sample, &mut strings),
            &mut buffer,
        );
        gz.write_all(&buffer)?;
    }
    buffer.clear();
    prost::Message::encode(&rest(profile, header, strings), &mut buffer)
        .map_err(std::io::Error::other)?;
    gz.write_all(&buffer)?;
    gz.finish()
}

/// `Profile.sample`'s field number in profile.proto.
const SAMPLE_FIELD: u32 = 2;

/// Decodes gzip-compressed (or plain) pprof bytes; a broken gzip stream
/// or protobuf is `InvalidData`.
pub fn decode(bytes: &[u8]) -> std::io::Result<proto::Profile> {
    use std::io::Read;
    let mut plain = Vec::new();
    let data = if bytes.starts_with(&[0x1f, 0x8b]) {
        flate2::read::GzDecoder::new(bytes).read_to_end(&mut plain)?;
        &plain[..]
    } else {
        bytes
    };
    prost::Message::decode(data)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Function, Line, Location, Mapping, Sample};

    fn sample_profile() -> Profile {
        Profile {
            kind: ProfileKind::Cpu,
            start_unix_ns: 1_700_000_000_000_000_000,
            duration_ns: 10_000_000_000,
            period_ns: 10_000_000,
            mappings: vec![Mapping {
                start: 0x400000,
                limit: 0x500000,
                file_offset: 0,
                file: "/usr/bin/app".into(),
                build_id: "abcd".into(),
                has_functions: true,
            }],
            functions: vec![
                Function {
                    name: "main".into(),
                    system_name: String::new(),
                    file: "app.c".into(),
                },
                Function {
                    name: "hot".into(),
                    system_name: "_Z3hotv".into(),
                    file: "app.c".into(),
                },
            ],
            locations: vec![
                Location {
                    address: 0x401000,
                    mapping: Some(0),
                    lines: vec![Line {
                        function: 1,
                        line: 7,
                    }],
                    frame_type: crate::FrameType::Native,
                },
                Location {
                    address: 0x402000,
                    mapping: Some(0),
                    lines: vec![Line {
                        function: 0,
                        line: 20,
                    }],
                    frame_type: crate::FrameType::Native,
                },
            ],
            samples: vec![Sample {
                locations: vec![0, 1],
                count: 3,
                off_cpu_ns: 0,
                labels: vec![("pid".into(), "42".into()), ("comm".into(), "app".into())].into(),
                ..Default::default()
            }],
            comments: vec!["note".into()],
            stack_labels: Vec::new(),
        }
    }

    /// The sample types and each sample's values of an encoded profile,
    /// and its default sample type.
    fn types_and_values(profile: &Profile) -> (Vec<String>, Vec<Vec<i64>>, String) {
        let decoded = decode(&encode_gzip(profile).unwrap()).unwrap();
        let s = |i: i64| decoded.string_table[i as usize].clone();
        let types = decoded
            .sample_type
            .iter()
            .map(|t| format!("{}/{}", s(t.r#type), s(t.unit)))
            .collect();
        let values = decoded.sample.iter().map(|x| x.value.clone()).collect();
        (types, values, s(decoded.default_sample_type))
    }

    #[test]
    fn off_cpu_and_wall_profiles_have_their_own_sample_types() {
        let mut profile = sample_profile();
        let mut blocked = profile.samples[0].clone();
        blocked.count = 0;
        blocked.off_cpu_ns = 2_500_000;
        blocked.add_labels([("wait".into(), "lock".into())]);
        profile.samples.push(blocked);

        profile.kind = ProfileKind::OffCpu;
        let (types, values, default) = types_and_values(&profile);
        assert_eq!(
            types,
            ["samples/count", "cpu/nanoseconds", "off_cpu/nanoseconds"]
        );
        assert_eq!(values, [vec![3, 30_000_000, 0], vec![0, 0, 2_500_000]]);
        assert_eq!(default, "off_cpu");

        profile.kind = ProfileKind::Wall;
        let (types, values, default) = types_and_values(&profile);
        assert_eq!(types, ["samples/count", "wall/nanoseconds"]);
        assert_eq!(values, [vec![3, 30_000_000], vec![0, 2_500_000]]);
        assert_eq!(default, "wall");

        // Views count microseconds: 30 ms on-CPU and 2.5 ms blocked in
        // the same stack.
        let folded = crate::folded::encode(&profile);
        assert!(folded.ends_with(" 32500\n"), "{folded}");
        profile.kind = ProfileKind::OffCpu;
        let folded = crate::folded::encode(&profile);
        assert_eq!(folded.lines().count(), 1, "{folded}");
        assert!(folded.ends_with(" 2500\n"), "{folded}");
    }

    #[test]
    fn a_forged_name_or_comm_stays_on_its_folded_line() {
        let mut profile = sample_profile();
        profile.functions[1].name = "hot\nfake;stack 99".into();
        profile.samples[0].labels = vec![("comm".into(), "ev\nil;1\0".into())].into();
        let folded = crate::folded::encode(&profile);
        assert_eq!(folded.lines().count(), 1, "{folded}");
        assert!(
            folded.starts_with("ev?il:1?;") && folded.contains(";hot?fake:stack 99 3\n"),
            "{folded}"
        );
    }

    #[test]
    fn streamed_samples_decode_to_the_whole_message() {
        let mut profile = sample_profile();
        let mut other = profile.samples[0].clone();
        other.locations = vec![1];
        other.add_labels([("endpoint".into(), "/checkout".into())]);
        profile.samples.push(other);
        let decoded = decode(&encode_gzip(&profile).unwrap()).unwrap();
        assert_eq!(decoded, to_proto(&profile));
        assert_eq!(decoded.sample.len(), 2);
    }

    #[test]
    fn round_trips_through_prost() {
        let profile = sample_profile();
        let decoded = decode(&encode_gzip(&profile).unwrap()).unwrap();
        let s = |i: i64| decoded.string_table[i as usize].as_str();

        assert_eq!(decoded.string_table[0], "");
        let types: Vec<_> = decoded
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        let period_type = decoded.period_type.unwrap();
        assert_eq!(
            (s(period_type.r#type), s(period_type.unit)),
            ("cpu", "nanoseconds")
        );
        assert_eq!(decoded.period, 10_000_000);
        assert_eq!(decoded.time_nanos, profile.start_unix_ns);
        assert_eq!(decoded.duration_nanos, 10_000_000_000);

        assert_eq!(decoded.sample.len(), 1);
        let sample = &decoded.sample[0];
        assert_eq!(sample.value, [3, 30_000_000]);
        assert_eq!(sample.location_id, [1, 2]);
        let labels: Vec<_> = sample.label.iter().map(|l| (s(l.key), s(l.str))).collect();
        assert_eq!(labels, [("pid", "42"), ("comm", "app")]);

        let leaf = &decoded.location[0];
        assert_eq!((leaf.id, leaf.mapping_id, leaf.address), (1, 1, 0x401000));
        let function = &decoded.function[(leaf.line[0].function_id - 1) as usize];
        assert_eq!(
            (s(function.name), s(function.system_name)),
            ("hot", "_Z3hotv")
        );
        assert_eq!(leaf.line[0].line, 7);

        let mapping = &decoded.mapping[0];
        assert_eq!(
            (s(mapping.filename), s(mapping.build_id)),
            ("/usr/bin/app", "abcd")
        );
        assert!(mapping.has_functions && mapping.has_line_numbers);
        assert_eq!(s(decoded.comment[0]), "note");
    }
}
