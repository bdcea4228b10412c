//! What the multi-run benchmarks (`--compare`, `--sweep`) share: how they print and how they
//! fail.

/// How a comparison or sweep prints its results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Markdown,
}

/// Why a comparison or sweep stopped.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// The request cannot be run as given (a bad axis value, a target that does not fit).
    #[error("{0}")]
    Usage(String),
    /// A run, a temporary cluster or an output file failed.
    #[error("{0}")]
    Failed(String),
}
