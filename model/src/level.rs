//! Capture levels: how much of a process gpuprof records, and so what it costs the process. A
//! node's daemon runs at the level it can always afford and raises one process's level where the
//! cheap level shows a reason (`escalation`), the shim switches at run time, and `attach`/`run`
//! take the level a user asks for. docs/levels.md gives each level's cost and what it finds.

pub mod request;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use request::{LevelRequest, LevelRequestError};

/// Ordered: a higher level records everything a lower one does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Nothing (the shim paused: its hook forwards each call at once).
    Off = 0,
    /// The driver's memory entry points: segments, VMM, IPC, contexts, failed calls, with their
    /// Python stacks. No tensor events: a step of a training job makes none of these calls once
    /// its allocator's cache is warm, so this level costs it next to nothing.
    Driver = 1,
    /// Every tensor block of PyTorch's caching allocator too, with its Python stack and autograd
    /// attribution.
    Tensors = 2,
}

impl Level {
    pub(crate) const ALL: [Level; 3] = [Level::Off, Level::Driver, Level::Tensors];

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Off => "off",
            Level::Driver => "driver",
            Level::Tensors => "tensors",
        }
    }

    /// The level numbered as the shim's C function takes it (`gpuprof_shim_set_level`).
    pub fn from_number(number: i64) -> Option<Level> {
        Level::ALL.into_iter().find(|level| *level as i64 == number)
    }

    /// Tensor events are recorded at this level.
    pub fn tensors(self) -> bool {
        self >= Level::Tensors
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A level's name that is none of them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown capture level {0:?}: give off, driver or tensors")]
pub struct UnknownLevel(pub String);

impl FromStr for Level {
    type Err = UnknownLevel;

    fn from_str(text: &str) -> Result<Level, UnknownLevel> {
        Level::ALL.into_iter().find(|level| level.as_str() == text.trim()).ok_or_else(|| UnknownLevel(text.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_ordered_named_and_numbered() {
        assert!(Level::Off < Level::Driver && Level::Driver < Level::Tensors);
        assert_eq!("driver".parse::<Level>(), Ok(Level::Driver));
        assert_eq!(" tensors\n".parse::<Level>(), Ok(Level::Tensors));
        assert_eq!(
            "full".parse::<Level>().unwrap_err().to_string(),
            "unknown capture level \"full\": give off, driver or tensors"
        );
        assert_eq!(Level::from_number(2), Some(Level::Tensors));
        assert_eq!(Level::from_number(3), None);
        assert_eq!(serde_json::to_string(&Level::Off).unwrap(), "\"off\"");
        assert!(Level::Tensors.tensors() && !Level::Driver.tensors());
    }
}
