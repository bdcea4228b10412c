//! A progress line for commands that take more than a moment: bytes done of the total, rate
//! and time left, redrawn in place on stderr at most five times a second. Only on a terminal
//! and with text output: a pipe, a file or `--output json` gets nothing, so what a script reads
//! stays machine-readable.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::units::human;

const EVERY: Duration = Duration::from_millis(200);

pub struct Progress {
    label: String,
    total: u64,
    started: Instant,
    drawn: Option<Instant>,
    on: bool,
}

impl Progress {
    /// A progress line for `total` bytes; drawn only if `text` output goes to a terminal.
    pub fn new(label: &str, total: u64, text: bool) -> Progress {
        Progress {
            label: label.to_string(),
            total,
            started: Instant::now(),
            drawn: None,
            on: text && std::io::stderr().is_terminal(),
        }
    }

    /// The total, once it is known.
    pub fn set_total(&mut self, total: u64) {
        self.total = total;
    }

    /// `done` bytes of the total are done.
    pub fn set(&mut self, done: u64) {
        if !self.on || self.drawn.is_some_and(|t| t.elapsed() < EVERY) {
            return;
        }
        self.drawn = Some(Instant::now());
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = done as f64 / secs;
        let left = self.total.saturating_sub(done);
        let eta = if rate > 0.0 {
            format!("{:.0}s", left as f64 / rate)
        } else {
            "-".into()
        };
        let pct = done as f64 * 100.0 / self.total.max(1) as f64;
        let mut e = std::io::stderr();
        let _ = write!(
            e,
            "\r\x1b[2K{}: {pct:.0}% ({} of {}, {}/s, ETA {eta})",
            self.label,
            human(done),
            human(self.total),
            human(rate as u64)
        );
        let _ = e.flush();
    }

    /// Clears the line (the command prints its result next).
    pub fn finish(&mut self) {
        if self.on && self.drawn.is_some() {
            let mut e = std::io::stderr();
            let _ = write!(e, "\r\x1b[2K");
            let _ = e.flush();
        }
        self.on = false;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
