//! What a build shows: on a terminal one live line per step (elapsed time and the
//! tool's latest output line), and always one log line per finished step.

use super::schema::Recipe;
use std::fs::File;
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// The progress of one build.
pub(super) struct Ui {
    pub(super) total: usize,
    pub(super) index: usize,
    label: String,
    step_started: Instant,
    last_draw: Option<Instant>,
    terminal: bool,
}

impl Ui {
    pub(super) fn new(recipe: &Recipe) -> Ui {
        let optional = [
            !recipe.pre_install.is_empty(),
            !(recipe.remove_packages.is_empty() && recipe.remove_paths.is_empty()),
            !recipe.post_install.is_empty(),
        ];
        // debootstrap, apt-get update, apt-get install, user, clean-up, checks + optional ones
        let total = 6 + optional.iter().filter(|b| **b).count();
        Ui {
            total,
            index: 0,
            label: String::new(),
            step_started: Instant::now(),
            last_draw: None,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    pub(super) fn begin(&mut self, label: &str) {
        self.index += 1;
        self.label = label.to_string();
        self.step_started = Instant::now();
        self.last_draw = None;
        if self.terminal {
            let _ = write!(std::io::stderr(), "\r\x1b[K[{}/{}] {label} ...", self.index, self.total);
        } else {
            tracing::info!("[{}/{}] {label} ...", self.index, self.total);
        }
    }

    pub(super) fn tick(&mut self, log: &Path) {
        if !self.terminal || self.last_draw.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        self.last_draw = Some(Instant::now());
        let last: String = last_line(log).chars().take(70).collect();
        let _ = write!(
            std::io::stderr(),
            "\r\x1b[K[{}/{}] {} ... {:.0}s  {last}",
            self.index,
            self.total,
            self.label,
            self.step_started.elapsed().as_secs_f64()
        );
    }

    pub(super) fn end(&mut self, ok: bool) {
        if self.terminal {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
        let secs = self.step_started.elapsed().as_secs_f64();
        if ok {
            tracing::info!("[{}/{}] {}: done in {secs:.0} s", self.index, self.total, self.label);
        } else {
            tracing::error!("[{}/{}] {}: failed after {secs:.0} s", self.index, self.total, self.label);
        }
    }
}

/// The last non-empty line of `path` (of its last 4 KiB).
fn last_line(path: &Path) -> String {
    tail_lines(path, 1, 4096).pop().unwrap_or_default()
}

/// The last `n` non-empty lines of `path`, reading at most `max` bytes from its end.
pub(super) fn tail_lines(path: &Path, n: usize, max: u64) -> Vec<String> {
    let Ok(mut f) = File::open(path) else { return vec![] };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<String> = text
        .lines()
        .map(|l| l.rsplit('\r').next().unwrap_or("").trim_end().to_string())
        .filter(|l| !l.trim().is_empty())
        .collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}
