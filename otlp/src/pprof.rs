//! Memory profiles as pprof (`profile.proto` of github.com/google/pprof): live bytes and counts
//! by Python stack, the format Pyroscope, Parca, Grafana (through them) and `go tool pprof`
//! read. The messages are declared here, field for field, from profile.proto; samples carry
//! two values like Go's heap profiles (`inuse_objects`/count, `inuse_space`/bytes, the latter
//! the default) and labels for the memory's layer and device.

use std::collections::HashMap;

use gpuprof_model::event::Frame;
use prost::Message;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
    #[prost(int64, tag = "15")]
    pub doc_url: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Leaf (innermost) first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
    #[prost(int64, tag = "3")]
    pub column: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// The function name a sample gets for memory without a Python stack (a C++ or autograd thread).
pub(crate) const NO_PYTHON_STACK: &str = "(no Python stack)";
/// The function name of the one sample that sums the stacks left out of a bounded profile.
pub(crate) const OTHER_STACKS: &str = "(other stacks)";

/// One row of a memory profile: what one stack holds, in one layer and on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct StackSample<'a> {
    /// Innermost first; empty for memory without a Python stack.
    pub stack: &'a [Frame],
    pub bytes: u64,
    pub count: u64,
    /// `allocator` (tensors) or `driver`.
    pub layer: &'static str,
    pub device: Option<i32>,
}

/// Python's names of code that is no function (`<module>`, `<listcomp>`, `<lambda>`) as pprof
/// shows them: pprof shortens names by dropping what stands in angle brackets (C++ templates),
/// which would leave nothing. No Python name has parentheses, so `(module)` reads back as
/// `<module>` unambiguously.
fn pprof_name(function: &str) -> std::borrow::Cow<'_, str> {
    match function.strip_prefix('<').and_then(|f| f.strip_suffix('>')) {
        Some(inner) if !inner.contains(['<', '>']) => format!("({inner})").into(),
        _ => function.into(),
    }
}

fn python_name(function: String) -> String {
    match function.strip_prefix('(').and_then(|f| f.strip_suffix(')')) {
        Some(inner) if function != NO_PYTHON_STACK && function != OTHER_STACKS => format!("<{inner}>"),
        _ => function,
    }
}

/// Builds a profile from its samples; `other` (bytes, count) becomes one more sample under
/// [`OTHER_STACKS`] when not zero.
#[derive(Default)]
pub struct ProfileBuilder {
    profile: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    locations: HashMap<(u64, u32), u64>,
}

impl ProfileBuilder {
    pub fn new(time_ns: u64) -> Self {
        ProfileBuilder::of_program(time_ns, "python")
    }

    /// `program`: what the profile is of (pprof's main mapping, which viewers show as its title).
    pub(crate) fn of_program(time_ns: u64, program: &str) -> Self {
        let mut builder = ProfileBuilder::default();
        builder.string(""); // pprof: string 0 is the empty string
        let filename = builder.string(program);
        builder.profile.mapping = vec![Mapping {
            id: 1,
            filename,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            ..Default::default()
        }];
        let (objects, count, space, bytes) = (
            builder.string("inuse_objects"),
            builder.string("count"),
            builder.string("inuse_space"),
            builder.string("bytes"),
        );
        builder.profile.sample_type =
            vec![ValueType { r#type: objects, unit: count }, ValueType { r#type: space, unit: bytes }];
        builder.profile.default_sample_type = space;
        builder.profile.period_type = Some(ValueType { r#type: space, unit: bytes });
        builder.profile.period = 1;
        builder.profile.time_nanos = time_ns as i64;
        builder
    }

    fn string(&mut self, text: &str) -> i64 {
        if let Some(&id) = self.strings.get(text) {
            return id;
        }
        let id = self.profile.string_table.len() as i64;
        self.profile.string_table.push(text.to_string());
        self.strings.insert(text.to_string(), id);
        id
    }

    fn location(&mut self, function: &str, file: &str, line: u32) -> u64 {
        let function_id = match self.functions.get(&(function.to_string(), file.to_string())) {
            Some(&id) => id,
            None => {
                let id = self.profile.function.len() as u64 + 1;
                let (name, filename) = (self.string(&pprof_name(function)), self.string(file));
                self.profile.function.push(Function { id, name, system_name: name, filename, start_line: 0 });
                self.functions.insert((function.to_string(), file.to_string()), id);
                id
            }
        };
        *self.locations.entry((function_id, line)).or_insert_with(|| {
            let id = self.profile.location.len() as u64 + 1;
            self.profile.location.push(Location {
                id,
                mapping_id: 1,
                line: vec![Line { function_id, line: i64::from(line), column: 0 }],
                ..Default::default()
            });
            id
        })
    }

    pub fn add(&mut self, sample: &StackSample<'_>) {
        let location_id: Vec<u64> = if sample.stack.is_empty() {
            vec![self.location(NO_PYTHON_STACK, "", 0)]
        } else {
            sample.stack.iter().map(|f| self.location(&f.function, &f.file, f.line)).collect()
        };
        self.push(location_id, sample.bytes, sample.count, sample.layer, sample.device);
    }

    /// What the stacks left out hold, in one sample.
    pub(crate) fn add_other(&mut self, bytes: u64, count: u64, layer: &'static str, device: Option<i32>) {
        let location = self.location(OTHER_STACKS, "", 0);
        self.push(vec![location], bytes, count, layer, device);
    }

    fn push(&mut self, location_id: Vec<u64>, bytes: u64, count: u64, layer: &'static str, device: Option<i32>) {
        let (layer_key, layer_value) = (self.string("layer"), self.string(layer));
        let mut label = vec![Label { key: layer_key, str: layer_value, ..Default::default() }];
        if let Some(device) = device {
            label.push(Label { key: self.string("device"), num: i64::from(device), ..Default::default() });
        }
        self.profile.sample.push(Sample { location_id, value: vec![count as i64, bytes as i64], label });
    }

    pub fn finish(self) -> Profile {
        self.profile
    }
}

/// A profile's samples as (stack innermost first, bytes, count), by decoding what `ProfileBuilder`
/// made (or any pprof with two sample values).
pub fn samples(profile: &Profile) -> Vec<(Vec<Frame>, u64, u64)> {
    top_samples(profile, usize::MAX)
}

/// The `n` samples holding the most bytes, largest first (ties: in the profile's order); only
/// those are turned into frames.
pub fn top_samples(profile: &Profile, n: usize) -> Vec<(Vec<Frame>, u64, u64)> {
    let text = |i: i64| profile.string_table.get(i as usize).cloned().unwrap_or_default();
    let functions: HashMap<u64, &Function> = profile.function.iter().map(|f| (f.id, f)).collect();
    let locations: HashMap<u64, &Location> = profile.location.iter().map(|l| (l.id, l)).collect();
    let space = profile.sample_type.iter().position(|t| text(t.r#type) == "inuse_space").unwrap_or(1);
    let objects = profile.sample_type.iter().position(|t| text(t.r#type) == "inuse_objects").unwrap_or(0);
    let bytes_of = |sample: &Sample| sample.value.get(space).copied().unwrap_or(0).max(0);
    let mut order: Vec<&Sample> = profile.sample.iter().collect();
    if n < order.len() {
        order.sort_by_key(|s| std::cmp::Reverse(bytes_of(s)));
        order.truncate(n);
    }
    order
        .into_iter()
        .map(|sample| {
            let frames = sample
                .location_id
                .iter()
                .filter_map(|id| locations.get(id))
                .flat_map(|l| &l.line)
                .filter_map(|line| functions.get(&line.function_id).map(|f| (f, line.line)))
                .map(|(f, line)| Frame {
                    function: python_name(text(f.name)),
                    file: text(f.filename),
                    line: line as u32,
                })
                .collect();
            let value = |i: usize| sample.value.get(i).copied().unwrap_or(0).max(0) as u64;
            (frames, value(space), value(objects))
        })
        .collect()
}

/// Encodes a profile for the wire, gzipped as pprof files are (every pprof reader takes it).
pub fn encode(profile: &Profile) -> Vec<u8> {
    use std::io::Write;
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gzip.write_all(&profile.encode_to_vec()).expect("writing to memory cannot fail");
    gzip.finish().expect("writing to memory cannot fail")
}

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not gzip: {0}")]
    Gzip(std::io::Error),
    #[error("not a pprof profile: {0}")]
    Protobuf(prost::DecodeError),
}

/// Decodes a pprof profile, gzipped or not.
pub fn decode(bytes: &[u8]) -> Result<Profile, DecodeError> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        use std::io::Read;
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(bytes).read_to_end(&mut raw).map_err(DecodeError::Gzip)?;
        Profile::decode(&raw[..]).map_err(DecodeError::Protobuf)
    } else {
        Profile::decode(bytes).map_err(DecodeError::Protobuf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, line: u32) -> Frame {
        Frame { function: function.into(), file: "/srv/train.py".into(), line }
    }

    #[test]
    fn samples_come_back_with_their_stacks_bytes_and_counts() {
        let stack = [frame("Linear.forward", 128), frame("train", 220), frame("<module>", 300)];
        let mut builder = ProfileBuilder::new(1_800_000_000_000_000_000);
        builder.add(&StackSample { stack: &stack, bytes: 3 << 20, count: 3, layer: "allocator", device: Some(0) });
        builder.add(&StackSample { stack: &[], bytes: 4096, count: 1, layer: "allocator", device: Some(0) });
        builder.add_other(512, 2, "allocator", Some(0));
        let encoded = encode(&builder.finish());
        assert_eq!(&encoded[..2], &[0x1f, 0x8b]);
        let profile = decode(&encoded).unwrap();
        assert_eq!(top_samples(&profile, 1), vec![(stack.to_vec(), 3 << 20, 3)]);
        assert_eq!(profile.string_table[0], "");
        assert_eq!(profile.string_table[profile.default_sample_type as usize], "inuse_space");
        assert_eq!(
            samples(&profile),
            vec![
                (stack.to_vec(), 3 << 20, 3),
                (vec![Frame { function: NO_PYTHON_STACK.into(), file: String::new(), line: 0 }], 4096, 1),
                (vec![Frame { function: OTHER_STACKS.into(), file: String::new(), line: 0 }], 512, 2),
            ]
        );
        // Locations and functions are shared between samples; pprof sees `(module)`.
        assert_eq!(profile.location.len(), 5);
        assert_eq!(profile.function.len(), 5);
        assert!(
            profile.string_table.iter().any(|s| s == "(module)")
                && !profile.string_table.iter().any(|s| s == "<module>")
        );
        assert_eq!(profile.string_table[profile.mapping[0].filename as usize], "python");
        assert!(profile.location.iter().all(|l| l.id != 0) && profile.function.iter().all(|f| f.id != 0));
    }
}
