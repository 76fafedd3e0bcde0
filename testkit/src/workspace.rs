//! The workspace's build as the running test finds it. Cargo builds a package's own binaries for
//! its integration tests and no other package's, so the binaries every test drives (the agent, the
//! collector, the shim) are brought up to date here, in the running test's own target directory
//! and profile: wherever CARGO_TARGET_DIR or `--target-dir` put it, the tests run what was built
//! with them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::CommandWithin;

/// A build from nothing of what a test drives, on a loaded 2-core machine, with room to spare.
const BUILD_LIMIT: Duration = Duration::from_secs(1800);

/// The workspace's root (this crate's parent folder).
pub(crate) fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the testkit is a folder of the workspace")
}

/// The running test's profile directory (`target/debug`): cargo puts test executables in its
/// `deps/` and binaries in it.
fn profile_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("the running test's executable");
        let deps = exe.parent().filter(|dir| dir.file_name().is_some_and(|name| name == "deps"));
        let profile = deps.and_then(Path::parent);
        profile
            .unwrap_or_else(|| panic!("{} is not in a cargo profile's deps/: run it with cargo test", exe.display()))
            .to_path_buf()
    })
}

/// The target directory's scratch space, `tmp` (what cargo names CARGO_TARGET_TMPDIR to a
/// package's own tests).
pub fn target_tmpdir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = profile_dir().parent().expect("a profile directory is inside a target directory").join("tmp");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        dir
    })
}

/// Builds `target` of `package` (`--bin NAME`, `--lib`) with the running test's profile into its
/// target directory and returns `file` from there. Cheap when cargo already built it for this
/// run (a package's own binaries, `cargo test --workspace`); call it once per test process.
pub(crate) fn build(package: &str, target: &[&str], file: &str) -> PathBuf {
    let profile_dir = profile_dir();
    let target_dir = profile_dir.parent().expect("a profile directory is inside a target directory");
    // A profile's directory is named after it, but for the dev profile's `debug`.
    let profile = match profile_dir.file_name().and_then(|name| name.to_str()) {
        Some("debug") => "dev",
        Some(name) => name,
        None => panic!("{} names no cargo profile", profile_dir.display()),
    };
    let status = Command::new(env!("CARGO"))
        .current_dir(root())
        .args(["build", "--quiet", "--profile", profile, "--target-dir"])
        .arg(target_dir)
        .args(["-p", package])
        .args(target)
        .status_within(BUILD_LIMIT);
    assert!(status.success(), "cannot build {package} (cargo build -p {package} {})", target.join(" "));
    let path = profile_dir.join(file);
    assert!(path.exists(), "{} missing after building {package}", path.display());
    path
}
