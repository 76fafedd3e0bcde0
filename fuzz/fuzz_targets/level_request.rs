//! The daemon's level requests, `POST /v1/level?pid=P&level=L[&seconds=S]`: the query string as
//! a client sends it, read by `LevelRequest::from_query` (and a level's name by `Level::from_str`).
//!
//! Checked: every failure is an error with its message (never a panic); a request's seconds are
//! positive and at most a century (a deadline from them holds); a request written back as a query reads as the same request; a level
//! parses only from its own name.

#![no_main]

use std::time::Duration;

use gpuprof_model::level::{LevelRequest, LevelRequestError};
use gpuprof_model::seconds::MAX_SECONDS;
use gpuprof_model::Level;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let query = String::from_utf8_lossy(data);
    match LevelRequest::from_query(&query) {
        Ok(request) => {
            if let Some(seconds) = request.seconds {
                assert!(seconds > 0.0 && seconds <= MAX_SECONDS, "seconds={seconds} was taken");
                assert!(std::time::Instant::now().checked_add(Duration::from_secs_f64(seconds)).is_some());
            }
            let mut again = format!("pid={}&level={}", request.pid, request.level);
            if let Some(seconds) = request.seconds {
                again.push_str(&format!("&seconds={seconds}"));
            }
            assert_eq!(LevelRequest::from_query(&again).ok(), Some(request), "{again} reads otherwise");
        }
        Err(error) => {
            let message = error.to_string();
            match error {
                LevelRequestError::Query(_) => {
                    assert!(message.starts_with("Failed to deserialize query string: "), "{message}")
                }
                LevelRequestError::Level(_) => assert!(message.starts_with("unknown capture level "), "{message}"),
                LevelRequestError::Seconds(_) => assert!(message.ends_with("give a positive number of seconds")),
                LevelRequestError::TooLong(_) => assert!(message.ends_with("too long: give at most 3155760000 seconds")),
            }
        }
    }
    if let Ok(level) = query.parse::<Level>() {
        assert_eq!(query.trim(), level.as_str(), "a level parses only from its name");
    }
});
