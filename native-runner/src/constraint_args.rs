//! `--json-schema FILE | --regex RE | --grammar FILE | --json-mode`, shared by `generate`,
//! `chat` and `bench`: read and compiled before the model loads, so a bad constraint fails
//! at once with the file and the problem.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use webshard::sample::ConstraintSpec;

#[derive(clap::Args, Debug, Clone, Default)]
#[group(multiple = false)]
pub struct ConstraintArgs {
    /// Constrain the output to JSON valid under the JSON Schema in FILE.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to text matching this regular expression in full.
    #[arg(long, value_name = "RE")]
    pub regex: Option<String>,
    /// Constrain the output to the Lark grammar in FILE (llguidance's Lark dialect).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
    /// Constrain the output to any JSON value.
    #[arg(long)]
    pub json_mode: bool,
}

impl ConstraintArgs {
    /// The constraint asked for, compiled once to check it; `None` when there is none.
    pub fn spec(&self) -> anyhow::Result<Option<ConstraintSpec>> {
        let (spec, what) = if let Some(path) = &self.json_schema {
            let text = read(path, "JSON schema")?;
            let schema = serde_json::from_str(&text)
                .with_context(|| format!("JSON schema {}: not JSON", path.display()))?;
            (
                ConstraintSpec::JsonSchema { schema },
                format!("JSON schema {}", path.display()),
            )
        } else if let Some(pattern) = &self.regex {
            (
                ConstraintSpec::Regex {
                    pattern: pattern.clone(),
                },
                format!("--regex {pattern:?}"),
            )
        } else if let Some(path) = &self.grammar {
            let grammar = read(path, "grammar")?;
            (
                ConstraintSpec::Lark { grammar },
                format!("grammar {}", path.display()),
            )
        } else if self.json_mode {
            (ConstraintSpec::Json, "--json-mode".to_owned())
        } else {
            return Ok(None);
        };
        spec.check().map_err(|e| anyhow!("{what}: {e}"))?;
        Ok(Some(spec))
    }
}

fn read(path: &Path, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {what} {}", path.display()))
}
