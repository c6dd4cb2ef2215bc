//! Progress of long work, told to an observer the caller supplies: the library draws nothing
//! and writes nothing to a terminal; the CLI renders the events (a bar on a terminal, a line
//! at each tenth in a log).
//!
//! | event | when |
//! | --- | --- |
//! | [`Event::Start`] | work of `steps` steps begins: the compile jobs, the cubins to write |
//! | [`Event::Stage`] | the same steps again for another stage (sketching, then compressing) |
//! | [`Event::Detail`] | which step runs now (`swiglu cu130 sm_90a`); not a new stage |
//! | [`Event::Position`] / [`Event::Step`] | steps done |
//! | [`Event::Finish`] | the work is over |
//!
//! Events come from the threads that do the work, in any order between `Start` and `Finish`.

/// What long work tells a [`Progress`] as it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// Work of `steps` steps begins, as `stage` (`targets`, `sketching cubins`).
    Start {
        /// How many steps the work has.
        steps: u64,
        /// What the work does.
        stage: &'a str,
    },
    /// The work goes on as another stage of its steps, counted from 0 again (or the same
    /// stage named again, which changes nothing).
    Stage(&'a str),
    /// Which step runs now; the stage and its count go on.
    Detail(&'a str),
    /// This many steps of the current stage are done.
    Position(u64),
    /// One more step is done.
    Step,
    /// The work is over.
    Finish,
}

/// An observer of long work's [`Event`]s, called from the threads that do the work.
pub trait Progress: Send + Sync {
    /// Hears one event.
    fn event(&self, event: Event<'_>);
}

/// Hears nothing: the progress of a caller that supplies no observer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Silent;

impl Progress for Silent {
    fn event(&self, _: Event<'_>) {}
}

/// The observer in `progress`, or [`Silent`] where there is none.
pub(crate) fn observer(progress: &Option<std::sync::Arc<dyn Progress>>) -> &dyn Progress {
    match progress {
        Some(progress) => progress.as_ref(),
        None => &Silent,
    }
}
