//! The embedded database (redb): findings as they arrive, and each node's state (its tracker and
//! its processes' summaries) at every checkpoint, so a restart resumes with the same processes,
//! open allocations and IPC exports.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::state::{Node, StoredFinding};

const FINDINGS: TableDefinition<u64, &[u8]> = TableDefinition::new("findings");
const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");
const CACHE_BYTES: usize = 64 << 20;
/// Node states carry this first byte; a state of another version is not misread.
const NODE_FORMAT: u8 = 3;
/// Node states of earlier collectors (1: the leak rules ran at the collector; 2: process
/// summaries without NVML's figure): left behind, their processes come back with the node's
/// next batches.
const FORMATS_LEFT_BEHIND: [u8; 2] = [1, 2];

pub struct Store {
    db: Database,
    path: PathBuf,
}

pub struct Loaded {
    pub findings: Vec<StoredFinding>,
    pub nodes: Vec<(String, Node)>,
}

impl Store {
    pub fn open(path: &Path) -> Result<(Store, Loaded)> {
        // redb caches pages up to its cache size (1 GiB by default): the state is rewritten at
        // every checkpoint, so a large cache is memory without a use.
        let db = Database::builder().set_cache_size(CACHE_BYTES).create(path).map_err(|e| {
            anyhow::anyhow!("--db {}: cannot open it as a gpuprof-collector database ({e}); move it away or give another --db", path.display())
        })?;
        let setup = db.begin_write().context("cannot write to the database")?;
        setup.open_table(FINDINGS).context("cannot create the findings table")?;
        setup.open_table(NODES).context("cannot create the nodes table")?;
        setup.commit().context("cannot write to the database")?;
        let store = Store { db, path: path.to_path_buf() };
        let loaded = store.load()?;
        Ok((store, loaded))
    }

    fn load(&self) -> Result<Loaded> {
        let read = self.db.begin_read().context("cannot read the database")?;
        let mut findings = Vec::new();
        for entry in read.open_table(FINDINGS)?.iter()? {
            let (id, bytes) = entry?;
            let finding: StoredFinding = serde_json::from_slice(bytes.value())
                .with_context(|| format!("--db {}: finding {} is corrupt; move the file away", self.path.display(), id.value()))?;
            findings.push(finding);
        }
        let mut nodes = Vec::new();
        for entry in read.open_table(NODES)?.iter()? {
            let (name, bytes) = entry?;
            let bytes = bytes.value();
            match bytes.first() {
                Some(&NODE_FORMAT) => {}
                Some(format) if FORMATS_LEFT_BEHIND.contains(format) => {
                    // Its findings are kept; its processes come back with the node's next batches.
                    eprintln!("gpuprof-collector: node {} was saved by an older gpuprof-collector: its processes start afresh (its findings are kept)", name.value());
                    continue;
                }
                _ => bail!("--db {}: node {} was saved by another version of gpuprof-collector; move the file away to start afresh", self.path.display(), name.value()),
            }
            let node: Node = postcard::from_bytes(&bytes[1..])
                .with_context(|| format!("--db {}: the state of node {} is corrupt; move the file away", self.path.display(), name.value()))?;
            nodes.push((name.value().to_string(), node));
        }
        Ok(Loaded { findings, nodes })
    }

    pub fn add_findings(&self, findings: &[StoredFinding]) -> Result<()> {
        if findings.is_empty() {
            return Ok(());
        }
        let write = self.db.begin_write()?;
        {
            let mut table = write.open_table(FINDINGS)?;
            for finding in findings {
                table.insert(finding.id, serde_json::to_vec(finding)?.as_slice())?;
            }
        }
        write.commit().context("cannot save findings")?;
        Ok(())
    }

    /// Saves node states and drops pruned findings, in one transaction.
    pub fn checkpoint(&self, nodes: &[(String, Vec<u8>)], dropped_findings: &[u64]) -> Result<()> {
        if nodes.is_empty() && dropped_findings.is_empty() {
            return Ok(());
        }
        let write = self.db.begin_write()?;
        {
            let mut table = write.open_table(NODES)?;
            let mut framed = Vec::new();
            for (name, state) in nodes {
                framed.clear();
                framed.push(NODE_FORMAT);
                framed.extend_from_slice(state);
                table.insert(name.as_str(), framed.as_slice())?;
            }
            let mut findings = write.open_table(FINDINGS)?;
            for id in dropped_findings {
                findings.remove(id)?;
            }
        }
        write.commit().context("cannot save the checkpoint")?;
        Ok(())
    }
}
