//! pystack's CPython layouts against the interpreters themselves, on every CPython from 3.8 to
//! 3.13 installed: the offset tables are re-derived from each version's own headers, and 3.13's
//! `_Py_DebugOffsets`, read from a live interpreter, equal its table.

use std::process::{Command, Stdio};

use gpuprof_pystack::offsets::{layout_for, Version};
use gpuprof_testkit::*;

fn version_of(label: &str) -> Version {
    let (major, minor) = label.split_once('.').unwrap();
    Version { major: major.parse().unwrap(), minor: minor.parse().unwrap() }
}

/// Builds `pystack/derive/offsets.c` against a version's headers and reads what it prints.
fn derived_offsets(python: &std::path::Path, label: &str) -> Vec<(String, u16)> {
    let prefix = python.parent().unwrap().parent().unwrap();
    let include = prefix.join("include").join(format!("python{label}"));
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("derive/offsets.c");
    let binary = scratch(&format!("offsets_{label}")).join("offsets");
    let status = Command::new("cc")
        .arg(format!("-I{}", include.display()))
        .arg(format!("-I{}", include.join("internal").display()))
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .status_within(PATIENCE);
    assert!(status.success(), "compiling offsets.c against CPython {label}'s headers");
    let output = Command::new(&binary).output_within(PATIENCE);
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_string(), value.parse().unwrap()))
        .collect()
}

#[test]
fn offset_tables_match_each_versions_headers() {
    for (label, python) in pythons() {
        let derived = derived_offsets(&python, &label);
        let table = layout_for(version_of(&label)).unwrap().offsets;
        for (name, value) in table.named() {
            let from_headers = derived.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
            assert_eq!(value, from_headers, "CPython {label}: {name}");
        }
    }
}

#[test]
fn cpython_313_publishes_the_same_offsets() {
    // Outside CI a machine without 3.13 has nothing to compare here (pythons() said so).
    let Some((_, python)) = pythons().into_iter().find(|(label, _)| label == "3.13") else { return };
    let mut child = Command::new(&python)
        .args(["-c", "import sys, time; print('ready', flush=True); time.sleep(30)"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    line_within(&mut std::io::BufReader::new(child.stdout.as_mut().unwrap()), READY_LIMIT, "the workload's first line");
    let interpreter = gpuprof_pystack::find_interpreter(child.id()).unwrap().expect("an interpreter");
    child.kill().unwrap();
    child.wait_within(PATIENCE, "child");
    assert_eq!(interpreter.layout.version, Version { major: 3, minor: 13 });
    assert!(interpreter.module.ends_with("libpython3.13.so.1.0"), "{}", interpreter.module);
    // Read from _Py_DebugOffsets in the live interpreter, equal to the table from the headers.
    assert_eq!(interpreter.layout.offsets, layout_for(interpreter.layout.version).unwrap().offsets);
}
