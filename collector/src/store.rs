//! The embedded database (redb): findings as they arrive, and each node's state (its tracker and
//! its processes' summaries) at every checkpoint, so a restart resumes with the same processes,
//! open allocations and IPC exports; post-mortems' reports as they arrive (what each is, and its
//! gzipped page apart, read only when served).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::reports::ReportInfo;
use crate::state::{Node, StoredFinding};

const FINDINGS: TableDefinition<u64, &[u8]> = TableDefinition::new("findings");
const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");
/// Post-mortems' reports by finding id: what each is (JSON), and its page gzipped.
const REPORTS: TableDefinition<&str, &[u8]> = TableDefinition::new("reports");
const REPORT_PAGES: TableDefinition<&str, &[u8]> = TableDefinition::new("report_pages");
const CACHE_BYTES: usize = 64 << 20;
/// Node states carry this first byte; a state of another version is not misread.
const NODE_FORMAT: u8 = 4;
/// Node states of earlier collectors (1: the leak rules ran at the collector; 2: process
/// summaries without NVML's figure; 3: allocations without the framework whose allocator made
/// them): left behind, their processes come back with the node's next batches.
const FORMATS_LEFT_BEHIND: [u8; 3] = [1, 2, 3];

pub struct Store {
    db: Database,
    path: PathBuf,
}

pub struct Loaded {
    pub findings: Vec<StoredFinding>,
    pub nodes: Vec<(String, Node)>,
    pub reports: Vec<ReportInfo>,
}

impl Store {
    pub fn open(path: &Path) -> Result<(Store, Loaded)> {
        // redb caches pages up to its cache size (1 GiB by default): the state is rewritten at
        // every checkpoint, so a large cache is memory without a use.
        let db = Database::builder().set_cache_size(CACHE_BYTES).create(path).map_err(|e| {
            anyhow::anyhow!(
                "--db {}: cannot open it as a gpuprof-collector database ({e}); move it away or give another --db",
                path.display()
            )
        })?;
        Store::set_up(db, path)
    }

    /// An empty store held in memory, gone with it: for a collector that is driven without a
    /// process around it (the fuzz targets), where a file per run would only cost time.
    pub fn in_memory() -> Result<Store> {
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .context("cannot make a database in memory")?;
        Ok(Store::set_up(db, Path::new("(in memory)"))?.0)
    }

    /// The tables made where missing, then what they hold.
    fn set_up(db: Database, path: &Path) -> Result<(Store, Loaded)> {
        let setup = db.begin_write().context("cannot write to the database")?;
        setup.open_table(FINDINGS).context("cannot create the findings table")?;
        setup.open_table(NODES).context("cannot create the nodes table")?;
        setup.open_table(REPORTS).context("cannot create the reports table")?;
        setup.open_table(REPORT_PAGES).context("cannot create the reports table")?;
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
            let finding: StoredFinding = serde_json::from_slice(bytes.value()).with_context(|| {
                format!("--db {}: finding {} is corrupt; move the file away", self.path.display(), id.value())
            })?;
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
            let node: Node = postcard::from_bytes(&bytes[1..]).with_context(|| {
                format!(
                    "--db {}: the state of node {} is corrupt; move the file away",
                    self.path.display(),
                    name.value()
                )
            })?;
            nodes.push((name.value().to_string(), node));
        }
        let mut reports = Vec::new();
        for entry in read.open_table(REPORTS)?.iter()? {
            let (id, bytes) = entry?;
            let info: ReportInfo = serde_json::from_slice(bytes.value()).with_context(|| {
                format!(
                    "--db {}: the report of finding {} is corrupt; move the file away",
                    self.path.display(),
                    id.value()
                )
            })?;
            reports.push(info);
        }
        Ok(Loaded { findings, nodes, reports })
    }

    /// Keeps a post-mortem's report (its page gzipped; empty when the node did not send it).
    pub fn add_report(&self, info: &ReportInfo, page: &[u8]) -> Result<()> {
        let write = self.db.begin_write()?;
        {
            write.open_table(REPORTS)?.insert(info.finding_id.as_str(), serde_json::to_vec(info)?.as_slice())?;
            write.open_table(REPORT_PAGES)?.insert(info.finding_id.as_str(), page)?;
        }
        write.commit().context("cannot save a post-mortem's report")?;
        Ok(())
    }

    /// The gzipped page of finding `finding_id`'s report.
    pub fn report_page(&self, finding_id: &str) -> Result<Option<Vec<u8>>> {
        let read = self.db.begin_read().context("cannot read the database")?;
        let page = read.open_table(REPORT_PAGES)?.get(finding_id)?.map(|page| page.value().to_vec());
        Ok(page)
    }

    /// Drops the reports of these findings.
    pub fn remove_reports(&self, finding_ids: &[String]) -> Result<()> {
        if finding_ids.is_empty() {
            return Ok(());
        }
        let write = self.db.begin_write()?;
        {
            let mut reports = write.open_table(REPORTS)?;
            let mut pages = write.open_table(REPORT_PAGES)?;
            for id in finding_ids {
                reports.remove(id.as_str())?;
                pages.remove(id.as_str())?;
            }
        }
        write.commit().context("cannot drop post-mortems' reports")?;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use gpuprof_model::{Finding, FindingKind};

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpuprof-collector-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("state.redb")
    }

    fn stored(id: u64, pid: u32) -> StoredFinding {
        let mut finding =
            Finding::new(FindingKind::Growth, pid, "python3", 4 << 20, 4, 100, 200, &[], "grew".to_string());
        finding.process_since = 50;
        StoredFinding { id, node: "node-a".to_string(), finding }
    }

    fn node_state() -> Vec<u8> {
        postcard::to_stdvec(&Node::default()).unwrap()
    }

    #[test]
    fn findings_and_node_states_survive_a_reopen_and_pruned_findings_do_not() {
        let path = scratch("reopen");
        let (store, loaded) = Store::open(&path).unwrap();
        assert!(loaded.findings.is_empty() && loaded.nodes.is_empty());
        store.add_findings(&[stored(1, 10), stored(2, 11)]).unwrap();
        store.checkpoint(&[("node-a".to_string(), node_state())], &[]).unwrap();
        drop(store);

        let (store, loaded) = Store::open(&path).unwrap();
        let ids: Vec<(u64, u32)> = loaded.findings.iter().map(|f| (f.id, f.finding.pid)).collect();
        assert_eq!(ids, [(1, 10), (2, 11)]);
        assert_eq!(loaded.findings[0].finding.process_since, 50);
        let names: Vec<&str> = loaded.nodes.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["node-a"]);
        store.checkpoint(&[], &[1]).unwrap();
        drop(store);

        let (_, loaded) = Store::open(&path).unwrap();
        assert_eq!(loaded.findings.iter().map(|f| f.id).collect::<Vec<_>>(), [2]);
    }

    /// Writes a node's state with the given format byte, as another collector would have.
    fn write_node(path: &Path, format: u8) {
        let db = Database::create(path).unwrap();
        let write = db.begin_write().unwrap();
        {
            let mut table = write.open_table(NODES).unwrap();
            let mut framed = vec![format];
            framed.extend_from_slice(&node_state());
            table.insert("node-old", framed.as_slice()).unwrap();
        }
        write.commit().unwrap();
    }

    #[test]
    fn a_node_saved_by_an_older_collector_starts_afresh_and_another_version_is_refused() {
        let path = scratch("versions");
        drop(Store::open(&path).unwrap());
        write_node(&path, 2);
        let (_, loaded) = Store::open(&path).unwrap();
        assert!(loaded.nodes.is_empty(), "left behind, its processes come back with its next batches");

        write_node(&path, 9);
        let error = Store::open(&path).err().expect("another version is refused");
        assert_eq!(
            error.to_string(),
            format!("--db {}: node node-old was saved by another version of gpuprof-collector; move the file away to start afresh", path.display())
        );
    }

    #[test]
    fn reports_survive_a_reopen_with_their_pages_and_removed_ones_do_not() {
        let path = scratch("reports");
        let (store, _) = Store::open(&path).unwrap();
        let info = |id: &str| ReportInfo {
            finding_id: id.to_string(),
            node: "node-a".to_string(),
            pid: 7,
            ts: 100,
            report: format!("/pm/{id}.html"),
            html_bytes: 10,
            gzip_bytes: 3,
            omitted: None,
        };
        store.add_report(&info("aaaaaaaaaaaaaaaa"), b"abc").unwrap();
        store.add_report(&info("bbbbbbbbbbbbbbbb"), b"xyz").unwrap();
        drop(store);
        let (store, loaded) = Store::open(&path).unwrap();
        assert_eq!(loaded.reports, [info("aaaaaaaaaaaaaaaa"), info("bbbbbbbbbbbbbbbb")]);
        assert_eq!(store.report_page("bbbbbbbbbbbbbbbb").unwrap().as_deref(), Some(&b"xyz"[..]));
        store.remove_reports(&["aaaaaaaaaaaaaaaa".to_string()]).unwrap();
        assert_eq!(store.report_page("aaaaaaaaaaaaaaaa").unwrap(), None);
        drop(store);
        let (_, loaded) = Store::open(&path).unwrap();
        assert_eq!(loaded.reports, [info("bbbbbbbbbbbbbbbb")]);
    }

    #[test]
    fn a_corrupt_finding_or_a_file_that_is_no_database_is_a_clear_error() {
        let path = scratch("corrupt");
        drop(Store::open(&path).unwrap());
        {
            let db = Database::create(&path).unwrap();
            let write = db.begin_write().unwrap();
            write.open_table(FINDINGS).unwrap().insert(7, b"{not json".as_slice()).unwrap();
            write.commit().unwrap();
        }
        let error = Store::open(&path).err().expect("a corrupt finding is refused");
        assert_eq!(error.to_string(), format!("--db {}: finding 7 is corrupt; move the file away", path.display()));

        let text = path.with_file_name("notes.txt");
        std::fs::write(&text, "these are not pages of a database").unwrap();
        let error = Store::open(&text).err().expect("not a database");
        assert!(
            error
                .to_string()
                .starts_with(&format!("--db {}: cannot open it as a gpuprof-collector database (", text.display())),
            "{error}"
        );
    }
}
