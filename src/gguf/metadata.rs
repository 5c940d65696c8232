//! Metadata values and the ordered key → value map with typed getters.

use std::collections::HashMap;

use super::error::GgufError;

/// One metadata value. GGUF arrays are homogeneous; nested arrays are allowed.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// The GGUF type name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// Any integer variant widened losslessly; `None` for non-integers.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// Metadata key → value, in file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Adds a key; a key already present is an error (GGUF keys are unique).
    pub fn insert(&mut self, key: String, value: Value) -> Result<(), GgufError> {
        if self.index.contains_key(&key) {
            return Err(GgufError::DuplicateKey { key, offset: 0 });
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        integer(key, self.require(key)?)
    }
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        integer(key, self.require(key)?)
    }
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        integer(key, self.require(key)?)
    }
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        float(key, self.require(key)?)
    }
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        boolean(key, self.require(key)?)
    }
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        string(key, self.require(key)?)
    }
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        array_of(key, self.require(key)?, string)
    }
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        array_of(key, self.require(key)?, float)
    }
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        array_of(key, self.require(key)?, integer)
    }
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>, GgufError> {
        array_of(key, self.require(key)?, integer)
    }

    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.optional(key, Self::get_u32)
    }
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.optional(key, Self::get_u64)
    }
    pub fn opt_i32(&self, key: &str) -> Result<Option<i32>, GgufError> {
        self.optional(key, Self::get_i32)
    }
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.optional(key, Self::get_f32)
    }
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.optional(key, Self::get_bool)
    }
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.optional(key, Self::get_str)
    }
    pub fn opt_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        self.optional(key, Self::get_str_array)
    }
    pub fn opt_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>, GgufError> {
        self.optional(key, Self::get_f32_array)
    }
    pub fn opt_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>, GgufError> {
        self.optional(key, Self::get_i32_array)
    }
    pub fn opt_u32_array(&self, key: &str) -> Result<Option<Vec<u32>>, GgufError> {
        self.optional(key, Self::get_u32_array)
    }

    fn optional<'a, T>(
        &'a self,
        key: &str,
        getter: impl FnOnce(&'a Self, &str) -> Result<T, GgufError>,
    ) -> Result<Option<T>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => getter(self, key).map(Some),
        }
    }
}

fn wrong_type(key: &str, expected: &'static str, found: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_name(),
    }
}

/// Accepts any integer variant whose value fits `T`, since writers differ in the width they use.
fn integer<T: TryFrom<i128>>(key: &str, value: &Value) -> Result<T, GgufError> {
    let wide = value
        .as_integer()
        .ok_or_else(|| wrong_type(key, "an integer", value))?;
    T::try_from(wide).map_err(|_| GgufError::OutOfRange {
        key: key.to_string(),
        value: wide.to_string(),
        target: std::any::type_name::<T>(),
    })
}

fn float(key: &str, value: &Value) -> Result<f32, GgufError> {
    match *value {
        Value::F32(v) => Ok(v),
        Value::F64(v) => Ok(v as f32),
        _ => Err(wrong_type(key, "f32 or f64", value)),
    }
}

fn boolean(key: &str, value: &Value) -> Result<bool, GgufError> {
    match *value {
        Value::Bool(v) => Ok(v),
        _ => Err(wrong_type(key, "bool", value)),
    }
}

fn string<'a>(key: &str, value: &'a Value) -> Result<&'a str, GgufError> {
    value
        .as_str()
        .ok_or_else(|| wrong_type(key, "string", value))
}

fn array_of<'a, T>(
    key: &str,
    value: &'a Value,
    element: impl Fn(&str, &'a Value) -> Result<T, GgufError>,
) -> Result<Vec<T>, GgufError> {
    let items = value
        .as_array()
        .ok_or_else(|| wrong_type(key, "array", value))?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| element(&format!("{key}[{i}]"), item))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Metadata {
        let mut m = Metadata::new();
        m.insert("a.u8".into(), Value::U8(7)).unwrap();
        m.insert("a.neg".into(), Value::I64(-1)).unwrap();
        m.insert("a.big".into(), Value::U64(1 << 40)).unwrap();
        m.insert("a.f64".into(), Value::F64(0.5)).unwrap();
        m.insert(
            "a.strs".into(),
            Value::Array(vec![Value::String("x".into()), Value::U8(1)]),
        )
        .unwrap();
        m
    }

    #[test]
    fn integer_getters_widen_and_range_check() {
        let m = sample();
        assert_eq!(m.get_u32("a.u8").unwrap(), 7);
        assert_eq!(m.get_u64("a.big").unwrap(), 1 << 40);
        assert!(
            matches!(m.get_u32("a.big"), Err(GgufError::OutOfRange { key, .. }) if key == "a.big")
        );
        assert!(matches!(
            m.get_u64("a.neg"),
            Err(GgufError::OutOfRange { .. })
        ));
        assert_eq!(m.get_f32("a.f64").unwrap(), 0.5);
        assert!(
            matches!(m.get_f32("a.u8"), Err(GgufError::WrongType { key, .. }) if key == "a.u8")
        );
    }

    #[test]
    fn missing_optional_and_bad_array_elements() {
        let mut m = sample();
        assert!(matches!(m.get_str("nope"), Err(GgufError::MissingKey { key }) if key == "nope"));
        assert_eq!(m.opt_u32("nope").unwrap(), None);
        assert!(m.opt_u32("a.big").is_err());
        let err = m.get_str_array("a.strs").unwrap_err();
        assert!(matches!(err, GgufError::WrongType { ref key, .. } if key == "a.strs[1]"));
        assert!(matches!(
            m.insert("a.u8".into(), Value::Bool(true)),
            Err(GgufError::DuplicateKey { .. })
        ));
        assert_eq!(
            m.keys().collect::<Vec<_>>(),
            ["a.u8", "a.neg", "a.big", "a.f64", "a.strs"]
        );
    }
}
