//! What a sysadmin reads about each job: the agent's output in `HOME/logs/<agent>.log`
//! (rotated at 16 MiB, one old copy), where each job's section starts with a header line
//! (job, time, rootfs, GPUs, limits, work folder), and the last lines of a phase that
//! failed, quoted in the manager's own log line. Job numbers go on across restarts of
//! `run`, so a job's name (`<agent>-<n>`) also names its kept logs.

use crate::config::Home;
use crate::sandbox::Limits;
use anyhow::{Context, Result};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Rotated when bigger than this at the start of a job.
const ROTATE_AT: u64 = 16 << 20;
/// The most of a job's section kept with a failed job (its end).
pub const SECTION_MAX: u64 = ROTATE_AT;
/// How much of a failed phase's output is read for its last lines.
const TAIL_BYTES: u64 = 64 << 10;
/// Lines quoted from a failed phase, and the longest quoted line.
pub const TAIL_LINES: usize = 5;
const TAIL_LINE_CHARS: usize = 200;

/// `HOME/logs/<agent>.log`: what the agent printed.
#[derive(Debug, Clone)]
pub struct AgentLog {
    path: PathBuf,
}

impl AgentLog {
    /// The log of `agent`, rotated first when it is big.
    pub fn open(home: &Home, agent: &str) -> Result<AgentLog> {
        let dir = home.logs_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(format!("{agent}.log"));
        if std::fs::metadata(&path).map(|m| m.len() > ROTATE_AT).unwrap_or(false) {
            let _ = std::fs::rename(&path, path.with_extension("log.1"));
        }
        Ok(AgentLog { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the next output will start (the file's size).
    pub fn offset(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// Appends `line` (the job header).
    pub fn append_line(&self, line: &str) -> Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .with_context(|| format!("cannot open the job log {}", self.path.display()))?;
        writeln!(f, "{line}").with_context(|| format!("cannot write {}", self.path.display()))
    }

    /// The last `n` non-empty lines written since `offset`, sanitized for quoting.
    pub fn last_lines_since(&self, offset: u64, n: usize) -> Vec<String> {
        read_from(&self.path, offset).map(|t| last_lines(&t, n)).unwrap_or_default()
    }

    /// Everything written since `offset` (a job's section), at most `max` bytes (its end).
    pub fn section_since(&self, offset: u64, max: u64) -> Vec<u8> {
        let Ok(mut f) = std::fs::File::open(&self.path) else { return vec![] };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let start = offset.max(len.saturating_sub(max));
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(start)).is_ok() {
            let _ = f.take(max).read_to_end(&mut buf);
        }
        buf
    }
}

/// The file's text from `offset` on (only its last [`TAIL_BYTES`]).
fn read_from(path: &Path, offset: u64) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(offset.max(len.saturating_sub(TAIL_BYTES)))).ok()?;
    let mut buf = Vec::new();
    f.take(TAIL_BYTES).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The last `n` non-empty lines of `text`: control characters (a job's terminal escapes)
/// replaced, each cut to [`TAIL_LINE_CHARS`].
pub fn last_lines(text: &str, n: usize) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .rev()
        .map(|l| l.chars().map(|c| if c.is_control() { ' ' } else { c }).collect::<String>().trim().to_string())
        .filter(|l| !l.is_empty())
        .take(n)
        .map(|l| match l.char_indices().nth(TAIL_LINE_CHARS) {
            Some((i, _)) => format!("{}...", &l[..i]),
            None => l,
        })
        .collect();
    lines.reverse();
    lines
}

/// `; its last output: "a" | "b"` for a log line, or "" when there was none.
pub fn quoted(lines: &[String]) -> String {
    if lines.is_empty() {
        return String::new();
    }
    let q: Vec<String> = lines.iter().map(|l| format!("{l:?}")).collect();
    format!("; its last output: {}", q.join(" | "))
}

/// What the header of a job's section says.
#[derive(Debug, Clone)]
pub struct Header<'a> {
    pub job: &'a str,
    pub slot: usize,
    pub number: u64,
    pub unix: u64,
    pub rootfs: String,
    pub gpus: &'a [String],
    pub limits: &'a Limits,
    pub user: Option<(u32, u32)>,
    /// The host dir of the agent's work folder (None: in the writable layer).
    pub work_dir: Option<&'a Path>,
    pub agent_version: String,
}

impl Header<'_> {
    /// One line a sysadmin can search for (`==== job <name>`).
    pub fn line(&self) -> String {
        let size = |b: Option<u64>| b.map(|b| format!("{}M", b >> 20)).unwrap_or_else(|| "-".into());
        let cpus = self.limits.cpus_milli.map(|m| format!("{}", m as f64 / 1000.0)).unwrap_or_else(|| "-".into());
        format!(
            "==== job {} (slot {}, job {}) {} rootfs={} gpus={} limits: memory={} pids={} cpus={} user={} work={} \
             agent={} ====",
            self.job,
            self.slot,
            self.number,
            crate::clock::rfc3339(self.unix),
            self.rootfs,
            if self.gpus.is_empty() { "none".to_string() } else { self.gpus.join(",") },
            size(self.limits.memory_bytes),
            self.limits.pids.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            cpus,
            self.user.map(|(u, g)| format!("{u}:{g}")).unwrap_or_else(|| "root".into()),
            self.work_dir.map(|d| d.display().to_string()).unwrap_or_else(|| "layer".into()),
            self.agent_version,
        )
    }
}

/// The highest job number of `agent` whose logs or kept layers are in the home, so the
/// next `run` goes on from it (job names stay unique in `HOME/logs` and `HOME/failed`).
pub fn last_job_number(home: &Home, agent: &str) -> u64 {
    [home.logs_dir().join(agent), home.failed_dir().join(agent)]
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .filter_map(|e| job_number(&e.file_name().to_string_lossy(), agent))
        .max()
        .unwrap_or(0)
}

/// `<agent>-<n>` -> n.
pub fn job_number(job: &str, agent: &str) -> Option<u64> {
    job.strip_prefix(agent)?.strip_prefix('-')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_are_sanitized_and_bounded() {
        let text = "a\n\n  b  \r\nc\x1b[31mred\x07\n\n";
        assert_eq!(last_lines(text, 5), ["a", "b", "c [31mred"]);
        assert_eq!(last_lines(text, 2), ["b", "c [31mred"]);
        let long = "x".repeat(500);
        assert_eq!(last_lines(&long, 1)[0].len(), TAIL_LINE_CHARS + 3);
        assert_eq!(quoted(&[]), "");
        assert_eq!(quoted(&["say \"hi\"".into(), "b".into()]), "; its last output: \"say \\\"hi\\\"\" | \"b\"");
    }

    #[test]
    fn sections_and_tails_start_at_an_offset() {
        let t = tempfile::tempdir().unwrap();
        let home = Home::new(t.path());
        let log = AgentLog::open(&home, "h-0").unwrap();
        log.append_line("old job output").unwrap();
        let at = log.offset();
        log.append_line("==== job h-0-2").unwrap();
        log.append_line("Dependencies missing for .NET 6.0").unwrap();
        assert_eq!(log.last_lines_since(at, 5), ["==== job h-0-2", "Dependencies missing for .NET 6.0"]);
        assert_eq!(log.section_since(at, 1 << 20), b"==== job h-0-2\nDependencies missing for .NET 6.0\n");
        assert_eq!(log.section_since(at, 3), b".0\n", "at most its end");
    }

    #[test]
    fn job_numbers_go_on_from_what_the_home_keeps() {
        let t = tempfile::tempdir().unwrap();
        let home = Home::new(t.path());
        assert_eq!(last_job_number(&home, "h-1"), 0);
        for d in ["logs/h-1/h-1-3", "logs/h-1/h-1-12", "failed/h-1/h-1-14", "logs/h-10/h-10-99", "logs/h-1/junk"] {
            std::fs::create_dir_all(t.path().join(d)).unwrap();
        }
        assert_eq!(last_job_number(&home, "h-1"), 14);
        assert_eq!(job_number("h-1-7", "h-1"), Some(7));
        assert_eq!(job_number("h-10-7", "h-1"), None);
    }

    #[test]
    fn header_names_the_job() {
        let limits =
            Limits { memory_bytes: Some(256 << 20), pids: Some(200), cpus_milli: Some(1500), ..Default::default() };
        let gpus = vec!["GPU-1".to_string()];
        let h = Header {
            job: "h-0-7",
            slot: 0,
            number: 7,
            unix: 1_700_000_000,
            rootfs: "bb".into(),
            gpus: &gpus,
            limits: &limits,
            user: Some((1000, 1000)),
            work_dir: None,
            agent_version: "4.252.0".into(),
        };
        assert_eq!(
            h.line(),
            "==== job h-0-7 (slot 0, job 7) 2023-11-14T22:13:20Z rootfs=bb gpus=GPU-1 limits: memory=256M \
             pids=200 cpus=1.5 user=1000:1000 work=layer agent=4.252.0 ===="
        );
    }
}
