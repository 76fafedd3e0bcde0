//! The embedded database (redb): findings as they arrive, and each node's state (its tracker and
//! its processes' summaries) at every checkpoint, so a restart resumes with the same processes,
//! open allocations and IPC exports; post-mortems' reports as they arrive (what each is, and its
//! gzipped page apart, read only when served).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

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
    /// None between a failed reopening and the next: every use fails saying so.
    db: RwLock<Option<Database>>,
    path: PathBuf,
    /// A use failed: redb refuses every transaction after an I/O error (a full disk) until the
    /// database is opened again, which `reopen_if_failed` does at the next checkpoint.
    failed: AtomicBool,
    /// False for a store held in memory: there is no file to open again.
    on_disk: bool,
}

/// Records of the database that did not read back at start.
#[derive(Debug, Default)]
struct Dropped {
    findings: Vec<u64>,
    nodes: Vec<String>,
    reports: Vec<String>,
}

impl Dropped {
    /// "dropped 2 corrupt findings (ids 5, 9); the corrupt state of node a (its processes come
    /// back with its next batches; its findings are kept); the rest is served", or None when
    /// nothing was dropped.
    fn said(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.findings.is_empty() {
            let ids: Vec<String> = self.findings.iter().map(u64::to_string).collect();
            let noun = if ids.len() == 1 { "finding (id" } else { "findings (ids" };
            parts.push(format!("{} corrupt {noun} {})", ids.len(), ids.join(", ")));
        }
        if !self.nodes.is_empty() {
            let noun = if self.nodes.len() == 1 { "node" } else { "nodes" };
            parts.push(format!(
                "the corrupt state of {noun} {} (its processes come back with its next batches; its findings are kept)",
                self.nodes.join(", ")
            ));
        }
        if !self.reports.is_empty() {
            let noun = if self.reports.len() == 1 { "post-mortem report" } else { "post-mortem reports" };
            parts.push(format!("{} corrupt {noun} (of findings {})", self.reports.len(), self.reports.join(", ")));
        }
        (!parts.is_empty()).then(|| format!("dropped {}; the rest is served", parts.join("; ")))
    }
}

pub struct Loaded {
    pub findings: Vec<StoredFinding>,
    pub nodes: Vec<(String, Node)>,
    pub reports: Vec<ReportInfo>,
    /// What the collector says of the database before it serves (a file set aside, records
    /// dropped, nodes of an older collector), a line each.
    pub warnings: Vec<String>,
}

/// redb caches pages up to its cache size (1 GiB by default): the state is rewritten at every
/// checkpoint, so a large cache is memory without a use.
fn builder() -> redb::Builder {
    let mut builder = Database::builder();
    builder.set_cache_size(CACHE_BYTES);
    builder
}

fn open_database(path: &Path) -> Result<Database, redb::DatabaseError> {
    builder().create(path)
}

/// Renames an unreadable database to `<path>.unreadable-<unix seconds>` and returns that name.
fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    let seconds = gpuprof_model::event::wall_clock_ns() / 1_000_000_000;
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".unreadable-{seconds}"));
    let aside = PathBuf::from(aside);
    std::fs::rename(path, &aside)?;
    Ok(aside)
}

/// What the database holds, and the records of it that do not read back.
fn load_from(db: &Database, path: &Path) -> Result<(Loaded, Dropped)> {
    let read = db.begin_read().context("cannot read the database")?;
    let mut dropped = Dropped::default();
    let mut warnings = Vec::new();
    let mut findings = Vec::new();
    for entry in read.open_table(FINDINGS)?.iter()? {
        let (id, bytes) = entry?;
        match serde_json::from_slice(bytes.value()) {
            Ok(finding) => findings.push(finding),
            Err(_) => dropped.findings.push(id.value()),
        }
    }
    let mut nodes = Vec::new();
    for entry in read.open_table(NODES)?.iter()? {
        let (name, bytes) = entry?;
        let bytes = bytes.value();
        match bytes.first() {
            Some(&NODE_FORMAT) => {}
            Some(format) if FORMATS_LEFT_BEHIND.contains(format) => {
                // Its findings are kept; its processes come back with the node's next batches.
                warnings.push(format!("node {} was saved by an older gpuprof-collector: its processes start afresh (its findings are kept)", name.value()));
                continue;
            }
            Some(format) if *format > NODE_FORMAT => bail!(
                "--db {}: node {} was saved by a newer gpuprof-collector; move the file away to start afresh",
                path.display(),
                name.value()
            ),
            _ => {
                dropped.nodes.push(name.value().to_string());
                continue;
            }
        }
        match postcard::from_bytes::<Node>(&bytes[1..]) {
            Ok(node) => nodes.push((name.value().to_string(), node)),
            Err(_) => dropped.nodes.push(name.value().to_string()),
        }
    }
    let mut reports = Vec::new();
    for entry in read.open_table(REPORTS)?.iter()? {
        let (id, bytes) = entry?;
        match serde_json::from_slice(bytes.value()) {
            Ok(info) => reports.push(info),
            Err(_) => dropped.reports.push(id.value().to_string()),
        }
    }
    Ok((Loaded { findings, nodes, reports, warnings }, dropped))
}

/// Deletes the records that did not read back, so the next start does not trip on them.
fn forget(db: &Database, dropped: &Dropped) -> Result<()> {
    let write = db.begin_write()?;
    {
        remove_findings_in(&write, &dropped.findings)?;
        let mut nodes = write.open_table(NODES)?;
        for name in &dropped.nodes {
            nodes.remove(name.as_str())?;
        }
        remove_reports_in(&write, &dropped.reports)?;
    }
    write.commit().context("cannot drop the corrupt records")?;
    Ok(())
}

fn remove_findings_in(write: &redb::WriteTransaction, ids: &[u64]) -> Result<()> {
    let mut findings = write.open_table(FINDINGS)?;
    for id in ids {
        findings.remove(id)?;
    }
    Ok(())
}

/// A post-mortem's report and its page, of each finding in `finding_ids`.
fn remove_reports_in(write: &redb::WriteTransaction, finding_ids: &[String]) -> Result<()> {
    let mut reports = write.open_table(REPORTS)?;
    let mut pages = write.open_table(REPORT_PAGES)?;
    for id in finding_ids {
        reports.remove(id.as_str())?;
        pages.remove(id.as_str())?;
    }
    Ok(())
}

impl Store {
    /// Opens the database at `path`, or creates it. A file redb cannot open is kept aside (named
    /// in the warning) and the collector starts on an empty one; records that do not read back
    /// are dropped and counted: the collector keeps serving what it has, and says what it lost.
    pub fn open(path: &Path) -> Result<(Store, Loaded)> {
        let mut set_aside_as = None;
        let db = match open_database(path) {
            Ok(db) => db,
            Err(error) if path.exists() => {
                let aside = set_aside(path).with_context(|| {
                    format!(
                        "--db {}: cannot open it ({error}) nor move it away; move it away or give another --db",
                        path.display()
                    )
                })?;
                set_aside_as = Some(format!(
                    "warning: --db {}: cannot open it ({error}): kept it as {} and started on an empty database; the findings, nodes and reports it held are not served",
                    path.display(),
                    aside.display()
                ));
                open_database(path).map_err(|e| {
                    anyhow::anyhow!(
                        "--db {}: cannot create a database there ({e}){}",
                        path.display(),
                        set_aside_as.as_ref().map_or(String::new(), |said| format!(" (after: {said})"))
                    )
                })?
            }
            Err(error) => bail!("--db {}: cannot create a database there ({error}); give another --db", path.display()),
        };
        let (store, mut loaded) = Store::set_up(db, path, true)?;
        loaded.warnings.splice(0..0, set_aside_as);
        Ok((store, loaded))
    }

    /// An empty store held in memory, gone with it: for a collector that is driven without a
    /// process around it (the fuzz targets), where a file per run would only cost time.
    pub fn in_memory() -> Result<Store> {
        let db = builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .context("cannot make a database in memory")?;
        Ok(Store::set_up(db, Path::new("(in memory)"), false)?.0)
    }

    /// The tables made where missing, then what they hold.
    fn set_up(db: Database, path: &Path, on_disk: bool) -> Result<(Store, Loaded)> {
        let setup = db.begin_write().context("cannot write to the database")?;
        setup.open_table(FINDINGS).context("cannot create the findings table")?;
        setup.open_table(NODES).context("cannot create the nodes table")?;
        setup.open_table(REPORTS).context("cannot create the reports table")?;
        setup.open_table(REPORT_PAGES).context("cannot create the reports table")?;
        setup.commit().context("cannot write to the database")?;
        let (mut loaded, dropped) = load_from(&db, path)?;
        if let Some(said) = dropped.said() {
            loaded.warnings.push(format!("warning: --db {}: {said}", path.display()));
            forget(&db, &dropped)?;
        }
        let store =
            Store { db: RwLock::new(Some(db)), path: path.to_path_buf(), failed: AtomicBool::new(false), on_disk };
        Ok((store, loaded))
    }

    /// Runs `work` on the database, noting a failure for `reopen_if_failed`.
    fn with_db<T>(&self, work: impl FnOnce(&Database) -> Result<T>) -> Result<T> {
        let guard = self.db.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(db) = guard.as_ref() else {
            bail!("--db {}: closed after a failed write; opened again at the next checkpoint", self.path.display())
        };
        let done = work(db);
        if done.is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
        done
    }

    /// After a failed use, opens the database again (redb takes nothing more until then): what
    /// its last commit holds is what it has. Called at each checkpoint.
    pub fn reopen_if_failed(&self) -> Result<()> {
        if !self.on_disk || !self.failed.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut guard = self.db.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Closed first: the file is locked while open.
        guard.take();
        let db = open_database(&self.path).map_err(|e| {
            anyhow::anyhow!("--db {}: cannot open it again after a failed write ({e})", self.path.display())
        })?;
        *guard = Some(db);
        self.failed.store(false, Ordering::Relaxed);
        tracing::warn!("--db {}: opened again after a failed write", self.path.display());
        Ok(())
    }

    /// Keeps a post-mortem's report (its page gzipped; empty when the node did not send it).
    pub fn add_report(&self, info: &ReportInfo, page: &[u8]) -> Result<()> {
        self.with_db(|db| {
            let write = db.begin_write()?;
            {
                write.open_table(REPORTS)?.insert(info.finding_id.as_str(), serde_json::to_vec(info)?.as_slice())?;
                write.open_table(REPORT_PAGES)?.insert(info.finding_id.as_str(), page)?;
            }
            write.commit().context("cannot save a post-mortem's report")?;
            Ok(())
        })
    }

    /// The gzipped page of finding `finding_id`'s report.
    pub fn report_page(&self, finding_id: &str) -> Result<Option<Vec<u8>>> {
        self.with_db(|db| {
            let read = db.begin_read().context("cannot read the database")?;
            let page = read.open_table(REPORT_PAGES)?.get(finding_id)?.map(|page| page.value().to_vec());
            Ok(page)
        })
    }

    /// Drops the reports of these findings.
    pub fn remove_reports(&self, finding_ids: &[String]) -> Result<()> {
        if finding_ids.is_empty() {
            return Ok(());
        }
        self.with_db(|db| {
            let write = db.begin_write()?;
            remove_reports_in(&write, finding_ids)?;
            write.commit().context("cannot drop post-mortems' reports")?;
            Ok(())
        })
    }

    pub fn add_findings(&self, findings: &[StoredFinding]) -> Result<()> {
        if findings.is_empty() {
            return Ok(());
        }
        self.with_db(|db| {
            let write = db.begin_write()?;
            {
                let mut table = write.open_table(FINDINGS)?;
                for finding in findings {
                    table.insert(finding.id, serde_json::to_vec(finding)?.as_slice())?;
                }
            }
            write.commit().context("cannot save findings")?;
            Ok(())
        })
    }

    /// Saves node states and drops pruned findings, in one transaction.
    pub fn checkpoint(&self, nodes: &[(String, Vec<u8>)], dropped_findings: &[u64]) -> Result<()> {
        if nodes.is_empty() && dropped_findings.is_empty() {
            return Ok(());
        }
        self.with_db(|db| {
            let write = db.begin_write()?;
            {
                let mut table = write.open_table(NODES)?;
                let mut framed = Vec::new();
                for (name, state) in nodes {
                    framed.clear();
                    framed.push(NODE_FORMAT);
                    framed.extend_from_slice(state);
                    table.insert(name.as_str(), framed.as_slice())?;
                }
            }
            remove_findings_in(&write, dropped_findings)?;
            write.commit().context("cannot save the checkpoint")?;
            Ok(())
        })
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
            format!(
                "--db {}: node node-old was saved by a newer gpuprof-collector; move the file away to start afresh",
                path.display()
            )
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
    fn a_corrupt_finding_is_dropped_and_deleted_and_a_file_that_is_no_database_is_set_aside() {
        let path = scratch("corrupt");
        let (store, _) = Store::open(&path).unwrap();
        store.add_findings(&[stored(1, 10)]).unwrap();
        drop(store);
        {
            let db = Database::create(&path).unwrap();
            let write = db.begin_write().unwrap();
            write.open_table(FINDINGS).unwrap().insert(7, b"{not json".as_slice()).unwrap();
            write.commit().unwrap();
        }
        let (store, loaded) = Store::open(&path).unwrap();
        assert_eq!(loaded.findings.iter().map(|f| f.id).collect::<Vec<_>>(), [1]);
        drop(store);
        let db = Database::create(&path).unwrap();
        let read = db.begin_read().unwrap();
        let ids: Vec<u64> = read.open_table(FINDINGS).unwrap().iter().unwrap().map(|e| e.unwrap().0.value()).collect();
        assert_eq!(ids, [1], "the corrupt one is deleted");
        drop(read);
        drop(db);

        let text = path.with_file_name("notes.txt");
        std::fs::write(&text, "these are not pages of a database").unwrap();
        let (_, loaded) = Store::open(&text).unwrap();
        assert!(loaded.findings.is_empty() && loaded.nodes.is_empty());
        let aside: Vec<_> = std::fs::read_dir(text.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.starts_with("notes.txt.unreadable-"))
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        let kept = std::fs::read_to_string(text.with_file_name(&aside[0])).unwrap();
        assert_eq!(kept, "these are not pages of a database");
    }
}
