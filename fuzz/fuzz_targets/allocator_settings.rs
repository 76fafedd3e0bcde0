//! PyTorch's allocator settings (`PYTORCH_CUDA_ALLOC_CONF`), as `whatif`, the plan and the
//! agent read them from a process's environment: `AllocatorConfig::parse`.
//!
//! Checked: every failure is a `ConfigError` with its message (never a panic); spaces mean
//! nothing (PyTorch's lexer drops them), so the settings without them parse the same; taken
//! settings hold what the parser promises (split sizes of at least 20 MiB, a threshold in (0, 1),
//! divisions that are powers of two); and taken settings written back as a setting string parse to
//! the same settings.

#![no_main]

use gpuprof_model::allocator::{AllocatorConfig, MIB};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(conf) = std::str::from_utf8(data) else { return };
    let parsed = AllocatorConfig::parse(conf);
    assert_eq!(AllocatorConfig::parse(&conf.replace(' ', "")), parsed, "spaces changed {conf:?}");
    let config = match parsed {
        Ok(config) => config,
        Err(error) => {
            assert!(error.to_string().starts_with("PYTORCH_CUDA_ALLOC_CONF: "), "{error}");
            return;
        }
    };
    assert!(config.max_split_size >= 20 * MIB && config.max_non_split_rounding_size >= 20 * MIB);
    let threshold = config.garbage_collection_threshold;
    assert!(threshold == 0.0 || (threshold > 0.0 && threshold < 1.0), "threshold {threshold}");
    assert!(config.roundup_power2_divisions.iter().all(|&d| d == 0 || d.is_power_of_two()));
    let again = written(&config);
    assert_eq!(AllocatorConfig::parse(&again), Ok(config), "{conf:?} written as {again:?} reads otherwise");
});

/// The settings as a `PYTORCH_CUDA_ALLOC_CONF` value: each key that differs from the default.
fn written(config: &AllocatorConfig) -> String {
    let default = AllocatorConfig::default();
    // A size that saturated (a MiB count too large for bytes) is written as one that saturates.
    let mib = |bytes: u64| if bytes == u64::MAX { u64::MAX } else { bytes / MIB };
    let mut keys = Vec::new();
    if config.max_split_size != default.max_split_size {
        keys.push(format!("max_split_size_mb:{}", mib(config.max_split_size)));
    }
    if config.max_non_split_rounding_size != default.max_non_split_rounding_size {
        keys.push(format!("max_non_split_rounding_mb:{}", mib(config.max_non_split_rounding_size)));
    }
    if config.garbage_collection_threshold != default.garbage_collection_threshold {
        keys.push(format!("garbage_collection_threshold:{}", config.garbage_collection_threshold));
    }
    if config.expandable_segments {
        keys.push("expandable_segments:True".to_string());
    }
    if config.roundup_power2_divisions != default.roundup_power2_divisions {
        // One interval per power of two from 1 MiB: the first fills nothing before itself.
        let intervals: Vec<String> =
            config.roundup_power2_divisions.iter().enumerate().map(|(i, d)| format!("{}:{d}", 1u64 << i)).collect();
        keys.push(format!("roundup_power2_divisions:[{}]", intervals.join(",")));
    }
    keys.join(",")
}
