//! The libraries' progress events rendered on stderr: indicatif's bar on a terminal; anywhere
//! else (a CI log, a pipe) a plain line at each tenth of the work once it has run for
//! [`QUIET_FOR`], so a log shows a 4-minute bundle moving while a 1-second one stays silent.

use std::borrow::Cow;
use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bundler::progress::Event;

/// The observer a command hands the libraries: `None` (nothing shown) when `quiet`.
pub(crate) fn shown_unless(quiet: bool) -> Option<Arc<dyn bundler::Progress>> {
    (!quiet).then(|| Arc::new(Terminal::default()) as Arc<dyn bundler::Progress>)
}

/// The observer of a command without `--quiet`, which shows progress only on a terminal
/// (a merge is seconds of work, not worth lines in a log).
pub(crate) fn on_a_terminal() -> Box<dyn bundler::Progress> {
    if std::io::stderr().is_terminal() {
        Box::new(Terminal::default())
    } else {
        Box::new(bundler::progress::Silent)
    }
}

/// Each piece of work's [`Progress`] from its `Start` to its `Finish`.
#[derive(Default)]
pub(crate) struct Terminal {
    work: Mutex<Option<Arc<Progress>>>,
}

impl bundler::Progress for Terminal {
    fn event(&self, event: Event<'_>) {
        let mut work = self.work.lock().unwrap_or_else(|e| e.into_inner());
        if let Event::Start { steps, stage } = event {
            if let Some(previous) = work.take() {
                previous.finish_and_clear();
            }
            *work = Some(Arc::new(Progress::new(steps as usize, true, stage)));
            return;
        }
        if let Event::Finish = event {
            if let Some(previous) = work.take() {
                previous.finish_and_clear();
            }
            return;
        }
        let Some(progress) = work.clone() else {
            return;
        };
        // The bar is drawn outside the lock: the work's threads report at once.
        drop(work);
        match event {
            Event::Stage(stage) => progress.set_message(stage.to_owned()),
            Event::Detail(detail) => progress.set_detail(detail.to_owned()),
            Event::Position(done) => progress.set_position(done),
            Event::Step => progress.inc(),
            Event::Start { .. } | Event::Finish => {}
        }
    }
}

/// How long work runs before it prints its first line where there is no terminal.
const QUIET_FOR: Duration = Duration::from_secs(2);

/// The progress of `len` steps of work, shared by the threads that do it.
pub(crate) struct Progress {
    bar: indicatif::ProgressBar,
    lines: Option<Lines>,
}

/// Where stderr is no terminal: the line printer's state.
struct Lines {
    len: u64,
    started: Instant,
    done: AtomicU64,
    /// The last tenth a line was printed for (0: none yet).
    tenth: AtomicU64,
    /// What the work is doing now, as `set_message` said; lines name it.
    stage: Mutex<Cow<'static, str>>,
}

impl Progress {
    /// Progress for `len` steps, drawn only when `shown`, as `what` (a bar's message, and the
    /// name in a line until [`Progress::set_message`] gives another).
    pub(crate) fn new(len: usize, shown: bool, what: &str) -> Progress {
        if !shown {
            return Progress {
                bar: indicatif::ProgressBar::hidden(),
                lines: None,
            };
        }
        let bar = indicatif::ProgressBar::new(len as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed}] {wide_msg}")
                .expect("a valid template"),
        );
        let lines = (!std::io::stderr().is_terminal()).then(|| Lines {
            len: len as u64,
            started: Instant::now(),
            done: AtomicU64::new(0),
            tenth: AtomicU64::new(0),
            stage: Mutex::new(Cow::Owned(what.to_owned())),
        });
        Progress { bar, lines }
    }

    /// What the work does now: the bar's message; for lines, a new stage (counted from 0
    /// again) when it differs from the last one.
    pub(crate) fn set_message(&self, message: impl Into<Cow<'static, str>>) {
        let message = message.into();
        if let Some(lines) = &self.lines {
            let mut stage = lines.stage.lock().unwrap_or_else(|e| e.into_inner());
            if *stage != message {
                *stage = message.clone();
                lines.done.store(0, Ordering::Relaxed);
                lines.tenth.store(0, Ordering::Relaxed);
            }
        }
        self.bar.set_message(message);
    }

    /// Which step runs now (`swiglu cu130 sm_90a`): the bar's message only. Lines keep
    /// naming the stage and counting on, so a step per message never restarts the count.
    pub(crate) fn set_detail(&self, detail: impl Into<Cow<'static, str>>) {
        self.bar.set_message(detail.into());
    }

    /// `done` steps of the current stage are done.
    pub(crate) fn set_position(&self, done: u64) {
        self.bar.set_position(done);
        if let Some(lines) = &self.lines {
            lines.done.fetch_max(done, Ordering::Relaxed);
            lines.report();
        }
    }

    /// One more step is done.
    pub(crate) fn inc(&self) {
        self.bar.inc(1);
        if let Some(lines) = &self.lines {
            lines.done.fetch_add(1, Ordering::Relaxed);
            lines.report();
        }
    }

    /// Clears the bar; lines end with nothing more.
    pub(crate) fn finish_and_clear(&self) {
        self.bar.finish_and_clear();
    }
}

impl Lines {
    /// Prints a line when the work has passed a tenth no line has named yet, once it has run
    /// for [`QUIET_FOR`]. One thread prints each tenth.
    fn report(&self) {
        let elapsed = self.started.elapsed();
        if self.len == 0 || elapsed < QUIET_FOR {
            return;
        }
        let done = self.done.load(Ordering::Relaxed).min(self.len);
        let tenth = done * 10 / self.len;
        let printed = self.tenth.load(Ordering::Relaxed);
        if tenth <= printed
            || self
                .tenth
                .compare_exchange(printed, tenth, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let stage = self.stage.lock().unwrap_or_else(|e| e.into_inner()).clone();
        tracing::info!(
            "{stage}: {done}/{} ({}%), {}s",
            self.len,
            tenth * 10,
            elapsed.as_secs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Off a terminal (as under `cargo test`), nothing is printed before [`QUIET_FOR`], then
    /// one line per tenth passed, each tenth once however many threads pass it, and a new
    /// stage counts from 0 again.
    #[test]
    fn lines_mark_each_tenth_once_after_the_quiet_start() {
        let progress = Progress::new(100, true, "compressing cubins");
        // On a terminal the bar draws instead, which this does not check.
        if let Some(lines) = &progress.lines {
            for _ in 0..50 {
                progress.inc();
            }
            assert_eq!(lines.tenth.load(Ordering::Relaxed), 0, "quiet at first");
        }
        let lines_started_early = Lines {
            len: 100,
            started: Instant::now() - QUIET_FOR,
            done: AtomicU64::new(0),
            tenth: AtomicU64::new(0),
            stage: Mutex::new(Cow::Borrowed("compressing cubins")),
        };
        let progress = Progress {
            bar: indicatif::ProgressBar::hidden(),
            lines: Some(lines_started_early),
        };
        let lines = progress.lines.as_ref().unwrap();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..10 {
                        progress.inc();
                    }
                });
            }
        });
        assert_eq!(lines.done.load(Ordering::Relaxed), 40);
        assert_eq!(lines.tenth.load(Ordering::Relaxed), 4);
        progress.set_message("writing");
        assert_eq!(lines.tenth.load(Ordering::Relaxed), 0);
        progress.set_position(100);
        assert_eq!(lines.tenth.load(Ordering::Relaxed), 10);
        // The same stage again changes nothing.
        progress.set_message("writing");
        assert_eq!(lines.tenth.load(Ordering::Relaxed), 10);
        // A step's own detail is not a stage: the count goes on past it. (Each compile job
        // once named its target as the message, which restarted the count every job, so a
        // piped 27 s bundle printed no line.)
        progress.set_message("targets");
        for step in 0..30 {
            progress.set_detail(format!("kernel {step}"));
            progress.inc();
        }
        assert_eq!(lines.done.load(Ordering::Relaxed), 30);
        assert_eq!(lines.tenth.load(Ordering::Relaxed), 3);
        let hidden = Progress::new(100, false, "x");
        assert!(hidden.lines.is_none());
    }

    /// The libraries' events drive one piece of work at a time: a `Start` begins it, the
    /// steps count in it, a `Finish` ends it, and events outside any work are ignored.
    #[test]
    fn terminal_follows_each_piece_of_work_from_start_to_finish() {
        use bundler::Progress as _;
        let terminal = Terminal::default();
        terminal.event(Event::Step);
        assert!(terminal.work.lock().unwrap().is_none());
        terminal.event(Event::Start {
            steps: 10,
            stage: "targets",
        });
        for _ in 0..3 {
            terminal.event(Event::Step);
        }
        let work = terminal.work.lock().unwrap().clone().unwrap();
        if let Some(lines) = &work.lines {
            assert_eq!(lines.done.load(Ordering::Relaxed), 3);
            assert_eq!(*lines.stage.lock().unwrap(), "targets");
        }
        terminal.event(Event::Finish);
        assert!(terminal.work.lock().unwrap().is_none());
        assert!(shown_unless(true).is_none());
    }
}
