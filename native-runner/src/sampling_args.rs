//! The sampler flags shared by the commands that generate, each range checked at parse time
//! so a bad value is refused with a message naming the flag's valid range, and the seed
//! drawn at random unless given (llama.cpp's convention: `--seed -1` or none is random).

use webshard::sample::SamplerConfig;

#[derive(clap::Args, Debug, Clone)]
pub struct SamplerArgs {
    /// Temperature, 0 or more; 0 is greedy.
    #[arg(long, default_value = "0.8", value_parser = parse_temperature, allow_hyphen_values = true)]
    pub temp: f32,
    /// Keep the K most likely tokens; 0 is off.
    #[arg(long, default_value = "40", value_parser = parse_top_k, allow_hyphen_values = true)]
    pub top_k: u32,
    /// Nucleus sampling, 0 to 1; 1 is off.
    #[arg(long, default_value = "0.95", value_parser = parse_probability, allow_hyphen_values = true)]
    pub top_p: f32,
    /// Drop tokens less likely than this times the most likely one, 0 to 1; 0 is off.
    #[arg(long, default_value = "0.05", value_parser = parse_probability, allow_hyphen_values = true)]
    pub min_p: f32,
    /// Penalty for repeated tokens, more than 0; 1 is off.
    #[arg(long, default_value = "1.0", value_parser = parse_penalty, allow_hyphen_values = true)]
    pub repeat_penalty: f32,
    /// Tokens of history the penalty looks at; 0 is off, -1 the whole context.
    #[arg(long, default_value = "64", value_parser = parse_last_n, allow_hyphen_values = true)]
    pub repeat_last_n: u32,
    /// OpenAI's frequency penalty, -2 to 2: lowers a token's logit per time it occurs in the
    /// completion; 0 is off.
    #[arg(long, default_value = "0", value_parser = parse_occurrence_penalty, allow_hyphen_values = true)]
    pub frequency_penalty: f32,
    /// OpenAI's presence penalty, -2 to 2: lowers the logit of every token already in the
    /// completion; 0 is off.
    #[arg(long, default_value = "0", value_parser = parse_occurrence_penalty, allow_hyphen_values = true)]
    pub presence_penalty: f32,
    /// Seed of the draw, for a reproducible run; -1 (the default) picks one at random and
    /// prints it with the timings.
    #[arg(long, default_value = "-1", value_parser = parse_seed, allow_hyphen_values = true)]
    pub seed: Seed,
}

impl SamplerArgs {
    /// The sampler settings, with a fresh random seed when none was given: call once per run
    /// and report the seed it holds.
    pub fn config(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k as usize,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n as usize,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            seed: self.seed.0.unwrap_or_else(random_seed),
        }
    }
}

/// `--seed`: a fixed seed, or None for a random one per run.
#[derive(Debug, Clone, Copy)]
pub struct Seed(pub Option<u64>);

/// A seed llama.cpp would print: 32 bits, so it is short to copy back into `--seed`.
fn random_seed() -> u64 {
    u64::from(rand::random::<u32>())
}

/// A finite number, or a message saying what the flag wants.
fn parse_finite(text: &str, want: &str) -> Result<f32, String> {
    match text.trim().parse::<f32>() {
        Ok(value) if value.is_finite() => Ok(value),
        _ => Err(format!("`{text}` is not a number; want {want}")),
    }
}

fn parse_temperature(text: &str) -> Result<f32, String> {
    const WANT: &str = "a temperature of 0 or more (0 is greedy)";
    match parse_finite(text, WANT)? {
        value if value >= 0.0 => Ok(value),
        _ => Err(format!("{text} is negative; want {WANT}")),
    }
}

fn parse_probability(text: &str) -> Result<f32, String> {
    const WANT: &str = "a probability from 0 to 1";
    match parse_finite(text, WANT)? {
        value if (0.0..=1.0).contains(&value) => Ok(value),
        _ => Err(format!("{text} is outside 0..=1; want {WANT}")),
    }
}

fn parse_penalty(text: &str) -> Result<f32, String> {
    const WANT: &str = "a penalty more than 0 (1 is off)";
    match parse_finite(text, WANT)? {
        value if value > 0.0 => Ok(value),
        _ => Err(format!("{text} is not more than 0; want {WANT}")),
    }
}

fn parse_occurrence_penalty(text: &str) -> Result<f32, String> {
    const WANT: &str = "a penalty from -2 to 2 (0 is off)";
    match parse_finite(text, WANT)? {
        value if (-2.0..=2.0).contains(&value) => Ok(value),
        _ => Err(format!("{text} is outside -2..=2; want {WANT}")),
    }
}

/// A whole number, or a message saying what the flag wants.
fn parse_integer(text: &str, want: &str) -> Result<i64, String> {
    text.trim()
        .parse::<i64>()
        .map_err(|_| format!("`{text}` is not a whole number; want {want}"))
}

fn parse_top_k(text: &str) -> Result<u32, String> {
    const WANT: &str = "a count of tokens, 0 or more (0 is off)";
    u32::try_from(parse_integer(text, WANT)?)
        .map_err(|_| format!("{text} is out of range; want {WANT}"))
}

fn parse_last_n(text: &str) -> Result<u32, String> {
    const WANT: &str = "a count of tokens, 0 or more, or -1 for the whole context";
    match parse_integer(text, WANT)? {
        -1 => Ok(u32::MAX),
        value => u32::try_from(value).map_err(|_| format!("{text} is out of range; want {WANT}")),
    }
}

/// `-1` is "pick one at random" (None); any other seed is a number from 0 up.
fn parse_seed(text: &str) -> Result<Seed, String> {
    const WANT: &str = "a number from 0 up, or -1 for a random seed";
    if text.trim() == "-1" {
        return Ok(Seed(None));
    }
    text.trim()
        .parse::<u64>()
        .map(|seed| Seed(Some(seed)))
        .map_err(|_| format!("`{text}` is not a seed; want {WANT}"))
}

/// `-n`: how many tokens to generate, 1 or more (llama.cpp's `-1`, "until the context is
/// full", is refused with a message instead of clap's "unexpected argument").
pub fn parse_max_tokens(text: &str) -> Result<u32, String> {
    const WANT: &str = "a count of tokens to generate, 1 or more";
    match parse_integer(text, WANT)? {
        value if value < 0 => Err(format!(
            "{text} is negative; want {WANT} (there is no \"until the context is full\": give a number)"
        )),
        0 => Err(format!("0 generates nothing; want {WANT}")),
        value => u32::try_from(value).map_err(|_| format!("{text} is too large; want {WANT}")),
    }
}
