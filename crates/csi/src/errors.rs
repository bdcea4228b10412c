//! The spec's gRPC codes for the cluster's refusals, from their stable codes (never from a
//! message's words).

use tonic::{Code, Response, Status};
use trireme_control::{ControlError, ErrorCode};

/// The status a CO gets for a control request's failure.
/// What every service's call answers.
pub(crate) type Answer<T> = Result<Response<T>, Status>;

pub(crate) fn ok<T>(t: T) -> Answer<T> {
    Ok(Response::new(t))
}

pub fn status(e: ControlError) -> Status {
    let code = match e.code() {
        ErrorCode::NotFound => Code::NotFound,
        ErrorCode::AlreadyExists => Code::AlreadyExists,
        // In use by a writer, an export or a clone: the CO may retry once it is let go.
        ErrorCode::InUse => Code::FailedPrecondition,
        ErrorCode::NoSpace => Code::ResourceExhausted,
        ErrorCode::Invalid => Code::InvalidArgument,
        ErrorCode::Denied => Code::PermissionDenied,
        // Another operation on it runs: the spec's word for that is ABORTED.
        ErrorCode::Busy => Code::Aborted,
        ErrorCode::Unavailable => Code::Unavailable,
        ErrorCode::Internal | ErrorCode::Unknown => Code::Internal,
    };
    Status::new(code, e.to_string())
}

pub(crate) fn invalid(msg: impl Into<String>) -> Status {
    Status::invalid_argument(msg.into())
}

/// Whether a failure is the cluster's "not there".
pub(crate) fn not_found(e: &ControlError) -> bool {
    e.code() == ErrorCode::NotFound
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_control::Refusal;

    #[test]
    fn every_code_has_its_status() {
        let cases = [
            (ErrorCode::NotFound, Code::NotFound),
            (ErrorCode::AlreadyExists, Code::AlreadyExists),
            (ErrorCode::InUse, Code::FailedPrecondition),
            (ErrorCode::NoSpace, Code::ResourceExhausted),
            (ErrorCode::Invalid, Code::InvalidArgument),
            (ErrorCode::Denied, Code::PermissionDenied),
            (ErrorCode::Busy, Code::Aborted),
            (ErrorCode::Unavailable, Code::Unavailable),
            (ErrorCode::Internal, Code::Internal),
            (ErrorCode::Unknown, Code::Internal),
        ];
        for (c, want) in cases {
            let e = ControlError::Remote(Refusal::new(c, "x"));
            assert_eq!(status(e).code(), want, "{c:?}");
        }
        let down = ControlError::Elsewhere("no manager".into());
        assert_eq!(status(down).code(), Code::Unavailable);
    }
}
