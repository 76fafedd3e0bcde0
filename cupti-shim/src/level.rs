//! The shim's capture level, switched at run time: by the environment at start
//! (`GPUPROF_SHIM_LEVEL`), by the process itself (`gpuprof_shim_set_level`, e.g. through ctypes),
//! or by the agent's word on the socket (a node's daemon raising one process's detail, a user
//! pausing a capture without restarting the job). Off, the allocator hook forwards each call to
//! libc10 at once and the driver callbacks only count; driver, tensor blocks are not recorded.
//! Every reader is a relaxed load of one byte: the switch costs the hot path nothing.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use gpuprof_model::level::Level;
use gpuprof_model::shim::LEVEL_VAR;

static LEVEL: AtomicU8 = AtomicU8::new(Level::Tensors as u8);
/// Bumped at every change: the sender tells the agent the level it took once per change.
static CHANGES: AtomicU64 = AtomicU64::new(0);

/// The level now.
#[inline]
pub fn now() -> Level {
    match LEVEL.load(Ordering::Relaxed) {
        0 => Level::Off,
        1 => Level::Driver,
        _ => Level::Tensors,
    }
}

/// Takes `level`; returns the one before.
pub fn set(level: Level) -> Level {
    let before = LEVEL.swap(level as u8, Ordering::AcqRel);
    if before != level as u8 {
        CHANGES.fetch_add(1, Ordering::AcqRel);
    }
    Level::from_number(i64::from(before)).unwrap_or(Level::Tensors)
}

/// Changes made so far (the sender compares it with the last one it reported).
pub fn changes() -> u64 {
    CHANGES.load(Ordering::Acquire)
}

/// The level `GPUPROF_SHIM_LEVEL` asks for (tensors when unset); a name that is no level is said
/// once and leaves the default.
pub fn from_environment() {
    let Some(text) = std::env::var_os(LEVEL_VAR) else { return };
    match text.to_string_lossy().parse::<Level>() {
        Ok(level) => {
            LEVEL.store(level as u8, Ordering::Release);
        }
        Err(error) => eprintln!("gpuprof shim: {LEVEL_VAR}: {error}; capturing at tensors"),
    }
}

/// For the process itself: takes level `level` (0 off, 1 driver, 2 tensors) and returns the one
/// before, or -1 (nothing changed) for a number that is no level. Reports made by this thread
/// after it returns are recorded at the new level.
#[no_mangle]
pub extern "C" fn gpuprof_shim_set_level(level: libc::c_int) -> libc::c_int {
    match Level::from_number(i64::from(level)) {
        Some(level) => set(level) as libc::c_int,
        None => -1,
    }
}

/// The level now (0 off, 1 driver, 2 tensors).
#[no_mangle]
pub extern "C" fn gpuprof_shim_level() -> libc::c_int {
    now() as libc::c_int
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_c_functions_switch_and_refuse_what_is_no_level() {
        let before = changes();
        assert_eq!(gpuprof_shim_set_level(1), Level::Tensors as libc::c_int);
        assert_eq!((gpuprof_shim_level(), now()), (1, Level::Driver));
        assert_eq!(gpuprof_shim_set_level(7), -1);
        assert_eq!(now(), Level::Driver);
        assert_eq!(gpuprof_shim_set_level(1), 1);
        assert_eq!(changes() - before, 1, "taking the level it has is no change");
        assert_eq!(gpuprof_shim_set_level(2), 1);
        assert_eq!(now(), Level::Tensors);
    }
}
