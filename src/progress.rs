//! Progress of long work (import, pull, build) on a terminal: one self-overwriting line
//! on stderr, at most 10 updates a second. Silent when stderr is not a terminal, so
//! service logs get only the summary line the caller logs at the end.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub struct Progress {
    label: String,
    started: Instant,
    last_draw: Option<Instant>,
    bytes: u64,
    enabled: bool,
}

impl Progress {
    pub fn new(label: &str) -> Progress {
        Progress {
            label: label.into(),
            started: Instant::now(),
            last_draw: None,
            bytes: 0,
            enabled: std::io::stderr().is_terminal(),
        }
    }

    /// Replaces the label (e.g. to show which layer is being worked on).
    pub fn set_label(&mut self, label: &str) {
        if self.label != label {
            self.label = label.into();
        }
    }

    /// `bytes`: total processed so far.
    pub fn update(&mut self, bytes: u64) {
        self.bytes = bytes;
        if !self.enabled || self.last_draw.is_some_and(|t| t.elapsed() < Duration::from_millis(100)) {
            return;
        }
        self.last_draw = Some(Instant::now());
        self.draw();
    }

    fn draw(&self) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let mb = self.bytes as f64 / 1e6;
        let _ = write!(std::io::stderr(), "\r{}: {:.1} MB, {:.1} MB/s, {:.0}s   ", self.label, mb, mb / secs, secs);
    }

    pub fn finish(&mut self) {
        if self.enabled && self.last_draw.is_some() {
            self.draw();
            let _ = writeln!(std::io::stderr());
        }
    }
}
