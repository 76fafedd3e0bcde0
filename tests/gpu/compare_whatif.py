"""Predictions of `gpuprof whatif` against the runs they predict (validate_whatif.sh's results).

    compare_whatif.py OUT GPUPROF

For each job: the replay check of each of its three recordings under the settings it ran with
(as the recording says them), then the predictions made from the default recording alone for
expandable_segments:True and max_split_size_mb:128, beside PyTorch's own peak reserved and
out-of-memory of the run with that setting. A job whose default run ran out of memory asked
nothing after it: its prediction is compared over the requests it made.
"""
import json
import pathlib
import subprocess
import sys

out, gpuprof = pathlib.Path(sys.argv[1]), sys.argv[2]
SETTINGS = [("default", "default"), ("expandable_segments", "expandable_segments:True"), ("max_split_size_mb", "max_split_size_mb:128")]


def whatif(path, *args):
    run = subprocess.run([gpuprof, "whatif", str(path), "-f", "json", *args], capture_output=True, text=True)
    if not run.stdout:
        raise SystemExit(f"whatif {path}: {run.stderr.strip()}")
    return json.loads(run.stdout)["processes"][0]


def allocator_reports(path):
    jsonl = path.with_suffix(".jsonl")
    subprocess.run([gpuprof, "export", str(path), "-f", "jsonl", "-o", str(jsonl)], check=True, capture_output=True)
    return [e for e in map(json.loads, open(jsonl)) if e["layer"] == "allocator"]


worst = 0.0
for job in sorted({p.name.split(".")[0] for p in out.glob("*.default.gpuprof")}):
    for tag, setting in SETTINGS:
        process = whatif(out / f"{job}.{tag}.gpuprof")
        print(f"{job:9s} {setting:26s} check: {process['check']} (settings {process['ran_with']}, {process['ran_with_source']})")
    predicted = whatif(out / f"{job}.default.gpuprof", "-s", SETTINGS[1][1], "-s", SETTINGS[2][1])
    runs = {run["setting"]: run for run in predicted["runs"]}
    default_oom = runs["default"]["out_of_memory"]
    for tag, setting in SETTINGS:
        facts = json.load(open(out / f"{job}.{tag}.json"))
        run = runs[setting]
        actual = facts["reserved_bytes.all.peak"]
        over = ""
        if default_oom and tag != "default" and not facts["out_of_memory"]:
            # The default run stopped at its out-of-memory (then only freed): compare over the
            # requests it made up to that one.
            made = default_oom[0]["at"]["step"] + 1
            reports = allocator_reports(out / f"{job}.{tag}.gpuprof")
            actual = max(e["reserved"] for e in reports[:made])
            over = f" (over the first {made} requests)"
        difference = 100 * (run["peak_reserved"] - actual) / actual
        if tag != "default":
            worst = max(worst, abs(difference))
        oom = run["out_of_memory"][0]["at"]["step"] if run["out_of_memory"] else None
        print(
            f"{job:9s} {setting:26s} predicted {run['peak_reserved'] / 2**30:8.3f} GiB, PyTorch's {actual / 2**30:8.3f} GiB{over}"
            f" ({difference:+.3f}%); out of memory predicted at request {oom}, seen: {bool(facts['out_of_memory'])}"
        )
print(f"largest difference of a prediction: {worst:.3f}%")
