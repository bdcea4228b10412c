//! A writer's answers to the manager's requests, as the manager records them for a writer on
//! another host: only the fields a writer answers with are taken from the answer, the rest
//! (what was asked: the nodes of a move, a resize's size, a snapshot's id) stay as the
//! manager wrote them. So a writer cannot turn an answer into a request of its own.

use serde::{Deserialize, Serialize};

use super::*;
use crate::{
    MetaError, MoveRequest, MoveRequestState, ResizeRequest, ScrubRequest, ScrubState, SnapshotAsk,
    TakeOutRequest, TakeOutState,
};

/// A writer's answer to one of the manager's requests, the request as the writer would write
/// it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum WriterAnswer {
    Move(MoveRequest),
    TakeOut(TakeOutRequest),
    Scrub(ScrubRequest),
    Resize(ResizeRequest),
    Snapshot(SnapshotAsk),
}

fn refused(what: &str, state: impl std::fmt::Debug) -> MetaError {
    MetaError::Refused(format!(
        "a writer does not answer {what} with state {state:?}"
    ))
}

/// A scrub, resize or snapshot request's states a writer may write.
fn worker_state(what: &str, s: ScrubState) -> Result<ScrubState, MetaError> {
    match s {
        ScrubState::Running | ScrubState::Done | ScrubState::Failed => Ok(s),
        ScrubState::Asked => Err(refused(what, s)),
    }
}

impl WriterAnswer {
    /// The key of the request it answers.
    pub fn key(&self, name: &str) -> String {
        match self {
            WriterAnswer::Move(_) => ClusterMeta::move_request_key(name),
            WriterAnswer::TakeOut(_) => ClusterMeta::takeout_key(name),
            WriterAnswer::Scrub(_) => ClusterMeta::scrub_key(name),
            WriterAnswer::Resize(_) => ClusterMeta::resize_key(name),
            WriterAnswer::Snapshot(_) => ClusterMeta::snapshot_ask_key(name),
        }
    }

    /// The request `asked` (as stored) with this answer's fields: the value to store, or
    /// why not (the request is of another epoch, or the answer writes a state only the
    /// manager writes).
    pub fn merge(&self, asked: &KeyValue, epoch: u64) -> Result<Vec<u8>, MetaError> {
        match self {
            WriterAnswer::Move(a) => merged(asked, epoch, |r: &mut MoveRequest| {
                if a.state == MoveRequestState::Asked {
                    return Err(refused("a move", a.state));
                }
                r.state = a.state;
                r.progress = a.progress.clone();
                r.error = a.error.clone();
                Ok(r.epoch)
            }),
            WriterAnswer::TakeOut(a) => merged(asked, epoch, |r: &mut TakeOutRequest| {
                if matches!(a.state, TakeOutState::Asked | TakeOutState::Return) {
                    return Err(refused("a take-out", a.state));
                }
                r.state = a.state;
                r.error = a.error.clone();
                r.resynced_bytes = a.resynced_bytes;
                r.full = a.full;
                Ok(r.epoch)
            }),
            WriterAnswer::Scrub(a) => merged(asked, epoch, |r: &mut ScrubRequest| {
                r.state = worker_state("a scrub", a.state)?;
                r.report = a.report.clone();
                r.error = a.error.clone();
                Ok(r.epoch)
            }),
            WriterAnswer::Resize(a) => merged(asked, epoch, |r: &mut ResizeRequest| {
                r.state = worker_state("a resize", a.state)?;
                r.error = a.error.clone();
                Ok(r.epoch)
            }),
            WriterAnswer::Snapshot(a) => merged(asked, epoch, |r: &mut SnapshotAsk| {
                r.state = worker_state("a snapshot", a.state)?;
                r.nodes = a.nodes.clone();
                r.size = a.size;
                r.error = a.error.clone();
                Ok(r.epoch)
            }),
        }
    }
}

/// The stored request with `answer` applied (which returns the request's epoch), refused
/// unless that epoch is the writer's.
fn merged<T: serde::de::DeserializeOwned + Serialize>(
    asked: &KeyValue,
    epoch: u64,
    answer: impl FnOnce(&mut T) -> Result<u64, MetaError>,
) -> Result<Vec<u8>, MetaError> {
    let mut r: T = decode(asked)?;
    let theirs = answer(&mut r)?;
    if theirs != epoch {
        return Err(MetaError::Refused(format!(
            "the request is for the writer of epoch {theirs}, not {epoch}"
        )));
    }
    Ok(encode(&r))
}

impl ClusterMeta {
    /// Records the answer of the writer of `epoch` to `name`'s request read at revision `at`
    /// ([`WriterAnswer::merge`]). Its new revision, or `None`: the request changed or went
    /// meanwhile.
    pub async fn answer_request(
        &self,
        name: &str,
        epoch: u64,
        at: i64,
        answer: &WriterAnswer,
    ) -> Result<Option<i64>, MetaError> {
        let k = answer.key(name);
        let Some(kv) = self.store.get(&k).await? else {
            return Ok(None);
        };
        if kv.mod_revision != at {
            return Ok(None);
        }
        let value = answer.merge(&kv, epoch)?;
        self.put_at_revision(k, value, at).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored<T: Serialize>(v: &T) -> KeyValue {
        KeyValue {
            key: "k".into(),
            value: encode(v),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        }
    }

    #[test]
    fn an_answer_changes_only_what_a_writer_answers_with() {
        let asked = ResizeRequest {
            epoch: 7,
            size: 8 << 30,
            state: ScrubState::Asked,
            error: None,
        };
        // A writer that "answers" with a smaller size changes only the state.
        let answer = WriterAnswer::Resize(ResizeRequest {
            size: 1 << 20,
            state: ScrubState::Done,
            ..asked.clone()
        });
        let got: ResizeRequest =
            serde_json::from_slice(&answer.merge(&stored(&asked), 7).unwrap()).unwrap();
        assert_eq!(got.size, 8 << 30);
        assert_eq!(got.state, ScrubState::Done);
        // Another epoch's writer, or the manager's own state, is refused.
        assert!(answer.merge(&stored(&asked), 8).is_err());
        let asks = WriterAnswer::Resize(asked.clone());
        assert!(asks.merge(&stored(&asked), 7).is_err());
        let moved = MoveRequest {
            from: 1,
            to: 2,
            rate: None,
            epoch: 7,
            state: MoveRequestState::Asked,
            progress: None,
            error: None,
        };
        let answer = WriterAnswer::Move(MoveRequest {
            from: 3,
            to: 4,
            state: MoveRequestState::Done,
            ..moved.clone()
        });
        let got: MoveRequest =
            serde_json::from_slice(&answer.merge(&stored(&moved), 7).unwrap()).unwrap();
        assert_eq!(
            (got.from, got.to, got.state),
            (1, 2, MoveRequestState::Done)
        );
    }
}
