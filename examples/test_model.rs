//! Writes a llama-shaped GGUF test model (see `tests/test_model/mod.rs`):
//!
//! `cargo run --release --example test_model -- OUT.gguf SIZE_MIB [--split N] [--seed S]
//!  [--hidden D --ffn F --heads H --kv-heads K --embedding F32|Q8_0] [--layers L]
//!  [--matrices F32|Q4_0|Q4_1|Q8_0|Q4_K|Q6_K]`
//!
//! Without `--layers`, as many layers as make the file SIZE_MIB; `--matrices` gives every layer
//! matrix one type instead of the mix.
//! The tokenizer and chat template come from `$WEBSHARD_MODELS/SmolLM2-135M-Instruct.Q4_1.gguf`.
//! With `--split N` it writes `OUT-00001-of-0000N.gguf`... instead of `OUT.gguf`.

#[path = "../tests/test_model/mod.rs"]
mod test_model;

use std::path::PathBuf;

use test_model::{tokenizer_keys, write_single, write_split, Shape, MATRIX_TYPES};
use webshard::gguf::{read_header, FileSource, GgmlType};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(out), Some(mib)) = (args.first(), args.get(1)) else {
        return Err(
            "usage: test_model OUT.gguf SIZE_MIB [--split N] [--seed S] [--hidden D] ...".into(),
        );
    };
    let mib: u64 = mib.parse().map_err(|_| format!("SIZE_MIB {mib}"))?;
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let number = |name: &str| -> Result<Option<u64>> {
        match flag(name) {
            Some(v) => Ok(Some(
                v.parse().map_err(|_| format!("{name} {v}: not a number"))?,
            )),
            None => Ok(None),
        }
    };
    let mut shape = Shape::llama_of_size(mib, number("--seed")?.unwrap_or(0));
    shape.hidden = number("--hidden")?.unwrap_or(shape.hidden);
    shape.ffn = number("--ffn")?.unwrap_or(shape.ffn);
    shape.heads = number("--heads")?.unwrap_or(shape.heads);
    shape.kv_heads = number("--kv-heads")?.unwrap_or(shape.kv_heads);
    if let Some(name) = flag("--embedding") {
        shape.embedding = match name.as_str() {
            "F32" => GgmlType::F32,
            "Q8_0" => GgmlType::Q8_0,
            other => return Err(format!("--embedding {other}: F32 or Q8_0").into()),
        };
    }
    if let Some(name) = flag("--matrices") {
        let found = MATRIX_TYPES.iter().find(|t| t.name() == name.as_str());
        let names: Vec<&str> = MATRIX_TYPES.iter().map(|t| t.name()).collect();
        shape.matrices =
            Some(*found.ok_or_else(|| format!("--matrices {name}: one of {names:?}"))?);
    }
    shape.layers = match number("--layers")? {
        Some(layers) => layers,
        None => shape.layers_for(mib << 20),
    };
    let models = std::env::var("WEBSHARD_MODELS").unwrap_or_else(|_| "models".into());
    let smollm2 = PathBuf::from(models).join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let source = FileSource::open(&smollm2)?;
    let header = pollster::block_on(read_header(&source))?;
    let tokenizer = tokenizer_keys(&header.metadata);
    eprintln!("{shape:?}");
    let out = PathBuf::from(out);
    match number("--split")? {
        Some(parts) => {
            let stem = out.with_extension("");
            for path in write_split(&shape, &tokenizer, &stem, parts as u16)? {
                println!("{}", path.display());
            }
        }
        None => {
            let bytes = write_single(&shape, &tokenizer, &out)?;
            println!("{} {bytes}", out.display());
        }
    }
    Ok(())
}
