//! trireme's records as they come back from etcd (JSON anyone with write access to a key
//! could have put there): each record type decodes to an error or to a value that encodes
//! back to itself.
#![no_main]
use libfuzzer_sys::fuzz_target;
use serde::{de::DeserializeOwned, Serialize};

fn round_trips<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(data: &[u8]) {
    if let Ok(v) = serde_json::from_slice::<T>(data) {
        let again = serde_json::to_vec(&v).unwrap();
        assert_eq!(serde_json::from_slice::<T>(&again).ok(), Some(v));
    }
}

fuzz_target!(|data: &[u8]| {
    round_trips::<trireme_meta::VolumeRecord>(data);
    round_trips::<trireme_meta::NodeRecord>(data);
    round_trips::<trireme_meta::AttachRecord>(data);
    round_trips::<trireme_meta::AliveRecord>(data);
    round_trips::<trireme_meta::ManagerRecord>(data);
    round_trips::<trireme_meta::MoveRequest>(data);
    round_trips::<trireme_meta::TakeOutRequest>(data);
    round_trips::<trireme_meta::RestartOrder>(data);
    round_trips::<trireme_meta::RevokedCert>(data);
    round_trips::<trireme_meta::ScrubRequest>(data);
    round_trips::<trireme_meta::WriterReport>(data);
    round_trips::<trireme_meta::ClusterEvent>(data);
    round_trips::<trireme_meta::ReportedLink>(data);
    round_trips::<trireme_meta::ScrubRecord>(data);
    // What the event recorder compared last (`events-seen`).
    round_trips::<trireme_control::events::Seen>(data);
});
