//! A GGUF writer for tests that can also write every kind of wrong file: raw keys and names,
//! overridden counts, any type id, any offsets, a data section of any length.

#![allow(dead_code)]

use webshard::gguf::{parse_file, GgmlType, GgufError};

/// The error a malformed whole file gives; parsing it successfully fails the test.
pub fn fail(bytes: &[u8]) -> GgufError {
    match parse_file(bytes) {
        Ok(header) => panic!("parsed a malformed file: {header:?}"),
        Err(err) => err,
    }
}

pub const T_U8: u32 = 0;
pub const T_I8: u32 = 1;
pub const T_U16: u32 = 2;
pub const T_I16: u32 = 3;
pub const T_U32: u32 = 4;
pub const T_I32: u32 = 5;
pub const T_F32: u32 = 6;
pub const T_BOOL: u32 = 7;
pub const T_STRING: u32 = 8;
pub const T_ARRAY: u32 = 9;
pub const T_U64: u32 = 10;
pub const T_I64: u32 = 11;
pub const T_F64: u32 = 12;

/// A value as (type id, encoded payload).
pub type Raw = (u32, Vec<u8>);

pub fn string_bytes(s: &[u8]) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(s);
    out
}

pub fn v_u8(v: u8) -> Raw {
    (T_U8, vec![v])
}
pub fn v_u32(v: u32) -> Raw {
    (T_U32, v.to_le_bytes().to_vec())
}
pub fn v_u64(v: u64) -> Raw {
    (T_U64, v.to_le_bytes().to_vec())
}
pub fn v_str(s: &str) -> Raw {
    (T_STRING, string_bytes(s.as_bytes()))
}
pub fn v_bool_byte(b: u8) -> Raw {
    (T_BOOL, vec![b])
}

/// `depth` levels of one-element arrays around a u8.
pub fn nested_arrays(depth: usize) -> Raw {
    let mut raw = v_array(vec![v_u8(1)]);
    for _ in 1..depth {
        raw = v_array(vec![raw]);
    }
    raw
}

/// An array with an explicit count (which may disagree with the items, for defects).
pub fn v_array_raw(element_type: u32, count: u64, items: &[Vec<u8>]) -> Raw {
    let mut out = element_type.to_le_bytes().to_vec();
    out.extend_from_slice(&count.to_le_bytes());
    for item in items {
        out.extend_from_slice(item);
    }
    (T_ARRAY, out)
}

/// A well-formed array of values of one type.
pub fn v_array(items: Vec<Raw>) -> Raw {
    let element_type = items.first().map_or(T_U8, |(t, _)| *t);
    let payloads: Vec<Vec<u8>> = items.into_iter().map(|(_, p)| p).collect();
    v_array_raw(element_type, payloads.len() as u64, &payloads)
}

#[derive(Clone)]
pub struct Kv {
    pub key: Vec<u8>,
    pub raw: Raw,
}

#[derive(Clone)]
pub struct Tensor {
    pub name: Vec<u8>,
    /// Written as n_dims unless overridden.
    pub dims: Vec<u64>,
    pub n_dims: Option<u32>,
    pub type_id: u32,
    /// Relative to the data section.
    pub offset: u64,
}

#[derive(Clone)]
pub struct GgufBuilder {
    pub magic: [u8; 4],
    pub version: u32,
    pub n_tensors: Option<u64>,
    pub n_kv: Option<u64>,
    pub kvs: Vec<Kv>,
    pub tensors: Vec<Tensor>,
    /// Used for padding; add a `general.alignment` kv separately to declare it.
    pub alignment: u64,
    /// Data section length; by default just enough for every tensor of a known type.
    pub data_len: Option<u64>,
}

/// A named byte range of the written file.
#[derive(Debug, Clone)]
pub struct Section {
    pub name: String,
    pub start: usize,
    pub end: usize,
}

pub struct Built {
    pub bytes: Vec<u8>,
    pub sections: Vec<Section>,
    pub header_end: usize,
    pub data_offset: usize,
}

impl Built {
    /// The section holding byte `cut`, and the words an error's context may use for it.
    pub fn section_at(&self, cut: usize) -> (&Section, Vec<String>) {
        let (mut kvs, mut tensors) = (0, 0);
        for section in &self.sections {
            let name = section.name.as_str();
            let words = if name == "tensor count" || name == "metadata key count" {
                vec![name.to_string()]
            } else if let Some(key) = name.strip_prefix("kv ") {
                kvs += 1;
                vec![format!("`{key}`"), format!("metadata entry #{}", kvs - 1)]
            } else if let Some(tensor) = name.strip_prefix("tensor ") {
                tensors += 1;
                vec![
                    format!("`{tensor}`"),
                    format!("tensor info #{}", tensors - 1),
                ]
            } else {
                vec![name.to_string()]
            };
            if section.start <= cut && cut < section.end {
                return (section, words);
            }
        }
        panic!("byte {cut} is past the file");
    }
}

impl GgufBuilder {
    pub fn empty() -> GgufBuilder {
        GgufBuilder {
            magic: *b"GGUF",
            version: 3,
            n_tensors: None,
            n_kv: None,
            kvs: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
            data_len: None,
        }
    }

    /// A small valid model: two keys, an F32 tensor and a Q8_0 tensor.
    pub fn valid() -> GgufBuilder {
        GgufBuilder::empty()
            .kv("general.architecture", v_str("test"))
            .kv("test.block_count", v_u32(2))
            .tensor("a", &[8, 2], GgmlType::F32.id(), 0)
            .tensor("b", &[32, 1], GgmlType::Q8_0.id(), 64)
    }

    pub fn kv(self, key: &str, raw: Raw) -> GgufBuilder {
        self.kv_raw_key(key.as_bytes(), raw)
    }

    pub fn kv_raw_key(mut self, key: &[u8], raw: Raw) -> GgufBuilder {
        self.kvs.push(Kv {
            key: key.to_vec(),
            raw,
        });
        self
    }

    pub fn tensor(self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> GgufBuilder {
        self.tensor_raw_name(name.as_bytes(), dims, type_id, offset)
    }

    pub fn tensor_raw_name(
        mut self,
        name: &[u8],
        dims: &[u64],
        type_id: u32,
        offset: u64,
    ) -> GgufBuilder {
        self.tensors.push(Tensor {
            name: name.to_vec(),
            dims: dims.to_vec(),
            n_dims: None,
            type_id,
            offset,
        });
        self
    }

    fn default_data_len(&self) -> u64 {
        self.tensors
            .iter()
            .filter_map(|t| {
                let ty = GgmlType::from_id(t.type_id)?;
                let n = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
                t.offset.checked_add(ty.bytes_for(n)?)
            })
            .max()
            .unwrap_or(0)
    }

    pub fn build(&self) -> Built {
        let mut w = Writer::default();
        w.section("magic", &self.magic);
        w.section("version", &self.version.to_le_bytes());
        let n_tensors = self.n_tensors.unwrap_or(self.tensors.len() as u64);
        let n_kv = self.n_kv.unwrap_or(self.kvs.len() as u64);
        w.section("tensor count", &n_tensors.to_le_bytes());
        w.section("metadata key count", &n_kv.to_le_bytes());
        for kv in &self.kvs {
            let mut bytes = string_bytes(&kv.key);
            bytes.extend_from_slice(&kv.raw.0.to_le_bytes());
            bytes.extend_from_slice(&kv.raw.1);
            w.section(&format!("kv {}", String::from_utf8_lossy(&kv.key)), &bytes);
        }
        for t in &self.tensors {
            w.section(
                &format!("tensor {}", String::from_utf8_lossy(&t.name)),
                &tensor_info_bytes(t),
            );
        }
        let header_end = w.bytes.len();
        let data_offset = header_end.div_ceil(self.alignment as usize) * self.alignment as usize;
        w.section("padding", &vec![0u8; data_offset - header_end]);
        let data_len = self.data_len.unwrap_or_else(|| self.default_data_len());
        let data: Vec<u8> = (0..data_len).map(|i| (i % 251) as u8).collect();
        w.section("data", &data);
        Built {
            bytes: w.bytes,
            sections: w.sections,
            header_end,
            data_offset,
        }
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.build().bytes
    }
}

fn tensor_info_bytes(t: &Tensor) -> Vec<u8> {
    let mut bytes = string_bytes(&t.name);
    let n_dims = t.n_dims.unwrap_or(t.dims.len() as u32);
    bytes.extend_from_slice(&n_dims.to_le_bytes());
    for d in &t.dims {
        bytes.extend_from_slice(&d.to_le_bytes());
    }
    bytes.extend_from_slice(&t.type_id.to_le_bytes());
    bytes.extend_from_slice(&t.offset.to_le_bytes());
    bytes
}

#[derive(Default)]
struct Writer {
    bytes: Vec<u8>,
    sections: Vec<Section>,
}

impl Writer {
    fn section(&mut self, name: &str, bytes: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(bytes);
        self.sections.push(Section {
            name: name.to_string(),
            start,
            end: self.bytes.len(),
        });
    }
}
