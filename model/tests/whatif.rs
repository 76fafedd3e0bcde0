//! `gpuprof whatif` on recordings made on an H100 machine (tests/gpu/validate_whatif.sh, files in
//! testkit/fixtures/h100_whatif beside PyTorch's own counters of each run): the replay check
//! under the settings each ran with, predictions for other settings against what those settings
//! did when the job was run with them, and the refusals.

use std::path::PathBuf;
use std::process::{Command, Output};

use gpuprof_testkit::*;
use serde_json::Value;

fn recording(name: &str) -> PathBuf {
    fixtures().join("h100_whatif").join(format!("{name}.gpuprof"))
}

/// PyTorch's `memory_stats()` at the end of the run the recording is of.
fn pytorch(name: &str) -> Value {
    let path = fixtures().join("h100_whatif").join(format!("{name}.json"));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn whatif(args: &[&str]) -> Output {
    Command::new(gpuprof()).arg("whatif").args(args).output_within(PATIENCE)
}

fn json_of(output: &Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn peak_reserved_of(name: &str) -> u64 {
    pytorch(name)["reserved_bytes.all.peak"].as_u64().unwrap()
}

/// Keeps a buffer of 512 + 2i MiB's half at step i: under the defaults it ran out of memory at
/// step 126 with half the card free in pieces; expandable segments and max_split_size_mb:128
/// both ran all 150 steps.
#[test]
fn halves_predicted_under_expandable_segments_and_max_split_size() {
    let input = recording("halves.default");
    let answer = json_of(&whatif(&[
        input.to_str().unwrap(),
        "-s",
        "expandable_segments:True",
        "-s",
        "max_split_size_mb:128",
        "-f",
        "json",
    ]));
    let process = &answer["processes"][0];
    assert_eq!(process["pid"], 1562);
    assert_eq!(process["check"], "exact");
    assert_eq!(process["requests"], 505);
    // The allocator's 84,160,806,912 bytes and the driver's 304,283,648 free when it gave up.
    assert_eq!(process["budget"], 84_465_090_560u64);

    let runs = process["runs"].as_array().unwrap();
    let settings: Vec<&str> = runs.iter().map(|r| r["setting"].as_str().unwrap()).collect();
    assert_eq!(settings, ["default", "expandable_segments:True", "max_split_size_mb:128"]);

    let ran = &runs[0];
    assert_eq!(ran["peak_reserved"].as_u64(), Some(peak_reserved_of("halves.default")));
    let oom = &ran["out_of_memory"][0];
    assert_eq!((oom["at"]["step"].as_u64(), oom["request"].as_u64()), (Some(378), Some(764 << 20)));
    assert_eq!(oom["at"]["where"], "whatif_job.py:127 halves");
    assert_eq!(oom["every_segment_holds_a_live_block"], true);
    assert!(pytorch("halves.default")["out_of_memory"].as_str().unwrap().contains("Tried to allocate 764.00 MiB"));

    // Expandable segments grow by the kept half: no out of memory. Over the 379 requests the
    // default run made, the expandable run's own recording peaks at the same 43,033,559,040.
    let expandable = &runs[1];
    assert_eq!(expandable["out_of_memory"].as_array().unwrap().len(), 0);
    assert_eq!(expandable["peak_reserved"].as_u64(), Some(43_033_559_040));
    assert!(pytorch("halves.expandable_segments")["out_of_memory"].is_null());

    // max_split_size_mb keeps big blocks whole and gives them back when the card is full: it
    // fills the card and never runs out, as the real run did, at its peak to within 0.01%.
    let max_split = &runs[2];
    assert_eq!(max_split["out_of_memory"].as_array().unwrap().len(), 0);
    let predicted = max_split["peak_reserved"].as_u64().unwrap() as f64;
    let actual = peak_reserved_of("halves.max_split_size_mb") as f64;
    assert!((predicted - actual).abs() / actual < 1e-4, "{predicted} vs {actual}");
    assert!(pytorch("halves.max_split_size_mb")["out_of_memory"].is_null());
}

#[test]
fn the_replay_check_is_exact_on_each_run_under_its_own_settings() {
    for (name, ran_with) in [
        ("halves.expandable_segments", None),
        ("halves.max_split_size_mb", Some("max_split_size_mb:128")),
        ("fragment.expandable_segments", None),
    ] {
        let input = recording(name);
        let mut args = vec![input.to_str().unwrap(), "-f", "json"];
        if let Some(conf) = ran_with {
            args.extend(["--ran-with", conf]);
        }
        let process = &json_of(&whatif(&args))["processes"][0];
        assert_eq!(process["check"], "exact", "{name}");
        assert_eq!(process["ran_with"], ran_with.unwrap_or("expandable_segments:True"), "{name}");
        assert_eq!(process["runs"][0]["peak_reserved"].as_u64(), Some(peak_reserved_of(name)), "{name}");
    }
}

/// Filled the card with 4 MiB blocks, kept one per 20 MiB segment, asked for 8 GiB: out of
/// memory under every setting, because every segment holds a live block.
#[test]
fn fragmentation_no_setting_helps_and_the_smallest_device_says_how_much_more() {
    let input = recording("fragment.default");
    let process = &json_of(&whatif(&[input.to_str().unwrap(), "--suggest", "-f", "json"]))["processes"][0];
    assert_eq!(process["check"], "exact");
    let runs = process["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6, "what happened and the five usual settings");
    for run in runs {
        let oom = &run["out_of_memory"][0];
        assert_eq!(
            (oom["at"]["step"].as_u64(), oom["request"].as_u64()),
            (Some(35_326), Some(8 << 30)),
            "{}",
            run["setting"]
        );
        assert_eq!(oom["every_segment_holds_a_live_block"], true);
        assert_eq!(oom["at"]["where"], "whatif_job.py:120 fragment");
    }
    assert_eq!(runs[0]["peak_reserved"].as_u64(), Some(peak_reserved_of("fragment.default")));
    // The 8 GiB on top of the 15.34 GiB allocated after the frees, in 2 MiB steps; the rest of
    // the device as it was measured when the job ran out.
    let smallest = &process["smallest_device"];
    let allocator = smallest["allocator_budget"].as_u64().unwrap();
    assert!(allocator > 76 << 30 && allocator % (2 << 20) == 0, "{smallest}");
    assert_eq!(smallest["device_memory"].as_u64().unwrap() - allocator, 85_520_809_984 - 84_465_090_560);
}

/// "Would expandable segments let this fit on a 40 GiB card?": the job's own settings on that
/// card beside the one asked, both within the same budget, the share not the allocator's
/// measured where the job ran out of memory.
#[test]
fn on_another_device_the_jobs_own_settings_stand_beside_the_one_asked() {
    let input = recording("halves.default");
    let answer = json_of(&whatif(&[
        input.to_str().unwrap(),
        "--device-memory",
        "40GiB",
        "-s",
        "expandable_segments:True",
        "-f",
        "json",
    ]));
    let process = &answer["processes"][0];
    let settings: Vec<&str> =
        process["runs"].as_array().unwrap().iter().map(|r| r["setting"].as_str().unwrap()).collect();
    assert_eq!(settings, ["default", "default", "expandable_segments:True"], "as it ran, then both on 40 GiB");
    let not_allocators = 85_520_809_984u64 - 84_465_090_560;
    assert_eq!(process["budget"].as_u64(), Some((40u64 << 30) - not_allocators));
    assert_eq!(
        process["budget_source"],
        "40.00 GiB device less 0.98 GiB that was not the allocator's (measured when the job ran out of memory)"
    );
    // On 40 GiB both run out: the job's settings at request 204, expandable segments at 372
    // (it ran out at 378 on its own 80 GB device).
    let first_out = |run: usize| process["runs"][run]["out_of_memory"][0]["at"]["step"].as_u64();
    assert_eq!((first_out(0), first_out(1), first_out(2)), (Some(378), Some(204), Some(372)));
    let table = String::from_utf8_lossy(
        &whatif(&[
            input.to_str().unwrap(),
            "--device-memory",
            "40GiB",
            "-s",
            "expandable_segments:True",
            "-f",
            "table",
        ])
        .stdout,
    )
    .into_owned();
    assert!(
        table.contains("  default on 40.00 GiB: out of memory asking for 0.63 GiB at whatif_job.py:127 halves"),
        "{table}"
    );
}

#[test]
fn a_run_taken_for_the_wrong_settings_is_refused_with_where_it_parted() {
    let input = recording("halves.max_split_size_mb");
    let output = whatif(&[input.to_str().unwrap(), "-f", "table", "-s", "expandable_segments:True"]);
    assert_eq!(output.status.code(), Some(1));
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table.contains("no prediction: the replay under the settings the job ran with parts from the recording at request 2: the job's allocator reported 258.0 MiB (270,532,608 bytes) allocated and 770.0 MiB (807,403,520 bytes) reserved after it, the replay has 258.0 MiB (270,532,608 bytes) and 512.0 MiB (536,870,912 bytes); no prediction is made"),
        "{table}"
    );
    assert!(!table.contains("peak reserved"), "{table}");
}

#[test]
fn bad_questions_get_one_line_each() {
    let input = recording("halves.default");
    let output = whatif(&[input.to_str().unwrap(), "-s", "max_split_mb:128"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("PYTORCH_CUDA_ALLOC_CONF: unknown key `max_split_mb`"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    let output = whatif(&[input.to_str().unwrap(), "--device-memory", "forty"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("`forty` is not a size: write it as 40GiB, 81559MiB or 80GB")
    );

    // A size without a unit, or one no device has, is a slip, not a device.
    for (given, said) in [
        ("24", "`24` has no unit: write the device's memory as 24GiB, 24GB or 24MiB"),
        ("0GiB", "`0GiB` is 0 B: no device has less than 64.0 MiB; write it as 40GiB, 81559MiB or 80GB"),
    ] {
        let output = whatif(&[input.to_str().unwrap(), "--device-memory", given]);
        assert_eq!(output.status.code(), Some(2), "{given}");
        assert!(String::from_utf8_lossy(&output.stderr).contains(said), "{}", String::from_utf8_lossy(&output.stderr));
    }

    let dir = scratch("whatif_no_allocator");
    let file = dir.join("driver.jsonl");
    std::fs::write(
        &file,
        r#"{"ts":1,"pid":7,"tid":7,"source":"ebpf","layer":"driver","op":"alloc","api":"cuMemAlloc_v2","kind":"device","device":0,"addr":"0x7f0000000000","size":1048576,"result":0}
"#,
    )
    .unwrap();
    let output = whatif(&[file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("driver.jsonl has no allocator requests: a what-if replays PyTorch's allocator"),
        "{stderr}"
    );
}

/// A job started with PYTORCH_CUDA_ALLOC_CONF: the capture writes its settings once, on the
/// process's first call, and whatif replays it under them without being told.
#[test]
fn the_settings_a_job_was_started_with_are_recorded_and_replayed_under() {
    let dir = scratch("whatif_started_with");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let mut cmd = Command::new(gpuprof());
    cmd.args(["run", "--output", out.to_str().unwrap(), "--"]).arg(python3()).arg(workloads().join("tensors.py"));
    workload_env(&mut cmd, &log);
    cmd.env("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64,roundup_power2_divisions:4");
    let output = cmd.output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let events = read_events(&out);
    let pid = events.iter().find(|e| e.layer == gpuprof_model::event::Layer::Allocator).expect("allocator events").pid;
    let said: Vec<(usize, Option<&str>)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.pid == pid && e.allocator_settings.is_some())
        .map(|(i, e)| (i, e.allocator_settings.as_deref()))
        .collect();
    let first = events.iter().position(|e| e.pid == pid && e.layer != gpuprof_model::event::Layer::Process).unwrap();
    assert_eq!(said, vec![(first, Some("max_split_size_mb:64,roundup_power2_divisions:4"))]);

    let output = whatif(&[out.to_str().unwrap(), "-f", "json", "--pid", &pid.to_string()]);
    let answer: Value = serde_json::from_slice(&output.stdout).unwrap();
    let process = &answer["processes"][0];
    assert_eq!(process["ran_with"], "max_split_size_mb:64,roundup_power2_divisions:4");
    assert_eq!(process["ran_with_source"], "from the environment it was started with");

    // Through the shim, which reads its own environment (a pod's sidecar cannot read /proc).
    let shimmed = dir.join("shim.jsonl");
    let mut cmd = Command::new(gpuprof());
    cmd.args(["run", "--via", "shim", "--output", shimmed.to_str().unwrap(), "--"])
        .arg(python3())
        .arg(workloads().join("tensors.py"));
    workload_env(&mut cmd, &log);
    cmd.env("PYTORCH_ALLOC_CONF", "expandable_segments:True");
    let output = cmd.output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let events = read_events(&shimmed);
    let said: Vec<&str> = events.iter().filter_map(|e| e.allocator_settings.as_deref()).collect();
    assert_eq!(said, ["expandable_segments:True"]);

    // Started without: PyTorch's defaults, known rather than assumed.
    let bare = dir.join("bare.jsonl");
    let output = gpuprof_run(
        &["--output", bare.to_str().unwrap()],
        &[python3(), workloads().join("tensors.py").to_str().unwrap()],
        &log,
    );
    assert_eq!(output.status.code(), Some(0));
    let process = &json_of_any(&whatif(&[bare.to_str().unwrap(), "-f", "json"]))["processes"][0];
    assert_eq!(
        (process["ran_with"].as_str(), process["ran_with_source"].as_str()),
        (Some("default"), Some("from the environment it was started with"))
    );
}

/// The JSON of a what-if whatever its exit status (a stand-in's allocator need not pass the check).
fn json_of_any(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&output.stderr)))
}
