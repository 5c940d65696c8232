//! A generated model over 1 GiB for the fleet tests (`tests/test_model` of the root crate), in a
//! temporary directory that is deleted when the `BigModel` drops, also when a test fails.

use std::path::{Path, PathBuf};

use serde_json::Value;
use webshard::gguf::{read_header, FileSource, GgmlType};

use crate::common::{model_path, SMOLLM2};

#[path = "../../../tests/test_model/mod.rs"]
mod test_model;

use test_model::{tokenizer_keys, write_single, Shape};

/// The file's name in its directory (what `runner serve --models` serves).
pub const FILE: &str = "big-1g.gguf";

pub struct BigModel {
    dir: tempfile::TempDir,
    shape: Shape,
    size: u64,
}

impl BigModel {
    /// Hidden 1536 with a 302 MB F32 token embedding, 14 layers of F32 matrices (53.5 MB
    /// each: FFN 1536, 24 heads, 8 KV heads) and a 62 MB Q6_K output matrix: 1.11 GB. No two
    /// donors of 500 MiB hold it (the embedding's stage takes at most 4 layers, the head's 8).
    pub fn write() -> BigModel {
        let shape = Shape {
            hidden: 1536,
            ffn: 1536,
            heads: 24,
            kv_heads: 8,
            layers: 14,
            embedding: GgmlType::F32,
            matrices: Some(GgmlType::F32),
            seed: 11,
        };
        let source = FileSource::open(model_path(SMOLLM2)).expect("SmolLM2 for its tokenizer");
        let header = pollster::block_on(read_header(&source)).expect("SmolLM2 header");
        let dir = tempfile::Builder::new()
            .prefix("webshard-fleet-big")
            .tempdir()
            .expect("a temporary directory");
        let size = write_single(
            &shape,
            &tokenizer_keys(&header.metadata),
            &dir.path().join(FILE),
        )
        .expect("write the model");
        BigModel { dir, shape, size }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join(FILE)
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Weight bytes of a stage of the coordinator's `plan` (`layers`, `embedding`, `head`).
    pub fn stage_weights(&self, stage: &Value) -> u64 {
        let layer = |i: usize| stage["layers"][i].as_u64().expect("a layer bound");
        let (start, end) = (layer(0), layer(1));
        let embedding = stage["embedding"] == true;
        let head = stage["head"] == true;
        self.shape
            .tensors()
            .iter()
            .filter(|t| match t.name.strip_prefix("blk.") {
                Some(rest) => {
                    let n: u64 = rest.split('.').next().unwrap().parse().unwrap();
                    (start..end).contains(&n)
                }
                None if t.name == "token_embd.weight" => embedding,
                None => head,
            })
            .map(|t| t.bytes())
            .sum()
    }
}
