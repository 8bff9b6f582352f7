//! OpenTelemetry profiles (OTLP `v1development`, proto 1.10): the same
//! model as pprof, written into one request whose dictionary (strings,
//! functions, locations, mappings, stacks, attributes) every resource's
//! profile shares.
//!
//! Shape, as the OpenTelemetry eBPF profiler sends it so backends that
//! accept one accept the other: one `ResourceProfiles` per resource (here
//! per service), one CPU `Profile` in it with `sample_type` samples/count
//! and `period_type` cpu/nanoseconds; per-sample attributes follow the
//! semantic conventions (`process.pid`, `thread.id`, `thread.name`,
//! `container.id`, `k8s.pod.name`, ...), and each location says whether it
//! is kernel or user code in `profile.frame.type`. A window with off-CPU
//! time has a second profile per resource, `sample_type` off_cpu/
//! nanoseconds (OTLP profiles carry one sample type each); a wall-clock
//! profile has one, wall/nanoseconds.

use std::collections::HashMap;
use std::hash::Hash;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development as otlp;
use opentelemetry_proto::tonic::resource::v1::Resource;

use super::{Profile, ProfileKind, Sample};

/// Which values of a profile one OTLP profile carries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Values {
    /// CPU samples (count).
    Cpu,
    /// Off-CPU nanoseconds.
    OffCpu,
    /// CPU samples as time plus off-CPU time.
    Wall,
    /// Operations begun at probe hits (count).
    Operations,
    /// Those operations' total latency (nanoseconds).
    Latency,
    /// A heap profile's value `i` (allocated objects and bytes, objects
    /// and bytes in use).
    Heap(usize),
    /// Goroutines (count).
    Goroutines,
    /// Page faults (samples × faults per sample).
    PageFaults,
}

impl Values {
    fn of(kind: ProfileKind) -> &'static [Values] {
        match kind {
            ProfileKind::Cpu => &[Values::Cpu],
            ProfileKind::OffCpu => &[Values::Cpu, Values::OffCpu],
            ProfileKind::Wall => &[Values::Wall],
            ProfileKind::Latency => &[Values::Operations, Values::Latency],
            ProfileKind::Heap => &[
                Values::Heap(0),
                Values::Heap(1),
                Values::Heap(2),
                Values::Heap(3),
            ],
            ProfileKind::Goroutine => &[Values::Goroutines],
            ProfileKind::PageFaults => &[Values::PageFaults],
        }
    }

    fn value(self, profile: &Profile, sample: &Sample) -> i64 {
        match self {
            Values::Cpu | Values::Operations => sample.count as i64,
            Values::OffCpu | Values::Latency => sample.off_cpu_ns as i64,
            Values::Wall => profile.wall_ns(sample) as i64,
            Values::Heap(i) => sample.values.get(i).copied().unwrap_or(0),
            Values::Goroutines => sample.values.first().copied().unwrap_or(0),
            Values::PageFaults => profile.view_value(sample) as i64,
        }
    }
}

/// One resource's profile: its attributes (`service.name`, ...) and the
/// profile of its samples.
pub struct ResourceProfile<'a> {
    pub attributes: Vec<(String, String)>,
    pub profile: &'a Profile,
}

/// Our label names and their OpenTelemetry attribute keys. Integer-valued
/// ones are sent as integers.
const LABEL_KEYS: &[(&str, &str, bool)] = &[
    ("pid", "process.pid", true),
    ("tid", "thread.id", true),
    ("thread", "thread.name", false),
    ("comm", "process.executable.name", false),
    ("container_id", "container.id", false),
    ("pod_uid", "k8s.pod.uid", false),
    ("pod", "k8s.pod.name", false),
    ("namespace", "k8s.namespace.name", false),
    ("container", "k8s.container.name", false),
    ("service_name", "service.name", false),
    ("node", "host.name", false),
];

/// The OpenTelemetry key of one of our labels (`container_id` →
/// `container.id`); unknown labels keep their name.
pub fn attribute_key(label: &str) -> &str {
    LABEL_KEYS
        .iter()
        .find(|(ours, _, _)| *ours == label)
        .map_or(label, |(_, key, _)| key)
}

fn attribute_value(label: &str, value: &str) -> AnyValue {
    let integer = LABEL_KEYS
        .iter()
        .any(|(ours, _, is_int)| *ours == label && *is_int);
    let value = match value.parse::<i64>() {
        Ok(n) if integer => any_value::Value::IntValue(n),
        _ => any_value::Value::StringValue(value.to_string()),
    };
    AnyValue { value: Some(value) }
}

/// Index 0 of every dictionary table is the "null" entry the spec
/// requires; `intern` hands out the others, each value once.
struct Table<K, V> {
    index: HashMap<K, i32>,
    items: Vec<V>,
}

impl<K: Eq + Hash, V: Default> Table<K, V> {
    fn new() -> Self {
        Table {
            index: HashMap::new(),
            items: vec![V::default()],
        }
    }

    fn intern(&mut self, key: K, make: impl FnOnce() -> V) -> i32 {
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let i = self.items.len() as i32;
        self.items.push(make());
        self.index.insert(key, i);
        i
    }
}

/// A location's identity: mapping, address, (function, line) per frame,
/// and its frame type's attribute.
type LocationKey = (i32, u64, Vec<(i32, i64)>, i32);

/// Builds the dictionary while profiles are converted.
struct Builder {
    strings: Table<String, String>,
    functions: Table<(i32, i32, i32), otlp::Function>,
    mappings: Table<(u64, u64, u64, i32, i32), otlp::Mapping>,
    locations: Table<LocationKey, otlp::Location>,
    stacks: Table<Vec<i32>, otlp::Stack>,
    attributes: Table<(i32, String), otlp::KeyValueAndUnit>,
}

impl Builder {
    fn new() -> Self {
        Builder {
            strings: Table::new(),
            functions: Table::new(),
            mappings: Table::new(),
            locations: Table::new(),
            stacks: Table::new(),
            attributes: Table::new(),
        }
    }

    fn string(&mut self, s: &str) -> i32 {
        if s.is_empty() {
            return 0;
        }
        self.strings.intern(s.to_string(), || s.to_string())
    }

    fn attribute(&mut self, key: &str, value: AnyValue) -> i32 {
        let key_index = self.string(key);
        // The value's identity: its debug form is exact for strings and
        // integers, the only kinds written here.
        let identity = format!("{:?}", value.value);
        self.attributes
            .intern((key_index, identity), || otlp::KeyValueAndUnit {
                key_strindex: key_index,
                value: Some(value),
                unit_strindex: 0,
            })
    }

    fn string_attribute(&mut self, key: &str, value: &str) -> i32 {
        self.attribute(
            key,
            AnyValue {
                value: Some(any_value::Value::StringValue(value.to_string())),
            },
        )
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> otlp::ValueType {
        otlp::ValueType {
            type_strindex: self.string(kind),
            unit_strindex: self.string(unit),
        }
    }

    /// Converts one profile; its strings, functions, ... join the shared
    /// dictionary.
    fn profile(
        &mut self,
        profile: &Profile,
        values: Values,
        resource_keys: &[&str],
    ) -> otlp::Profile {
        let functions: Vec<i32> = profile
            .functions
            .iter()
            .map(|f| {
                let key = (
                    self.string(&f.name),
                    self.string(&f.system_name),
                    self.string(&f.file),
                );
                self.functions.intern(key, || otlp::Function {
                    name_strindex: key.0,
                    system_name_strindex: key.1,
                    filename_strindex: key.2,
                    start_line: 0,
                })
            })
            .collect();
        let mappings: Vec<i32> = profile
            .mappings
            .iter()
            .map(|m| {
                let file = self.string(&m.file);
                let build_id = match build_id_key(&m.build_id) {
                    Some(key) => self.string_attribute(key, &m.build_id),
                    None => 0,
                };
                let key = (m.start, m.limit, m.file_offset, file, build_id);
                self.mappings.intern(key, || otlp::Mapping {
                    memory_start: m.start,
                    memory_limit: m.limit,
                    file_offset: m.file_offset,
                    filename_strindex: file,
                    attribute_indices: if build_id == 0 {
                        vec![]
                    } else {
                        vec![build_id]
                    },
                })
            })
            .collect();

        let locations: Vec<i32> = profile
            .locations
            .iter()
            .map(|l| {
                let mapping = l.mapping.map_or(0, |m| mappings[m]);
                let lines: Vec<(i32, i64)> = l
                    .lines
                    .iter()
                    .map(|line| (functions[line.function], i64::from(line.line)))
                    .collect();
                let frame_type = self.string_attribute(FRAME_TYPE, l.frame_type.as_str());
                let key = (mapping, l.address, lines.clone(), frame_type);
                self.locations.intern(key, || otlp::Location {
                    mapping_index: mapping,
                    address: l.address,
                    // Both formats list inlined frames innermost first.
                    lines: lines
                        .iter()
                        .map(|&(function_index, line)| otlp::Line {
                            function_index,
                            line,
                            column: 0,
                        })
                        .collect(),
                    attribute_indices: vec![frame_type],
                })
            })
            .collect();
        let samples = profile
            .samples
            .iter()
            .filter(|s| values.value(profile, s) > 0)
            .map(|s| {
                // Leaf first, as in pprof.
                let stack: Vec<i32> = s.locations.iter().map(|&l| locations[l]).collect();
                let stack_index = self.stacks.intern(stack.clone(), || otlp::Stack {
                    location_indices: stack,
                });
                // Labels the resource already carries (service, node) are
                // not repeated on every sample.
                let attribute_indices = s
                    .labels
                    .iter()
                    .filter(|(k, _)| !resource_keys.contains(&&**k))
                    .map(|(k, v)| self.attribute(attribute_key(k), attribute_value(k, v)))
                    .collect();
                otlp::Sample {
                    stack_index,
                    attribute_indices,
                    link_index: 0,
                    values: vec![values.value(profile, s)],
                    timestamps_unix_nano: vec![],
                }
            })
            .collect();
        let (sample_type, period_type, period) = match values {
            Values::Cpu => (
                ("samples", "count"),
                ("cpu", "nanoseconds"),
                profile.period_ns,
            ),
            Values::OffCpu => (("off_cpu", "nanoseconds"), ("off_cpu", "nanoseconds"), 0),
            Values::Operations => (("count", "count"), ("count", "count"), 0),
            Values::Latency => (("latency", "nanoseconds"), ("latency", "nanoseconds"), 0),
            Values::Wall => (
                ("wall", "nanoseconds"),
                ("cpu", "nanoseconds"),
                profile.period_ns,
            ),
            Values::Heap(i) => (
                [
                    ("alloc_objects", "count"),
                    ("alloc_space", "bytes"),
                    ("inuse_objects", "count"),
                    ("inuse_space", "bytes"),
                ][i.min(3)],
                ("space", "bytes"),
                profile.period_ns,
            ),
            Values::Goroutines => (("goroutine", "count"), ("goroutine", "count"), 1),
            Values::PageFaults => (
                ("page_faults", "count"),
                ("page_faults", "count"),
                profile.period_ns,
            ),
        };
        otlp::Profile {
            sample_type: Some(self.value_type(sample_type.0, sample_type.1)),
            samples,
            time_unix_nano: profile.start_unix_ns.max(0) as u64,
            duration_nano: profile.duration_ns.max(0) as u64,
            period_type: Some(self.value_type(period_type.0, period_type.1)),
            period,
            profile_id: random_id(),
            dropped_attributes_count: 0,
            original_payload_format: String::new(),
            original_payload: vec![],
            attribute_indices: vec![],
        }
    }

    fn dictionary(self) -> otlp::ProfilesDictionary {
        otlp::ProfilesDictionary {
            mapping_table: self.mappings.items,
            location_table: self.locations.items,
            function_table: self.functions.items,
            link_table: vec![otlp::Link::default()],
            string_table: self.strings.items,
            attribute_table: self.attributes.items,
            stack_table: self.stacks.items,
        }
    }
}

/// The semantic-convention key of a location's frame kind.
pub const FRAME_TYPE: &str = "profile.frame.type";

/// GNU build ids are hex; Go build ids (used when there is no GNU one) are
/// four slash-separated base64 hashes.
fn build_id_key(build_id: &str) -> Option<&'static str> {
    if build_id.is_empty() {
        None
    } else if build_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Some("process.executable.build_id.gnu")
    } else {
        Some("process.executable.build_id.go")
    }
}

/// A 16-byte random id (never all zeroes: the spec calls that invalid).
fn random_id() -> Vec<u8> {
    let mut id = fastrand::u128(..).to_le_bytes().to_vec();
    id[0] |= 1;
    id
}

/// One export request for a window: a resource per entry, the dictionary
/// shared.
pub fn export_request(
    resources: &[ResourceProfile<'_>],
    scope_version: &str,
) -> ExportProfilesServiceRequest {
    let mut builder = Builder::new();
    let resource_profiles = resources
        .iter()
        .map(|r| otlp::ResourceProfiles {
            resource: Some(Resource {
                attributes: r
                    .attributes
                    .iter()
                    .map(|(k, v)| KeyValue {
                        key: attribute_key(k).to_string(),
                        value: Some(attribute_value(k, v)),
                        key_strindex: 0,
                    })
                    .collect(),
                dropped_attributes_count: 0,
                entity_refs: vec![],
            }),
            scope_profiles: vec![otlp::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "profiler-agent".into(),
                    version: scope_version.to_string(),
                    attributes: vec![],
                    dropped_attributes_count: 0,
                }),
                profiles: Values::of(r.profile.kind)
                    .iter()
                    .map(|&values| {
                        builder.profile(
                            r.profile,
                            values,
                            &r.attributes
                                .iter()
                                .map(|(k, _)| k.as_str())
                                .collect::<Vec<_>>(),
                        )
                    })
                    .collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(builder.dictionary()),
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::{Function, Line, Location, Mapping};

    fn profile(pid: &str) -> Profile {
        Profile {
            kind: ProfileKind::Cpu,
            start_unix_ns: 1_700_000_000_000_000_000,
            duration_ns: 15_000_000_000,
            period_ns: 10_000_000,
            mappings: vec![Mapping {
                start: 0x1000,
                limit: 0x9000,
                file: "/usr/bin/app".into(),
                build_id: "abcdef0123".into(),
                has_functions: true,
                ..Mapping::default()
            }],
            functions: vec![
                Function {
                    name: "main".into(),
                    system_name: "main".into(),
                    file: "app.c".into(),
                },
                Function {
                    name: "work".into(),
                    system_name: "work".into(),
                    file: "app.c".into(),
                },
                Function {
                    name: "vfs_read".into(),
                    ..Function::default()
                },
            ],
            locations: vec![
                Location {
                    address: 0x1100,
                    mapping: Some(0),
                    lines: vec![Line {
                        function: 0,
                        line: 3,
                    }],
                    frame_type: crate::FrameType::Native,
                },
                Location {
                    address: 0x1200,
                    mapping: Some(0),
                    // `work` inlined into `main`: innermost first.
                    lines: vec![
                        Line {
                            function: 1,
                            line: 9,
                        },
                        Line {
                            function: 0,
                            line: 4,
                        },
                    ],
                    frame_type: crate::FrameType::Native,
                },
                Location {
                    address: 0xffff_ffff_8100_0000,
                    mapping: None,
                    lines: vec![Line {
                        function: 2,
                        line: 0,
                    }],
                    frame_type: crate::FrameType::Kernel,
                },
            ],
            samples: vec![
                Sample {
                    locations: vec![1, 0],
                    count: 7,
                    off_cpu_ns: 0,
                    labels: vec![("pid".into(), pid.into()), ("comm".into(), "app".into())].into(),
                    ..Default::default()
                },
                Sample {
                    locations: vec![2, 1, 0],
                    count: 2,
                    off_cpu_ns: 0,
                    labels: vec![
                        ("pid".into(), pid.into()),
                        ("thread".into(), "worker".into()),
                        ("service_name".into(), "app2".into()),
                    ]
                    .into(),
                    ..Default::default()
                },
            ],
            comments: vec![],
            stack_labels: Vec::new(),
        }
    }

    #[test]
    fn off_cpu_time_is_a_second_profile_per_resource() {
        let mut p = profile("10");
        p.kind = ProfileKind::OffCpu;
        let mut blocked = p.samples[0].clone();
        blocked.count = 0;
        blocked.off_cpu_ns = 4_000_000;
        blocked.add_labels([("wait".into(), "lock".into())]);
        p.samples.push(blocked);
        let request = export_request(
            &[ResourceProfile {
                attributes: vec![("service_name".into(), "app".into())],
                profile: &p,
            }],
            "1.0",
        );
        let d = request.dictionary.as_ref().unwrap();
        let s = |i: i32| d.string_table[i as usize].as_str();
        let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
        let types: Vec<(&str, &str, Vec<i64>)> = profiles
            .iter()
            .map(|p| {
                let t = p.sample_type.unwrap();
                (
                    s(t.type_strindex),
                    s(t.unit_strindex),
                    p.samples.iter().map(|x| x.values[0]).collect(),
                )
            })
            .collect();
        assert_eq!(
            types,
            [
                ("samples", "count", vec![7, 2]),
                ("off_cpu", "nanoseconds", vec![4_000_000]),
            ]
        );
    }

    #[test]
    fn round_trips_through_the_wire_format() {
        let (a, b) = (profile("10"), profile("20"));
        let request = export_request(
            &[
                ResourceProfile {
                    attributes: vec![("service_name".into(), "app".into())],
                    profile: &a,
                },
                ResourceProfile {
                    attributes: vec![
                        ("service_name".into(), "app2".into()),
                        ("container_id".into(), "c0ffee".into()),
                    ],
                    profile: &b,
                },
            ],
            "1.0",
        );
        let bytes = request.encode_to_vec();
        let decoded = ExportProfilesServiceRequest::decode(bytes.as_slice()).unwrap();
        let d = decoded.dictionary.as_ref().unwrap();
        // The zero entries the spec requires.
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.mapping_table[0], otlp::Mapping::default());
        assert_eq!(d.location_table[0], otlp::Location::default());
        assert_eq!(d.function_table[0], otlp::Function::default());
        assert_eq!(d.stack_table[0], otlp::Stack::default());
        assert_eq!(d.attribute_table[0], otlp::KeyValueAndUnit::default());
        assert_eq!(d.link_table.len(), 1);
        // Shared dictionary: the second resource reuses the first's entries.
        assert_eq!(d.function_table.len(), 4);
        assert_eq!(d.location_table.len(), 4);
        assert_eq!(d.stack_table.len(), 3);

        let s = |i: i32| d.string_table[i as usize].as_str();
        assert_eq!(decoded.resource_profiles.len(), 2);
        let resource = decoded.resource_profiles[1].resource.as_ref().unwrap();
        let attrs: Vec<(&str, String)> = resource
            .attributes
            .iter()
            .map(|kv| {
                (
                    kv.key.as_str(),
                    format!("{:?}", kv.value.as_ref().unwrap().value),
                )
            })
            .collect();
        assert_eq!(attrs[0].0, "service.name");
        assert!(attrs[0].1.contains("app2"));
        assert_eq!(attrs[1].0, "container.id");

        let p = &decoded.resource_profiles[1].scope_profiles[0].profiles[0];
        let sample_type = p.sample_type.unwrap();
        assert_eq!(
            (s(sample_type.type_strindex), s(sample_type.unit_strindex)),
            ("samples", "count")
        );
        let period_type = p.period_type.unwrap();
        assert_eq!(
            (s(period_type.type_strindex), s(period_type.unit_strindex)),
            ("cpu", "nanoseconds")
        );
        assert_eq!(p.period, 10_000_000);
        assert_eq!(p.duration_nano, 15_000_000_000);
        assert_eq!(p.profile_id.len(), 16);

        // The second sample: kernel leaf, then work inlined in main.
        let sample = &p.samples[1];
        assert_eq!(sample.values, [2]);
        let stack = &d.stack_table[sample.stack_index as usize];
        let names: Vec<Vec<&str>> = stack
            .location_indices
            .iter()
            .map(|&l| {
                d.location_table[l as usize]
                    .lines
                    .iter()
                    .map(|line| s(d.function_table[line.function_index as usize].name_strindex))
                    .collect()
            })
            .collect();
        assert_eq!(
            names,
            [vec!["vfs_read"], vec!["work", "main"], vec!["main"]]
        );
        let frame_type = |l: i32| {
            let attr =
                &d.attribute_table[d.location_table[l as usize].attribute_indices[0] as usize];
            assert_eq!(s(attr.key_strindex), FRAME_TYPE);
            format!("{:?}", attr.value.as_ref().unwrap().value)
        };
        assert!(frame_type(stack.location_indices[0]).contains("kernel"));
        assert!(frame_type(stack.location_indices[1]).contains("native"));
        let user = &d.location_table[stack.location_indices[1] as usize];
        let mapping = &d.mapping_table[user.mapping_index as usize];
        assert_eq!(s(mapping.filename_strindex), "/usr/bin/app");
        let build_id = &d.attribute_table[mapping.attribute_indices[0] as usize];
        assert_eq!(s(build_id.key_strindex), "process.executable.build_id.gnu");

        let attrs: Vec<(&str, Option<any_value::Value>)> = sample
            .attribute_indices
            .iter()
            .map(|&i| {
                let a = &d.attribute_table[i as usize];
                (s(a.key_strindex), a.value.clone().unwrap().value)
            })
            .collect();
        assert_eq!(
            attrs,
            [
                ("process.pid", Some(any_value::Value::IntValue(20))),
                (
                    "thread.name",
                    Some(any_value::Value::StringValue("worker".into()))
                ),
            ]
        );
    }

    #[test]
    fn go_build_ids_and_unknown_labels() {
        assert_eq!(build_id_key(""), None);
        assert_eq!(
            build_id_key("aB3_x/yZ/q1/w2"),
            Some("process.executable.build_id.go")
        );
        assert_eq!(attribute_key("custom"), "custom");
        assert_ne!(random_id(), random_id());
    }
}
