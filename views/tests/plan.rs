//! `gpuprof whatif --scale`: plan_job.py (a transformer-shaped job over the libcuda, libc10 and
//! libc10_cuda stand-ins, its activations linear in the batch and the sequence length, its
//! attention scores in the square of the length) recorded with `gpuprof run` at some sizes;
//! predictions at another size against the recording made there, request by request and in
//! peak reserved; recordings whose paths differ refused with where; and the largest batch that
//! fits against running the job at every batch on a device of that size.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use gpuprof_model::allocator::{traces, AllocatorTrace, ScalePoint, Scaling};
use gpuprof_testkit::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn job_command(batch: u64, seq: u64) -> Command {
    let mut command = Command::new(python3());
    command.arg(workloads().join("plan_job.py")).args([batch.to_string(), seq.to_string()]);
    command
        .env("LD_LIBRARY_PATH", standin_dir())
        .env("GPUPROF_LIBC10", libc10_standin())
        .env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin());
    command
}

/// The job at `batch` and `seq`, recorded into `dir` as jsonl.
fn record(dir: &Path, batch: u64, seq: u64, env: &[(&str, &str)]) -> PathBuf {
    let out = dir.join(format!("b{batch}-s{seq}.jsonl"));
    let job = job_command(batch, seq);
    let mut command = Command::new(gpuprof());
    command.args(["run", "-o", out.to_str().unwrap(), "--"]).arg(job.get_program()).args(job.get_args());
    for (key, value) in job.get_envs() {
        command.env(key, value.unwrap());
    }
    command.envs(env.iter().copied());
    let output = command.output_within(Duration::from_secs(120));
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    out
}

fn trace_of(path: &Path) -> AllocatorTrace {
    let mut found = traces(&read_events(path));
    assert_eq!(found.len(), 1, "one process with allocator requests in {}", path.display());
    found.remove(0)
}

fn whatif(args: &[&str]) -> Output {
    Command::new(gpuprof()).arg("whatif").args(args).output_within(Duration::from_secs(120))
}

fn json_of(output: &Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn point(plan: &Value, value: u64) -> &Value {
    let points = plan["processes"][0]["points"].as_array().unwrap();
    points.iter().find(|p| p["value"] == value).unwrap_or_else(|| panic!("no point at {value}: {plan}"))
}

#[test]
fn two_batches_predict_a_third_request_by_request_and_in_peak_reserved() {
    let dir = scratch("plan_batch");
    let (b2, b4, b7) = (record(&dir, 2, 128, &[]), record(&dir, 4, 128, &[]), record(&dir, 7, 128, &[]));
    let (t2, t4, t7) = (trace_of(&b2), trace_of(&b4), trace_of(&b7));
    // 3 weights, then per step and layer: scores, activation, scores freed; per layer in the
    // backward: gradient, gradient freed, activation freed; the weights freed: 2 × 4 × 6 + 6.
    assert_eq!(t7.requests.len(), 54);
    let scaling =
        Scaling::align(vec![ScalePoint { value: 2, trace: &t2 }, ScalePoint { value: 4, trace: &t4 }]).unwrap();
    assert_eq!(scaling.requests_at(7).unwrap().requests, t7.requests);

    let plan = json_of(&whatif(&[
        b2.to_str().unwrap(),
        b4.to_str().unwrap(),
        "--scale",
        "batch=2,4",
        "--at",
        "7",
        "-f",
        "json",
    ]));
    let process = &plan["processes"][0];
    assert_eq!(process["check"], "exact");
    assert_eq!(process["settings"], serde_json::json!(["default"]));
    let predicted = &point(&plan, 7);
    assert_eq!(predicted["reach"], "extrapolated, 1.75× the largest recorded");
    let recorded = json_of(&whatif(&[b7.to_str().unwrap(), "-f", "json"]));
    let recorded_peak = recorded["processes"][0]["runs"][0]["peak_reserved"].as_u64().unwrap();
    // At batch 7: the weights' 72 MiB, the four layers' activations (7 × 2 × 6 = 84 MiB each)
    // and the last layer's scores (7 × 2² × 4 = 112 MiB), not yet freed.
    assert_eq!(recorded_peak, (72 + 4 * 84 + 112) * MIB);
    assert_eq!(predicted["runs"][0]["peak_reserved"].as_u64(), Some(recorded_peak));
    let job = std::fs::read_to_string(workloads().join("plan_job.py")).unwrap();
    let malloc_line =
        job.lines().position(|l| l.contains("block = self.torch.standin_caching_malloc(size)")).unwrap() + 1;
    assert_eq!(predicted["runs"][0]["peak_at"]["where"], format!("plan_job.py:{malloc_line} Job.malloc"));
    assert_eq!(point(&plan, 2)["reach"], "recorded");
}

#[test]
fn three_lengths_predict_attention_that_grows_with_the_square() {
    let dir = scratch("plan_length");
    let recordings: Vec<PathBuf> = [64, 128, 192, 320].iter().map(|&seq| record(&dir, 2, seq, &[])).collect();
    let traces: Vec<AllocatorTrace> = recordings.iter().map(|r| trace_of(r)).collect();
    let points = (0..3).map(|i| ScalePoint { value: [64, 128, 192][i], trace: &traces[i] }).collect();
    let scaling = Scaling::align(points).unwrap();
    assert_eq!(scaling.requests_at(320).unwrap().requests, traces[3].requests);

    let args: Vec<&str> = recordings[..3].iter().map(|p| p.to_str().unwrap()).collect();
    let mut args = args.clone();
    args.extend(["--scale", "seq_len=64,128,192", "--at", "320", "-f", "json"]);
    let plan = json_of(&whatif(&args));
    let recorded = json_of(&whatif(&[recordings[3].to_str().unwrap(), "-f", "json"]));
    assert_eq!(point(&plan, 320)["runs"][0]["peak_reserved"], recorded["processes"][0]["runs"][0]["peak_reserved"]);
    // Two of them draw a line, which misses the square: at 320 the scores are 2 × 5² × 4 = 200
    // MiB; the line through 64 (8 MiB) and 128 (32 MiB) gives 104.
    let line = json_of(&whatif(&[args[0], args[1], "--scale", "seq_len=64,128", "--at", "320", "-f", "json"]));
    assert!(
        point(&line, 320)["runs"][0]["peak_reserved"].as_u64() < point(&plan, 320)["runs"][0]["peak_reserved"].as_u64(),
        "{line}"
    );
}

#[test]
fn recordings_whose_paths_differ_are_refused_with_where() {
    let dir = scratch("plan_parted");
    let with_workspace = [("WORKSPACE_FROM_BATCH", "8")];
    let (b4, b8) = (record(&dir, 4, 128, &with_workspace), record(&dir, 8, 128, &with_workspace));
    let output = whatif(&[b4.to_str().unwrap(), b8.to_str().unwrap(), "--scale", "batch=4,8", "-f", "table"]);
    assert_eq!(output.status.code(), Some(1));
    let table = String::from_utf8_lossy(&output.stdout);
    let job = std::fs::read_to_string(workloads().join("plan_job.py")).unwrap();
    let line_of = |text: &str| job.lines().position(|l| l.contains(text)).unwrap() + 1;
    // At batch 8 the workspace is block 3; at batch 4 block 3 is the first scores, freed at
    // request 5 where batch 8 allocates its first activation.
    let expected = format!(
        "  no prediction: the recordings at 4 and 8 part at request 5: block 3 freed at 4, block 5 allocated ({} bytes) at 8; \
         the job does not take the same path at both sizes, so no size between or beyond them can be predicted; \
         request 5 is at plan_job.py:{} Job.attention at 4, at plan_job.py:{} Job.malloc at 8",
        8 * 2 * 6 * MIB,
        line_of("self.torch.standin_caching_free(scores)"),
        line_of("block = self.torch.standin_caching_malloc(size)"),
    );
    assert!(table.lines().any(|l| l == expected), "{table}\nexpected: {expected}");
    assert!(!table.contains("recorded "), "{table}");
}

#[test]
fn the_largest_batch_that_fits_is_what_running_every_batch_finds() {
    let dir = scratch("plan_largest");
    let (b2, b4) = (record(&dir, 2, 128, &[]), record(&dir, 4, 128, &[]));
    let device = 2048 * MIB;
    let plan = json_of(&whatif(&[
        b2.to_str().unwrap(),
        b4.to_str().unwrap(),
        "--scale",
        "batch=2,4",
        "--largest",
        "--device-memory",
        "2GiB",
        "-f",
        "json",
    ]));
    let process = &plan["processes"][0];
    // The stand-in device has no memory of its own: the job's cuMemGetInfo said so.
    assert_eq!(process["budget"].as_u64(), Some(device));
    let largest = &process["largest"][0];
    assert_eq!(largest["role"], "the job's settings");
    let predicted = largest["value"].as_u64().unwrap();

    // Every batch from 1 up, run on a stand-in device of that size: the last that does not run
    // out of memory.
    let mut brute = 0;
    for batch in 1..=40 {
        let mut job = job_command(batch, 128);
        job.env("GPUPROF_STANDIN_DEVICE_MEMORY", device.to_string()).env("PLAN_JOB_IMPORT_SECONDS", "0");
        let output = job.output_within(Duration::from_secs(60));
        match output.status.code() {
            Some(0) => brute = batch,
            Some(1) => {
                assert!(String::from_utf8_lossy(&output.stdout).starts_with("out of memory at step 0"));
                break;
            }
            other => panic!("batch {batch}: {other:?} {}", String::from_utf8_lossy(&output.stderr)),
        }
    }
    assert_eq!(predicted, brute);
    assert_eq!(predicted, 30);
    assert_eq!(largest["margin"].as_u64(), Some(device - largest["peak_reserved"].as_u64().unwrap()));
    // The plan names the largest value too, with its peak.
    assert_eq!(point(&plan, 30)["runs"][0]["peak_reserved"], largest["peak_reserved"]);
}

#[test]
fn a_plan_is_a_chart_a_person_can_read() {
    let dir = scratch("plan_page");
    let (b2, b4) = (record(&dir, 2, 128, &[]), record(&dir, 4, 128, &[]));
    let page = dir.join("plan.html");
    let output = whatif(&[
        b2.to_str().unwrap(),
        b4.to_str().unwrap(),
        "--scale",
        "batch=2,4",
        "--at",
        "16",
        "--largest",
        "--device-memory",
        "2GiB",
        "-s",
        "expandable_segments:True",
        "-f",
        "html",
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(html.matches("<polyline class=\"setting\"").count(), 2, "a line per setting");
    assert!(html.contains("data-setting=\"default\""));
    assert!(html.contains("data-setting=\"expandable_segments:True\""));
    assert_eq!(html.matches("<circle class=\"recorded\"").count(), 4, "two recorded values, two settings");
    assert!(html.contains("the allocator's share of the device: 2.00 GiB"));
    assert!(html.contains(">largest that fits: 30</text>"));
    assert!(html.contains("<p class=\"largest\">Largest that fits with default (the job's settings): batch 30"));
}
