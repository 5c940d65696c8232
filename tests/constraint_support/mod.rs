//! JSON Schemas generated from a seed, shared by the constraint tests here and the runner's
//! end-to-end ones: objects with nested arrays and objects, enums, bounded integers and
//! numbers, bounded strings, optional fields and `$defs` references. Every string and array
//! is bounded and no object takes extra properties, so a random walk through the schema ends.
#![allow(dead_code)]

use serde_json::{json, Map, Value};

/// xorshift64*: the generator needs no crate and gives the same schemas everywhere.
pub struct SchemaRng(u64);

impl SchemaRng {
    pub fn new(seed: u64) -> SchemaRng {
        SchemaRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) % n
    }

    pub fn range(&mut self, low: i64, high: i64) -> i64 {
        low + self.below((high - low + 1) as u64) as i64
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

const NAMES: &[&str] = &[
    "name", "age", "tags", "color", "size", "city", "score", "active", "items", "id", "kind",
    "level",
];
const WORDS: &[&str] = &[
    "red", "green", "blue", "small", "large", "north", "south", "alpha", "beta", "on", "off",
];

/// A schema for seed `seed`; `depth` bounds the nesting (0 gives flat objects).
pub fn generated_schema(seed: u64, depth: u32) -> Value {
    let mut rng = SchemaRng::new(seed);
    let mut schema = object(&mut rng, depth, true);
    if rng.below(3) == 0 {
        let defined = object(&mut rng, 0, false);
        schema["$defs"] = json!({ "part": defined });
        let name = format!("part{}", rng.below(10));
        schema["properties"][name.as_str()] = json!({"$ref": "#/$defs/part"});
        if rng.below(2) == 0 {
            let required = schema["required"].as_array_mut().expect("required list");
            required.push(json!(name));
        }
    }
    schema
}

fn object(rng: &mut SchemaRng, depth: u32, allow_refs: bool) -> Value {
    let fields = rng.range(1, 4) as usize;
    let mut properties = Map::new();
    let mut required = Vec::new();
    while properties.len() < fields {
        let name = rng.pick(NAMES).to_owned();
        if properties.contains_key(&name) {
            continue;
        }
        let value = field(rng, depth, allow_refs);
        if rng.below(3) != 0 {
            required.push(json!(name));
        }
        properties.insert(name, value);
    }
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

fn field(rng: &mut SchemaRng, depth: u32, allow_refs: bool) -> Value {
    let kinds = if depth > 0 { 8 } else { 6 };
    match rng.below(kinds) {
        0 => {
            let low = rng.range(-100, 100);
            json!({"type": "integer", "minimum": low, "maximum": low + rng.range(0, 1000)})
        }
        1 => {
            let low = rng.range(-10, 10) as f64;
            json!({"type": "number", "minimum": low, "maximum": low + rng.range(1, 100) as f64})
        }
        2 => {
            let count = rng.range(1, 4) as usize;
            let mut values: Vec<&str> = (0..count).map(|_| rng.pick(WORDS)).collect();
            values.sort_unstable();
            values.dedup();
            json!({"enum": values})
        }
        3 => json!({"type": "boolean"}),
        4 => json!({"type": "string", "minLength": 1, "maxLength": rng.range(1, 8)}),
        5 => {
            let item = json!({"type": "integer", "minimum": 0, "maximum": rng.range(1, 99)});
            array(rng, item)
        }
        6 => {
            let item = object(rng, depth - 1, allow_refs);
            array(rng, item)
        }
        _ => object(rng, depth - 1, allow_refs),
    }
}

fn array(rng: &mut SchemaRng, items: Value) -> Value {
    let min = rng.range(0, 1);
    json!({"type": "array", "items": items, "minItems": min, "maxItems": min + rng.range(1, 3)})
}

/// Whether `text` is one arithmetic expression: `expr: term (("+"|"-") term)*`,
/// `term: factor (("*"|"/") factor)*`, `factor: NUMBER | "(" expr ")"`, NUMBER 1-3 digits.
pub fn is_arithmetic(text: &str) -> bool {
    fn expr(s: &[u8], i: &mut usize) -> bool {
        term(s, i) && repeat(s, i, b"+-", term)
    }
    fn term(s: &[u8], i: &mut usize) -> bool {
        factor(s, i) && repeat(s, i, b"*/", factor)
    }
    fn repeat(s: &[u8], i: &mut usize, ops: &[u8], next: fn(&[u8], &mut usize) -> bool) -> bool {
        while *i < s.len() && ops.contains(&s[*i]) {
            *i += 1;
            if !next(s, i) {
                return false;
            }
        }
        true
    }
    fn factor(s: &[u8], i: &mut usize) -> bool {
        if s.get(*i) == Some(&b'(') {
            *i += 1;
            let inner = expr(s, i);
            let closed = s.get(*i) == Some(&b')');
            *i += 1;
            return inner && closed;
        }
        let digits = s[*i..].iter().take_while(|b| b.is_ascii_digit()).count();
        *i += digits;
        (1..=3).contains(&digits)
    }
    let mut i = 0;
    expr(text.as_bytes(), &mut i) && i == text.len()
}

/// The Lark grammar `is_arithmetic` checks.
pub const ARITHMETIC_LARK: &str = r#"
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,3}/
"#;

/// Regexes whose outputs the tests check with the `regex` crate.
pub const REGEXES: &[&str] = &[
    r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    r"(red|green|blue|redwood)",
];
