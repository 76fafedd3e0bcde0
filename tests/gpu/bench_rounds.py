"""What the training-loop benchmarks share: each mode run once per round, interleaved (step times
drift between processes on the GPU machine), and the table of medians against plain."""
import statistics


def interleaved(modes, rounds):
    """Runs every mode (name -> function returning train_loop.py's JSON) once per round, in order;
    returns ({name: [median_ms per round]}, allocator allocations per step)."""
    results = {name: [] for name in modes}
    per_step = None
    for _ in range(rounds):
        for name, mode in modes.items():
            r = mode()
            results[name].append(r["median_ms"])
            per_step = r["allocations_per_step"]
    return results, per_step


def table(results, per_step, steps, rounds, paired=False, model="launch-bound 6-layer transformer (d=128)"):
    """Prints each mode's median step time against plain's (and, with `paired`, the median of
    each round's ratio to that round's plain run); returns (medians, paired ratios)."""
    median = {name: statistics.median(v) for name, v in results.items()}
    ratios = {name: statistics.median(m / p for m, p in zip(v, results["plain"])) for name, v in results.items()}
    plain = median["plain"]
    print(f"{model}, {steps} steps, {rounds} rounds, medians; "
          f"{per_step:.0f} allocator allocations per step")
    print(f"{'mode':<40} {'step ms':>9} {'vs plain':>9} {'added ms':>9}" + (f" {'paired':>8}" if paired else ""))
    for name in results:
        print(f"{name:<40} {median[name]:>9.3f} {median[name] / plain:>8.3f}x {median[name] - plain:>9.3f}"
              + (f" {ratios[name]:>7.3f}x" if paired else ""))
    return median, ratios
