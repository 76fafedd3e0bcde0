//! `PYTORCH_CUDA_ALLOC_CONF` as one typed struct, parsed the way
//! c10/core/AllocatorConfig.cpp (`AllocatorConfig::parseArgs`) parses it, so that a setting the
//! real allocator rejects is rejected here too, with the key named.

use super::{K_LARGE_BUFFER, MIB};

/// The environment variables PyTorch reads its allocator settings from, in the order it reads
/// them (`CUDAAllocatorConfig::instance`): the first one set wins. 2.x releases around 2.9 read
/// `PYTORCH_ALLOC_CONF` first; the two differ only where both are set.
pub const SETTINGS_VARIABLES: [&str; 2] = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"];

/// The settings an environment gives PyTorch's allocator (`value_of` a variable's value): the
/// first of `SETTINGS_VARIABLES` set, else empty (its defaults).
pub fn settings_in_environment(value_of: impl Fn(&str) -> Option<String>) -> String {
    SETTINGS_VARIABLES.iter().find_map(|name| value_of(name)).unwrap_or_default()
}

/// Intervals of `roundup_power2_divisions`: one per power of two from 1 MiB to 64 GiB
/// (`kRoundUpPowerOfTwoIntervals`, `kRoundUpPowerOfTwoStart`, `kRoundUpPowerOfTwoEnd`).
pub(crate) const ROUNDUP_INTERVALS: usize = 16;
const ROUNDUP_START_LOG2: u32 = 20;

/// The allocator settings that change where memory goes. Defaults are PyTorch's: no split limit,
/// no power-of-two rounding, no garbage collection, fixed-size segments.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorConfig {
    /// `max_split_size_mb` in bytes; `u64::MAX` when unset, as in PyTorch.
    pub max_split_size: u64,
    /// `max_non_split_rounding_mb` in bytes: how much larger than the request an oversize cached
    /// block may be and still be handed out whole. Defaults to kLargeBuffer (20 MiB), the fixed
    /// limit of the 2.x releases that predate the key.
    pub max_non_split_rounding_size: u64,
    /// `roundup_power2_divisions`, one entry per interval (index 0 covers everything below 2 MiB).
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// `garbage_collection_threshold`, in (0, 1); 0 when unset. It only acts when a per-process
    /// memory fraction is set (`set_fraction` in the source).
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            max_non_split_rounding_size: K_LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("PYTORCH_CUDA_ALLOC_CONF: unknown key `{0}` (known: max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, garbage_collection_threshold, expandable_segments)")]
    UnknownKey(String),
    #[error("PYTORCH_CUDA_ALLOC_CONF: `{key}` has no value; write `{key}:VALUE`")]
    MissingValue { key: String },
    #[error("PYTORCH_CUDA_ALLOC_CONF: `{key}:{value}` is invalid: {why}")]
    BadValue { key: String, value: String, why: &'static str },
    #[error("PYTORCH_CUDA_ALLOC_CONF: expected `{expected}` near `{near}`")]
    Syntax { expected: char, near: String },
}

impl AllocatorConfig {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` value, e.g.
    /// `max_split_size_mb:128,expandable_segments:True,roundup_power2_divisions:[256:1,>:4]`.
    /// Keys that do not touch device-memory placement (`backend`, `release_lock_on_cudamalloc`,
    /// the `pinned_*` host-memory keys) are accepted and ignored.
    pub fn parse(conf: &str) -> Result<Self, ConfigError> {
        let tokens = lex(conf);
        let mut config = AllocatorConfig::default();
        let mut i = 0;
        while i < tokens.len() {
            let key = tokens[i].clone();
            expect(&tokens, i + 1, ':')?;
            let value_at = i + 2;
            let value = tokens
                .get(value_at)
                .filter(|v| !is_punct(v))
                .cloned()
                .or_else(|| (tokens.get(value_at).map(String::as_str) == Some("[")).then(String::new))
                .ok_or_else(|| ConfigError::MissingValue { key: key.clone() })?;
            let bad = |why| ConfigError::BadValue { key: key.clone(), value: value.clone(), why };
            i = value_at;
            match key.as_str() {
                "max_split_size_mb" | "max_non_split_rounding_mb" => {
                    // parseMaxSplitSize / parseMaxNonSplitRoundingSize: at least kLargeBuffer.
                    let mb: u64 = value.parse().map_err(|_| bad("expected whole MiB"))?;
                    if mb < K_LARGE_BUFFER / MIB {
                        return Err(bad("must be >= 20 (MiB), the large segment size"));
                    }
                    let bytes = mb.saturating_mul(MIB);
                    if key == "max_split_size_mb" {
                        config.max_split_size = bytes;
                    } else {
                        config.max_non_split_rounding_size = bytes;
                    }
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value.parse().map_err(|_| bad("expected a number"))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(bad("must lie strictly between 0.0 and 1.0"));
                    }
                    config.garbage_collection_threshold = t;
                }
                "expandable_segments" => {
                    config.expandable_segments = match value.as_str() {
                        "True" => true,
                        "False" => false,
                        _ => return Err(bad("expected True or False")),
                    }
                }
                "roundup_power2_divisions" => {
                    i = parse_divisions(&tokens, i, &mut config.roundup_power2_divisions, &key)?;
                }
                "backend"
                | "release_lock_on_cudamalloc"
                | "pinned_use_cuda_host_register"
                | "pinned_num_register_threads"
                | "pinned_use_background_threads" => {}
                _ => return Err(ConfigError::UnknownKey(key)),
            }
            if i + 1 < tokens.len() {
                expect(&tokens, i + 1, ',')?;
                i += 2;
            } else {
                i += 1;
            }
        }
        Ok(config)
    }

    /// `AllocatorConfig::roundup_power2_divisions(size)`: the divisions for the power-of-two
    /// interval holding `size`, clamped to the first and last interval.
    pub(crate) fn divisions_for(&self, size: u64) -> u64 {
        let log2 = 63 - size.max(1).leading_zeros();
        let index = log2.saturating_sub(ROUNDUP_START_LOG2) as usize;
        self.roundup_power2_divisions[index.min(ROUNDUP_INTERVALS - 1)]
    }
}

/// `AllocatorConfig::lexArgs`: `,` `:` `[` `]` are tokens of their own; spaces vanish.
fn lex(conf: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    for c in conf.chars() {
        match c {
            ',' | ':' | '[' | ']' => {
                if !word.is_empty() {
                    tokens.push(std::mem::take(&mut word));
                }
                tokens.push(c.to_string());
            }
            ' ' => {}
            _ => word.push(c),
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    tokens
}

fn is_punct(token: &str) -> bool {
    matches!(token, "," | ":" | "[" | "]")
}

fn expect(tokens: &[String], i: usize, c: char) -> Result<(), ConfigError> {
    match tokens.get(i) {
        Some(t) if t.len() == 1 && t.starts_with(c) => Ok(()),
        other => Err(ConfigError::Syntax {
            expected: c,
            near: other.or_else(|| tokens.get(i.saturating_sub(1))).cloned().unwrap_or_default(),
        }),
    }
}

/// `AllocatorConfig::parseRoundUpPower2Divisions`: either one power of two for every interval, or
/// `[MB:divs,...,>:divs]`. Mirrors the source's fill order, including that `>` fills from the
/// last named interval onwards and so overrides that interval's own value.
fn parse_divisions(
    tokens: &[String],
    mut i: usize,
    out: &mut [u64; ROUNDUP_INTERVALS],
    key: &str,
) -> Result<usize, ConfigError> {
    let bad = |value: &str, why| ConfigError::BadValue { key: key.to_string(), value: value.to_string(), why };
    if tokens[i] != "[" {
        let d: u64 = tokens[i].parse().map_err(|_| bad(&tokens[i], "expected a number"))?;
        if !d.is_power_of_two() {
            return Err(bad(&tokens[i], "divisions must be a power of 2"));
        }
        *out = [d; ROUNDUP_INTERVALS];
        return Ok(i);
    }
    let mut first = true;
    let mut last_index = 0usize;
    i += 1;
    while i < tokens.len() && tokens[i] != "]" {
        let interval = tokens[i].clone();
        expect(tokens, i + 1, ':')?;
        let raw = tokens.get(i + 2).ok_or_else(|| ConfigError::MissingValue { key: key.to_string() })?.clone();
        i += 2;
        let d: u64 = raw.parse().map_err(|_| bad(&raw, "expected a number"))?;
        if d != 0 && !d.is_power_of_two() {
            return Err(bad(&raw, "divisions must be a power of 2, or 0 to disable"));
        }
        if interval == ">" {
            out[last_index..].fill(d);
        } else {
            let mb: u64 = interval.parse().map_err(|_| bad(&interval, "interval must be a MiB count or `>`"))?;
            if !mb.is_power_of_two() {
                return Err(bad(&interval, "intervals must be powers of 2 (MiB)"));
            }
            let index = (63 - mb.leading_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
            if first {
                out[..index].fill(d);
                first = false;
            }
            out[index] = d;
            last_index = index;
        }
        if tokens.get(i + 1).map(String::as_str) != Some("]") {
            expect(tokens, i + 1, ',')?;
            i += 1;
        }
        i += 1;
    }
    if i >= tokens.len() {
        return Err(ConfigError::Syntax { expected: ']', near: key.to_string() });
    }
    Ok(i)
}
