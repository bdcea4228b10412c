//! Objects a call works on now: a second call on the same one is ABORTED, as the spec asks
//! of a plugin that cannot run two operations on one volume at once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tonic::Status;

#[derive(Debug, Clone, Default)]
pub(crate) struct Busy(Arc<Mutex<HashSet<String>>>);

/// Marks an object busy while a call works on it.
#[derive(Debug)]
pub(crate) struct Hold {
    busy: Busy,
    key: String,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.busy
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

impl Busy {
    /// Marks `key` busy, or ABORTED if a call works on it now.
    pub(crate) fn hold(&self, key: &str) -> Result<Hold, Status> {
        let mut b = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !b.insert(key.to_string()) {
            return Err(Status::aborted(format!(
                "an operation on {key} is under way"
            )));
        }
        Ok(Hold {
            busy: self.clone(),
            key: key.to_string(),
        })
    }
}
