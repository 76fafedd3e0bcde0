//! A request to record one process at another level for a while, as the daemon's HTTP API takes
//! it: `POST /v1/level?pid=P&level=L[&seconds=S]`. The query is read and checked here, apart from
//! the server, so every query a client can send has one answer: a request, or the error to say.

use serde::Deserialize;

use super::{Level, UnknownLevel};
use crate::seconds::{positive_seconds, SecondsError};

/// A checked request: a process, the level to take, and for how long (None: the daemon's
/// `--detail`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LevelRequest {
    pub pid: u32,
    pub level: Level,
    /// Positive and finite when given.
    pub seconds: Option<f64>,
}

/// Why a query is no request; each is answered 400 with its message.
#[derive(Debug, thiserror::Error)]
pub enum LevelRequestError {
    /// A field missing, unknown in kind or of the wrong type. Worded as the daemon's HTTP
    /// framework worded it when it read the query itself, so that its answers stay the same.
    #[error("Failed to deserialize query string: {0}")]
    Query(serde_path_to_error::Error<serde::de::value::Error>),
    #[error(transparent)]
    Level(#[from] UnknownLevel),
    #[error("seconds={0}: give a positive number of seconds")]
    Seconds(f64),
    /// More than a century: the daemon's deadline from it would not hold.
    #[error("seconds={0}: {too_long}", too_long = SecondsError::TooLong)]
    TooLong(f64),
}

/// The query's fields as sent.
#[derive(Deserialize)]
struct Query {
    pid: u32,
    level: String,
    seconds: Option<f64>,
}

impl LevelRequest {
    /// Reads a query string (without the `?`), percent-decoded as a form: the level named, the
    /// seconds positive.
    pub fn from_query(query: &str) -> Result<LevelRequest, LevelRequestError> {
        let fields = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        let query: Query = serde_path_to_error::deserialize(fields).map_err(LevelRequestError::Query)?;
        let level = query.level.parse::<Level>()?;
        if let Some(seconds) = query.seconds {
            positive_seconds(seconds).map_err(|error| match error {
                SecondsError::NotPositive => LevelRequestError::Seconds(seconds),
                SecondsError::TooLong => LevelRequestError::TooLong(seconds),
            })?;
        }
        Ok(LevelRequest { pid: query.pid, level, seconds: query.seconds })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(query: &str) -> String {
        LevelRequest::from_query(query).unwrap_err().to_string()
    }

    #[test]
    fn a_query_is_a_request_or_says_what_is_wrong() {
        assert_eq!(
            LevelRequest::from_query("pid=42&level=tensors&seconds=30").unwrap(),
            LevelRequest { pid: 42, level: Level::Tensors, seconds: Some(30.0) }
        );
        assert_eq!(
            LevelRequest::from_query("level=%20driver&pid=7").unwrap(),
            LevelRequest { pid: 7, level: Level::Driver, seconds: None }
        );
        assert_eq!(error("pid=7&level=full"), "unknown capture level \"full\": give off, driver or tensors");
        assert_eq!(error("pid=7&level=off&seconds=-1"), "seconds=-1: give a positive number of seconds");
        assert_eq!(error("pid=7&level=off&seconds=NaN"), "seconds=NaN: give a positive number of seconds");
        assert_eq!(error("pid=7&level=off&seconds=inf"), "seconds=inf: give a positive number of seconds");
        // A duration would hold it, but the daemon's deadline (now + seconds) would overflow.
        assert_eq!(
            error("pid=7&level=off&seconds=1e300"),
            format!("seconds={}: too long: give at most 3155760000 seconds", 1e300)
        );
        assert_eq!(error("pid=x&level=off"), "Failed to deserialize query string: pid: invalid digit found in string");
        assert_eq!(error("level=off"), "Failed to deserialize query string: missing field `pid`");
        assert_eq!(error(""), "Failed to deserialize query string: missing field `pid`");
    }
}
