//! Panics on a run's thread, recorded so that the run fails on them.
//!
//! The runtime catches a spawned task's panic: the task is gone (a cleaner, an encoder, a
//! resync loop), and the run goes on without it and may still pass. Each run has a thread of
//! its own (a current-thread runtime), so a panic on it is the run's.

use std::cell::RefCell;
use std::sync::Once;

thread_local! {
    /// The first panic on this thread, once [`watch`] was called on it.
    static FIRST: RefCell<Option<Option<String>>> = const { RefCell::new(None) };
}

/// Records panics on this thread from now on (for [`taken`]).
pub(crate) fn watch() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            FIRST.with(|f| {
                if let Some(first @ None) = f.borrow_mut().as_mut() {
                    *first = Some(info.to_string());
                }
            });
            before(info);
        }));
    });
    FIRST.with(|f| *f.borrow_mut() = Some(None));
}

/// The first panic recorded on this thread since [`watch`], if any.
pub(crate) fn taken() -> Option<String> {
    FIRST.with(|f| f.borrow_mut().take().flatten())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_spawned_tasks_panic_is_recorded_on_its_runs_thread() {
        let run = std::thread::spawn(|| {
            super::watch();
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async {
                let task = tokio::spawn(async { panic!("the cleaner's overflow") });
                assert!(task.await.is_err(), "the runtime caught it");
            });
            super::taken()
        });
        let calm = std::thread::spawn(|| {
            super::watch();
            super::taken()
        });
        let first = run.join().unwrap().expect("recorded");
        assert!(first.contains("the cleaner's overflow"), "{first}");
        assert_eq!(calm.join().unwrap(), None, "another run's thread saw none");
    }
}
