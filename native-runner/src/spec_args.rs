//! `--spec lookup [--draft-max K]`: speculative decoding with prompt-lookup drafts, for the
//! commands that generate (`generate`, `chat`, `bench`, and `serve` for its API's requests).

use webshard::sample::lookup::MAX_DRAFT;
use webshard::sample::SpecConfig;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct SpecArgs {
    /// Speculative decoding: `lookup` drafts from n-grams of the prompt and the output so
    /// far and verifies each draft in one multi-token step (output unchanged).
    #[arg(long, value_enum)]
    pub spec: Option<SpecKind>,
    /// Most draft tokens per step with --spec (1..=15, default 15: drafts start at 4 and
    /// grow only while they are accepted whole).
    #[arg(long, requires = "spec", value_parser = parse_draft_max)]
    pub draft_max: Option<u32>,
    /// Plain tokens a lookup must foretell before its draft is verified (default 2; 0
    /// verifies every draft found). Hidden: for measuring the rule (docs/perf.md).
    #[arg(long, requires = "spec", hide = true, value_parser = clap::value_parser!(u32).range(0..=8))]
    pub spec_confirm: Option<u32>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecKind {
    Lookup,
}

impl SpecArgs {
    pub fn config(&self) -> Option<SpecConfig> {
        self.spec.map(|SpecKind::Lookup| SpecConfig {
            draft_max: self.draft_max.unwrap_or(SpecConfig::default().draft_max),
            confirm: self.spec_confirm.unwrap_or(SpecConfig::default().confirm),
            ..SpecConfig::default()
        })
    }
}

fn parse_draft_max(text: &str) -> Result<u32, String> {
    let value: u32 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a whole number of tokens (1..={MAX_DRAFT})"))?;
    SpecConfig::lookup(value).map(|config| config.draft_max)
}
