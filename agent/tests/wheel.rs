//! `pip install gpuprof-memory`, offline: the wheel is packed by scripts/build-wheel.py from this test
//! build's own binaries (no second compile), installed with pytest from the test tools' wheelhouse
//! into a fresh virtual environment, and used from there as a user would: `gpuprof --version`,
//! its man pages and completion scripts in place, a capture through the installed shim on the
//! stand-ins, and the pytest plugin's own tests (testkit/fixtures/pytest_plugin: leaking and clean
//! tests, limits, a process with driver memory only, a bad marker), run without privileges.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use gpuprof_model::event::{Layer, Op, Source};
use gpuprof_testkit::collector::collector_bin;
use gpuprof_testkit::*;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The wheel built once for every test here, and the virtual environment it is installed in.
struct Installed {
    wheel: PathBuf,
    venv: PathBuf,
}

fn run(command: &mut Command) -> Output {
    command.output_within(PATIENCE)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn installed() -> &'static Installed {
    static INSTALLED: OnceLock<Installed> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let wheelhouse = test_tools().join("wheelhouse");
        assert!(
            wheelhouse.is_dir(),
            "{} missing: run scripts/install-prerequisites.sh (it puts pytest's wheels there for this offline install)",
            wheelhouse.display()
        );
        let dir = scratch("wheel");
        let builder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-wheel.py");
        let built = run(Command::new(python3())
            .arg(&builder)
            .arg("--gpuprof")
            .arg(gpuprof())
            .arg("--collector")
            .arg(collector_bin())
            .arg("--shim")
            .arg(shim_library())
            .arg("--out")
            .arg(dir.join("dist")));
        assert_eq!(built.status.code(), Some(0), "{}", text(&built.stderr));
        let wheel = PathBuf::from(text(&built.stdout).trim());
        let venv = dir.join("venv");
        let created = run(Command::new(python3()).args(["-m", "venv"]).arg(&venv));
        assert_eq!(created.status.code(), Some(0), "{}", text(&created.stderr));
        let pip = run(Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index", "--find-links"])
            .arg(&wheelhouse)
            .arg(&wheel)
            .arg("pytest")
            .env_remove("PIP_FIND_LINKS")
            .env_remove("PIP_INDEX_URL")
            .env_remove("PIP_EXTRA_INDEX_URL"));
        assert_eq!(pip.status.code(), Some(0), "{}{}", text(&pip.stdout), text(&pip.stderr));
        Installed { wheel, venv }
    })
}

/// manylinux_X_Y of the newest GLIBC_X.Y any of the binaries needs, read with objdump (the
/// builder reads readelf's version sections: two readings of the same fact).
fn expected_platform() -> String {
    let mut newest = (0u32, 0u32);
    for binary in [Path::new(gpuprof()), collector_bin(), shim_library()] {
        let dump = run(Command::new("objdump").arg("-T").arg(binary));
        assert_eq!(dump.status.code(), Some(0), "{}", text(&dump.stderr));
        for word in text(&dump.stdout).split(|c: char| c.is_whitespace() || c == '(' || c == ')') {
            let Some(version) = word.strip_prefix("GLIBC_") else { continue };
            let mut parts = version.split('.').map(|p| p.parse::<u32>());
            if let (Some(Ok(major)), Some(Ok(minor))) = (parts.next(), parts.next()) {
                newest = newest.max((major, minor));
            }
        }
    }
    assert!(newest >= (2, 17), "objdump found no plausible GLIBC version: {newest:?}");
    format!("manylinux_{}_{}_x86_64", newest.0, newest.1)
}

#[test]
fn the_wheel_installs_the_binaries_the_shim_and_the_plugin() {
    let installed = installed();
    let name = installed.wheel.file_name().unwrap().to_str().unwrap().to_string();
    // `gpuprof` on PyPI is another project's: the distribution is gpuprof-memory.
    assert_eq!(name, format!("gpuprof_memory-{VERSION}-py3-none-{}.whl", expected_platform()));
    let listing = run(Command::new(python3())
        .args(["-c", "import sys, zipfile; print('\\n'.join(sorted(zipfile.ZipFile(sys.argv[1]).namelist())))"])
        .arg(&installed.wheel));
    let data = format!("gpuprof_memory-{VERSION}.data");
    let info = format!("gpuprof_memory-{VERSION}.dist-info");
    let mut expected = vec![
        format!("{data}/data/lib/gpuprof/libgpuprof_shim.so"),
        format!("{data}/scripts/gpuprof"),
        format!("{data}/scripts/gpuprof-collector"),
        format!("{info}/METADATA"),
        format!("{info}/RECORD"),
        format!("{info}/WHEEL"),
        format!("{info}/entry_points.txt"),
        "gpuprof/__init__.py".to_string(),
        "gpuprof/__main__.py".to_string(),
        "gpuprof/checks.py".to_string(),
        "gpuprof/pytest_plugin.py".to_string(),
    ];
    // The man pages and completion scripts, as the binary makes them.
    let pages = scratch("wheel_man_pages");
    assert_eq!(run(Command::new(gpuprof()).arg("man").arg("--dir").arg(&pages)).status.code(), Some(0));
    let mut made: Vec<(String, Vec<u8>)> = std::fs::read_dir(&pages)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (format!("share/man/man1/{}", e.file_name().to_string_lossy()), std::fs::read(e.path()).unwrap()))
        .collect();
    assert_eq!(made.len(), 13, "gpuprof.1 and a page for each of its 12 verbs");
    for (shell, place) in [
        ("bash", "share/bash-completion/completions/gpuprof"),
        ("zsh", "share/zsh/site-functions/_gpuprof"),
        ("fish", "share/fish/vendor_completions.d/gpuprof.fish"),
    ] {
        made.push((place.to_string(), run(Command::new(gpuprof()).args(["completions", shell])).stdout));
    }
    expected.extend(made.iter().map(|(place, _)| format!("{data}/data/{place}")));
    expected.sort();
    assert_eq!(text(&listing.stdout).lines().collect::<Vec<_>>(), expected);
    // Installed under the prefix, where man and the shells look.
    for (place, content) in &made {
        let on_disk = std::fs::read(installed.venv.join(place)).unwrap_or_else(|e| panic!("{place}: {e}"));
        assert!(on_disk == *content, "{place} differs from what gpuprof makes");
    }

    let bin = installed.venv.join("bin");
    for binary in ["gpuprof", "gpuprof-collector"] {
        let version = run(Command::new(bin.join(binary)).arg("--version"));
        assert_eq!((version.status.code(), text(&version.stdout)), (Some(0), format!("{binary} {VERSION}\n")));
    }
    let shim = run(Command::new(bin.join("python")).args(["-m", "gpuprof", "shim"]).env_remove("GPUPROF_SHIM"));
    let expected_shim = installed.venv.join("lib/gpuprof/libgpuprof_shim.so").canonicalize().unwrap();
    assert_eq!(text(&shim.stdout), format!("{}\n", expected_shim.display()), "{}", text(&shim.stderr));
    // pytest finds the plugin through the wheel's pytest11 entry point.
    let plugins = run(Command::new(bin.join("pytest")).args(["--help"]));
    let help = text(&plugins.stdout);
    assert!(help.contains("\ngpuprof:\n  --gpuprof "), "{help}");
}

/// A library that links one outside the manylinux policy (here the libc10_cuda stand-in, which
/// links the libc10 stand-in) is refused, saying which, and no wheel is written.
#[test]
fn the_builder_refuses_a_library_outside_the_manylinux_policy() {
    let dir = scratch("wheel_refused");
    let builder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-wheel.py");
    let refused = run(Command::new(python3())
        .arg(&builder)
        .arg("--gpuprof")
        .arg(gpuprof())
        .arg("--collector")
        .arg(collector_bin())
        .arg("--shim")
        .arg(libc10_cuda_standin())
        .arg("--out")
        .arg(dir.join("dist")));
    assert_eq!(
        (refused.status.code(), text(&refused.stdout), text(&refused.stderr)),
        (
            Some(1),
            String::new(),
            "build-wheel: libc10_cuda.so links libc10.so, outside the manylinux policy: link it statically (the workspace vendors libbpf, libelf and zlib) or leave it out of the wheel\n".to_string()
        )
    );
    assert!(!dir.join("dist").exists());
}

/// `gpuprof run --via shim` from the virtual environment finds the shim the wheel installed
/// (`<prefix>/lib/gpuprof/`) and captures the workload's blocks and driver calls exactly.
#[test]
fn the_installed_gpuprof_captures_through_the_installed_shim() {
    let installed = installed();
    let dir = scratch("wheel_capture");
    let (log, events) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let mut command = Command::new(installed.venv.join("bin/gpuprof"));
    command.args(["run", "--via", "shim", "-f", "jsonl", "-o", events.to_str().unwrap(), "--"]);
    command.arg(python3()).arg(workloads().join("tensors.py"));
    workload_env(&mut command, &log);
    command.env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin()).env_remove("GPUPROF_SHIM");
    let output = run(&mut command);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let shim = installed.venv.join("lib/gpuprof/libgpuprof_shim.so").canonicalize().unwrap();
    assert_eq!(
        stderr.lines().next().unwrap(),
        format!("gpuprof: capturing `{}` through {} (no eBPF)", python3(), shim.display())
    );
    let expected = read_expected(&log);
    let pid = pid_of_role(&expected, "parent");
    let blocks: Vec<serde_json::Value> = expected
        .iter()
        .filter(|e| e["layer"] == "allocator")
        .map(|e| {
            let mut e = e.clone();
            e.as_object_mut().unwrap().remove("segment");
            e
        })
        .collect();
    let segments: Vec<serde_json::Value> =
        expected_calls(&expected).into_iter().filter(|e| e["layer"] != "allocator").collect();
    let captured = read_events(&events);
    let allocator: Vec<&gpuprof_model::Event> = captured.iter().filter(|e| e.layer == Layer::Allocator).collect();
    assert_eq!(segments.iter().filter(|e| e["api"] == "cuMemAlloc_v2").count(), 3);
    assert_same_calls_from(&blocks, &allocator, Source::Shim);
    assert_same_calls_from(&segments, &driver_events(&captured), Source::Shim);
    let last = captured.last().unwrap();
    assert_eq!((last.op, last.pid, captured.len()), (Op::Exit, pid, blocks.len() + segments.len() + 1));
}

/// A copy of the plugin's fixture tests in a directory of their own (pytest's rootdir).
fn plugin_tests(name: &str) -> PathBuf {
    let dir = scratch(name);
    for entry in std::fs::read_dir(fixtures().join("pytest_plugin")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "py") {
            std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    dir
}

/// `pytest -v ARGS` from the virtual environment in `dir`, with every capability dropped (the
/// plugin needs none), on the stand-ins.
fn pytest(dir: &Path, args: &[&str]) -> Output {
    pytest_over(standin_dir(), dir, args)
}

/// `pytest`, with `libraries` where the loader looks first (the stand-ins, with or without
/// libcupti).
fn pytest_over(libraries: &Path, dir: &Path, args: &[&str]) -> Output {
    let installed = installed();
    let mut command = Command::new("setpriv");
    command.args(["--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs", "--"]);
    command.arg(installed.venv.join("bin/pytest")).args(["-v", "-p", "no:cacheprovider", "--color=no"]).args(args);
    command
        .current_dir(dir)
        .env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin())
        .env("LD_LIBRARY_PATH", libraries)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("COLUMNS", "200")
        // As under CI: elsewhere pytest cuts the short summary's lines to the terminal's width.
        .env("CI", "true")
        .env_remove("GPUPROF_SHIM")
        .env_remove("LD_PRELOAD")
        .env_remove("PYTEST_ADDOPTS");
    run(&mut command)
}

/// What one pytest run said: each test's outcome, each failure's text, the closing counts.
struct Session {
    outcomes: Vec<(String, String)>,
    failures: Vec<(String, String)>,
    counts: String,
}

fn session(output: &Output) -> Session {
    let stdout = text(&output.stdout);
    let outcomes = stdout
        .lines()
        .filter_map(|line| {
            let (test, rest) = line.split_once(' ')?;
            let outcome = rest.split_whitespace().next()?;
            (test.contains("::") && ["PASSED", "FAILED", "ERROR"].contains(&outcome))
                .then(|| (test.to_string(), outcome.to_string()))
        })
        .collect();
    let mut failures: Vec<(String, String)> = Vec::new();
    let mut in_failures = false;
    for line in stdout.lines() {
        if line.starts_with('=') {
            in_failures = line.contains(" FAILURES ");
            continue;
        }
        if !in_failures {
            continue;
        }
        if line.starts_with("___") && line.ends_with("___") {
            failures.push((line.trim_matches(|c| c == '_' || c == ' ').to_string(), String::new()));
        } else if let Some((_, body)) = failures.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    let last = stdout.lines().last().unwrap_or_default().trim_matches(|c| c == '=' || c == ' ');
    let counts = last.rsplit_once(" in ").map_or(last, |(counts, _)| counts).to_string();
    Session { outcomes, failures, counts }
}

/// The line of `file` holding `marker` (a comment in the fixture), 1-based.
fn line_of(dir: &Path, file: &str, marker: &str) -> usize {
    let source = std::fs::read_to_string(dir.join(file)).unwrap();
    source.lines().position(|l| l.contains(marker)).unwrap_or_else(|| panic!("{marker:?} not in {file}")) + 1
}

fn outcomes(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(t, o)| (t.to_string(), o.to_string())).collect()
}

/// Under `--gpuprof` the leaking tests fail naming the line that allocated what they kept (the
/// allocator's frame, then the test's), the test over its limit fails naming the largest block
/// live at the peak, and the clean ones pass: blocks from a fixture's setup are not the test's,
/// the allocator's cache is not a leak, an unmarked test is not checked, a peak equal to the limit
/// is within it; decimal units and ints of bytes are limits too.
#[test]
fn the_plugin_fails_leaking_tests_and_tests_over_their_limit_with_the_line() {
    let dir = plugin_tests("wheel_pytest_markers");
    let output = pytest(&dir, &["--gpuprof", "test_markers.py"]);
    let said = session(&output);
    assert_eq!(output.status.code(), Some(1), "{}{}", text(&output.stdout), text(&output.stderr));
    assert_eq!(
        said.outcomes,
        outcomes(&[
            ("test_markers.py::test_leaks", "FAILED"),
            ("test_markers.py::test_frees_everything", "PASSED"),
            ("test_markers.py::test_uses_a_block_from_setup", "PASSED"),
            ("test_markers.py::test_over_the_limit", "FAILED"),
            ("test_markers.py::test_under_the_limit", "PASSED"),
            ("test_markers.py::TestInAClass::test_leaks_through_a_helper", "FAILED"),
            ("test_markers.py::test_unmarked_leaks_are_not_checked", "PASSED"),
            ("test_markers.py::test_over_a_decimal_limit", "FAILED"),
            ("test_markers.py::test_at_a_limit_in_bytes", "PASSED"),
        ])
    );
    assert_eq!(said.counts, "4 failed, 5 passed");
    let malloc = line_of(&dir, "toy_gpu.py", "_report(addr, size, _allocated");
    let at = |marker: &str| line_of(&dir, "test_markers.py", marker);
    // Blocks in allocation order from 0x7f0000000000: test_leaks 4 MiB (kept) at 0, 1 MiB;
    // 3 x 1 MiB; the fixture's 3 MiB, 2 MiB; test_over_the_limit's 3 MiB at 0xd00000, 2 MiB;
    // the fixture's 3 MiB, 3 x 3 MiB; the helper's 512 KiB at 0x1e00000; the unmarked test's
    // 1 MiB; test_over_a_decimal_limit's 3 MiB at 0x1f80000, 2 MiB; then 3 MiB, 2 MiB again.
    assert_eq!(
        said.failures,
        vec![
            (
                "test_leaks".to_string(),
                format!(
                    "gpu_leak_free: 4.0 MiB in 1 block allocated during the test are still live; the largest, 4.0 MiB at 0x7f0000000000, allocated at:\n    toy_gpu.py:{malloc} in malloc\n    test_markers.py:{} in test_leaks\n",
                    at("# the leak")
                )
            ),
            (
                "test_over_the_limit".to_string(),
                format!(
                    "limit_gpu_memory: 5.0 MiB in 2 blocks allocated during the test were live at its peak, over the limit of 4.0 MiB; the largest, 3.0 MiB at 0x7f0000d00000, allocated at:\n    toy_gpu.py:{malloc} in malloc\n    test_markers.py:{} in test_over_the_limit\n",
                    at("# the largest at the peak")
                )
            ),
            (
                "TestInAClass.test_leaks_through_a_helper".to_string(),
                format!(
                    "gpu_leak_free: 512.0 KiB in 1 block allocated during the test are still live; the largest, 512.0 KiB at 0x7f0001e00000, allocated at:\n    toy_gpu.py:{malloc} in malloc\n    test_markers.py:{} in make_cache\n    test_markers.py:{} in TestInAClass.test_leaks_through_a_helper\n",
                    at("# the helper's line"),
                    at("self.cache = make_cache()")
                )
            ),
            (
                "test_over_a_decimal_limit".to_string(),
                format!(
                    "limit_gpu_memory: 5.0 MiB in 2 blocks allocated during the test were live at its peak, over the limit of 4.8 MiB (5000000 B); the largest, 3.0 MiB at 0x7f0001f80000, allocated at:\n    toy_gpu.py:{malloc} in malloc\n    test_markers.py:{} in test_over_a_decimal_limit\n",
                    at("# the largest over 5 MB")
                )
            ),
        ]
    );
    // The short summary names the test's line in the offender's stack.
    let summary: Vec<String> =
        text(&output.stdout).lines().filter(|l| l.starts_with("FAILED ")).map(str::to_string).collect();
    assert_eq!(
        summary,
        [
            format!("FAILED test_markers.py::test_leaks - gpu_leak_free: 4.0 MiB in 1 block allocated during the test are still live; the largest, 4.0 MiB at 0x7f0000000000, allocated at test_markers.py:{}", at("# the leak")),
            format!("FAILED test_markers.py::test_over_the_limit - limit_gpu_memory: 5.0 MiB in 2 blocks allocated during the test were live at its peak, over the limit of 4.0 MiB; the largest, 3.0 MiB at 0x7f0000d00000, allocated at test_markers.py:{}", at("# the largest at the peak")),
            format!("FAILED test_markers.py::TestInAClass::test_leaks_through_a_helper - gpu_leak_free: 512.0 KiB in 1 block allocated during the test are still live; the largest, 512.0 KiB at 0x7f0001e00000, allocated at test_markers.py:{}", at("self.cache = make_cache()")),
            format!("FAILED test_markers.py::test_over_a_decimal_limit - limit_gpu_memory: 5.0 MiB in 2 blocks allocated during the test were live at its peak, over the limit of 4.8 MiB (5000000 B); the largest, 3.0 MiB at 0x7f0001f80000, allocated at test_markers.py:{}", at("# the largest over 5 MB")),
        ]
    );
}

#[test]
fn without_the_flag_the_markers_do_nothing() {
    let dir = plugin_tests("wheel_pytest_no_flag");
    let output = pytest(&dir, &["test_markers.py", "test_driver.py"]);
    let said = session(&output);
    assert_eq!(output.status.code(), Some(0), "{}{}", text(&output.stdout), text(&output.stderr));
    assert_eq!(said.counts, "11 passed");
    assert!(said.failures.is_empty());
    // Nor is the bad marker looked at.
    let output = pytest(&dir, &["test_bad_marker.py"]);
    assert_eq!((output.status.code(), session(&output).counts), (Some(0), "2 passed".to_string()));
}

/// A process that never reported an allocator block (no PyTorch) is judged on its driver
/// allocations, and the message says so.
#[test]
fn without_allocator_events_the_driver_allocations_count() {
    let dir = plugin_tests("wheel_pytest_driver");
    let output = pytest(&dir, &["--gpuprof", "test_driver.py"]);
    let said = session(&output);
    assert_eq!(output.status.code(), Some(1), "{}{}", text(&output.stdout), text(&output.stderr));
    assert_eq!(said.counts, "2 failed");
    let alloc = line_of(&dir, "toy_gpu.py", "cuMemAlloc_v2(");
    let at = |marker: &str| line_of(&dir, "test_driver.py", marker);
    // The stand-in's device memory from 0x7f2000000000 in 2 MiB steps: 8 MiB (kept), 2 MiB, then
    // 6 MiB at 0xa00000 and 4 MiB.
    assert_eq!(
        said.failures,
        vec![
            (
                "test_driver_leak".to_string(),
                format!(
                    "gpu_leak_free: 8.0 MiB in 1 driver allocation made during the test are still live (no allocator events in this process: driver memory counted); the largest, 8.0 MiB at 0x7f2000000000, allocated at:\n    toy_gpu.py:{alloc} in driver_alloc\n    test_driver.py:{} in test_driver_leak\n",
                    at("# the driver leak")
                )
            ),
            (
                "test_driver_over_the_limit".to_string(),
                format!(
                    "limit_gpu_memory: 10.0 MiB in 2 driver allocations made during the test were live at its peak, over the limit of 8.0 MiB (no allocator events in this process: driver memory counted); the largest, 6.0 MiB at 0x7f2000a00000, allocated at:\n    toy_gpu.py:{alloc} in driver_alloc\n    test_driver.py:{} in test_driver_over_the_limit\n",
                    at("# the largest driver allocation")
                )
            ),
        ]
    );
}

/// Without libcupti the shim sees no driver call: a test that keeps 8 MiB of driver memory, with
/// no allocator events to go by, is not passed blind: it fails, saying why and what to do.
#[test]
fn a_test_the_shim_cannot_see_fails_saying_why() {
    let dir = plugin_tests("wheel_pytest_blind");
    let output = pytest_over(standin_dir_without_cupti(), &dir, &["--gpuprof", "test_driver.py"]);
    let said = session(&output);
    assert_eq!(output.status.code(), Some(1), "{}{}", text(&output.stdout), text(&output.stderr));
    assert_eq!(said.counts, "2 failed");
    let why = "gpuprof: this test's GPU memory was not checked: no allocator events in this process, and the shim does not see its driver calls: no libcupti was found: set GPUPROF_CUPTI=/path/to/libcupti.so (it comes with the CUDA toolkit and with PyTorch's nvidia-cuda-cupti wheel); a test is not passed blind\n";
    let names: Vec<&str> = said.failures.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["test_driver_leak", "test_driver_over_the_limit"]);
    // The first test is where CUDA started: pytest shows the shim's own warning under it.
    let (first, second) = (&said.failures[0].1, &said.failures[1].1);
    let warning = ": driver calls are not captured in-process: no libcupti (loaded, $GPUPROF_CUPTI, beside libcudart, $CUDA_HOME, /usr/local/cuda, the loader's path): set GPUPROF_CUPTI=/path/to/libcupti.so\n";
    assert!(first.starts_with(why) && first.contains("Captured stderr call") && first.ends_with(warning), "{first}");
    assert_eq!(second, why);
}

#[test]
fn a_marker_the_plugin_cannot_read_is_a_usage_error_for_a_test_that_runs() {
    let dir = plugin_tests("wheel_pytest_bad_marker");
    let output = pytest(&dir, &["--gpuprof", "test_bad_marker.py"]);
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stdout));
    assert_eq!(
        text(&output.stderr),
        "ERROR: test_bad_marker.py::test_misspelt_limit: @pytest.mark.limit_gpu_memory('1 GB2'): '1 GB2' is not a size: write a number and a unit, such as \"1 GiB\" (units B, KiB, MiB, GiB, KB, MB, GB), or an int of bytes\n\n"
    );
    // Only the tests that run are read: with the bad one deselected, the run goes on.
    let output = pytest(&dir, &["--gpuprof", "test_bad_marker.py", "-k", "healthy"]);
    assert_eq!(output.status.code(), Some(0), "{}{}", text(&output.stdout), text(&output.stderr));
    assert_eq!(session(&output).counts, "1 passed, 1 deselected");
}
