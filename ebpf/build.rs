//! Compiles each `bpf/*.bpf.c` with clang into a BPF object and generates its libbpf-rs skeleton.

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const PROGRAMS: &[&str] = &["driver", "allocator", "process"];

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let bpf_dir = manifest_dir.join("bpf");
    let arch = match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86",
        Ok(other) => panic!("gpuprof's BPF programs have no vmlinux.h for {other} yet"),
        Err(_) => panic!("CARGO_CFG_TARGET_ARCH is set by cargo"),
    };

    for program in PROGRAMS {
        let source = bpf_dir.join(format!("{program}.bpf.c"));
        let skeleton = out_dir.join(format!("{program}.skel.rs"));
        SkeletonBuilder::new()
            .source(&source)
            .clang_args([
                format!("-I{}", bpf_dir.display()),
                format!("-I{}", bpf_dir.join(arch).display()),
                format!("-D__TARGET_ARCH_{arch}"),
                "-Wall".to_string(),
                "-Werror".to_string(),
            ])
            .build_and_generate(&skeleton)
            .unwrap_or_else(|e| panic!("building {}: {e:#}", source.display()));
    }
    println!("cargo:rerun-if-changed={}", bpf_dir.display());
}
