//! A limited volume's part of a report, for a target whose writer is another process (an NBD
//! export): its limits and the time its writer says requests waited, from `status`.

use std::path::Path;

use trireme_control::Request;
use trireme_replication::qos::Limits;

use crate::engine::LimitsSection;

/// `volume`'s limits and its writer's summed wait (if it says) now.
pub fn snapshot(data_dir: &Path, volume: &str) -> Option<(Limits, Option<f64>)> {
    let st: trireme_control::StatusReport = crate::tier::call(data_dir, Request::Status)?;
    let v = st.volumes.into_iter().find(|v| v.name == volume)?;
    Some((v.limits, v.throttled_seconds))
}

/// The section for a window from `before` to `after`; none for a volume without limits.
pub fn section(
    before: Option<(Limits, Option<f64>)>,
    after: Option<(Limits, Option<f64>)>,
) -> Option<LimitsSection> {
    let (limits, end) = after?;
    if limits.is_default() {
        return None;
    }
    let start = before.and_then(|b| b.1);
    Some(LimitsSection {
        limits,
        // A writer that attached meanwhile counts from 0 again: then nothing is said.
        waited_s: end.zip(start).map(|(e, s)| e - s).filter(|w| *w >= 0.0),
    })
}
