//! Trace and span ids. All spans of one process instance share a trace, derived from the node,
//! the pid and when the instance was first seen — so the collector puts a finding's span in the
//! trace of the allocations it is about without being told the agent's ids.

/// FNV-1a, 64 bits, seeded: enough to spread ids; nothing here needs a cryptographic hash.
fn fnv(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325 ^ seed;
    for part in parts {
        for byte in *part {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        hash ^= 0xff;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

pub fn process_trace_id(host: &str, pid: u32, since: u64) -> [u8; 16] {
    let parts: [&[u8]; 3] = [host.as_bytes(), &pid.to_le_bytes(), &since.to_le_bytes()];
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&fnv(1, &parts).to_be_bytes());
    id[8..].copy_from_slice(&fnv(2, &parts).to_be_bytes());
    id
}

/// A distributed job's trace (`gpuprof.job.id`): every rank's span in it, whichever node sends
/// it, and the collector names it without being told.
pub fn job_trace_id(job: &str) -> [u8; 16] {
    let parts: [&[u8]; 2] = [b"job", job.as_bytes()];
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&fnv(4, &parts).to_be_bytes());
    id[8..].copy_from_slice(&fnv(5, &parts).to_be_bytes());
    id
}

/// A rank's span in its job's trace: one per process instance of a node.
pub(crate) fn rank_span_id(trace: &[u8; 16], host: &str, pid: u32, since: u64) -> [u8; 8] {
    let id = fnv(6, &[trace, host.as_bytes(), &pid.to_le_bytes(), &since.to_le_bytes()]).max(1);
    id.to_be_bytes()
}

/// The `n`th span of a trace (never all zeroes, which OTLP reserves for "none").
pub(crate) fn span_id(trace: &[u8; 16], n: u64) -> [u8; 8] {
    let id = fnv(3, &[trace, &n.to_le_bytes()]).max(1);
    id.to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_depend_on_every_part() {
        let a = process_trace_id("node-a", 10, 5);
        assert_eq!(a, process_trace_id("node-a", 10, 5));
        assert_ne!(a, process_trace_id("node-b", 10, 5));
        assert_ne!(a, process_trace_id("node-a", 11, 5));
        assert_ne!(a, process_trace_id("node-a", 10, 6));
        assert_ne!(span_id(&a, 1), span_id(&a, 2));
        let job = job_trace_id("torchrun:train-7f3a");
        assert_eq!(job, job_trace_id("torchrun:train-7f3a"));
        assert_ne!(job, job_trace_id("torchrun:train-7f3b"));
        assert_ne!(rank_span_id(&job, "node-a", 10, 5), rank_span_id(&job, "node-b", 10, 5));
        assert_ne!(rank_span_id(&job, "node-a", 10, 5), rank_span_id(&job, "node-a", 10, 6));
    }
}
