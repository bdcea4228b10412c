//! Stable error codes of the control API: what kind of failure a request met, for programs to
//! decide on (the CLI's exit status, a CSI driver's gRPC codes), never the message.

use serde::{Deserialize, Serialize};

/// What kind of failure a request met. The names on the wire never change; a code added
/// later reads as [`ErrorCode::Unknown`] in an older client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// What the request names is not there (a volume, a snapshot).
    NotFound,
    /// A volume of that name exists already.
    AlreadyExists,
    /// What the request names is in use (attached, exported, read by clones, being moved).
    InUse,
    /// No room: no node, or not enough of them, can hold the copies.
    NoSpace,
    /// The request as given breaks a rule: asking again unchanged does not help.
    Invalid,
    /// The caller's identity may not make this request.
    Denied,
    /// Another request on the same object runs now, or the object changed under this one.
    Busy,
    /// The cluster could not answer now (the metadata store, a node, the manager's role):
    /// asking again may succeed.
    Unavailable,
    /// A fault of the cluster itself (a corrupt record).
    Internal,
    /// A manager that gave no code (an older release), or a code newer than this client.
    #[serde(other)]
    Unknown,
}

/// A refusal or failure as the control API carries it: its code and its message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Wire")]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

impl Refusal {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What a refusal reads from: an object with its code, or the bare message of a manager from
/// before codes.
#[derive(Deserialize)]
#[serde(untagged)]
enum Wire {
    Coded { code: ErrorCode, message: String },
    Plain(String),
}

impl From<Wire> for Refusal {
    fn from(w: Wire) -> Refusal {
        match w {
            Wire::Coded { code, message } => Refusal { code, message },
            Wire::Plain(message) => Refusal {
                code: ErrorCode::Unknown,
                message,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_read_back_and_older_or_newer_managers_still_decode() {
        let r = Refusal::new(ErrorCode::InUse, "volume v is attached");
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(
            line,
            r#"{"code":"in_use","message":"volume v is attached"}"#
        );
        assert_eq!(serde_json::from_str::<Refusal>(&line).unwrap(), r);
        // A manager from before codes sent the message alone.
        let old: Refusal = serde_json::from_str(r#""no volume named \"x\"""#).unwrap();
        assert_eq!(old.code, ErrorCode::Unknown);
        assert_eq!(old.message, "no volume named \"x\"");
        // A code added later.
        let newer: Refusal =
            serde_json::from_str(r#"{"code":"quota_exceeded","message":"m"}"#).unwrap();
        assert_eq!(newer.code, ErrorCode::Unknown);
    }
}
