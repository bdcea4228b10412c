//! The cluster's events in any metadata store (run from the conformance suite).

use crate::ClusterMeta;

/// Events are numbered in order, the newest kept, and the recorder's mark guards its writes.
pub(super) async fn events(m: &ClusterMeta) {
    use crate::cluster::{ClusterEvent, EVENTS_KEPT, EVENTS_PER_CALL};
    assert!(m.events(None).await.unwrap().is_empty());
    assert_eq!(m.events_seen().await.unwrap(), None);
    let ev = |i: usize| ClusterEvent::new(i as u64, "node-down", format!("event {i}"));
    let r1 = m
        .record_events(&[ev(1), ev(2)], b"seen 1", 0)
        .await
        .unwrap()
        .expect("the first recorder writes");
    let got = m.events(None).await.unwrap();
    assert_eq!(got.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(got[1].text, "event 2");
    assert_eq!(
        m.events_seen().await.unwrap(),
        Some((b"seen 1".to_vec(), r1))
    );
    // A recorder that read an older mark writes nothing.
    assert_eq!(m.record_events(&[ev(9)], b"stale", 0).await.unwrap(), None);
    assert_eq!(m.events(None).await.unwrap().len(), 2);
    // Past the limit, the oldest go; a burst larger than one call's share is summed up.
    let burst: Vec<ClusterEvent> = (3..=EVENTS_PER_CALL + 12).map(ev).collect();
    let mut rev = m
        .record_events(&burst, b"seen 2", r1)
        .await
        .unwrap()
        .unwrap();
    let got = m.events(None).await.unwrap();
    assert_eq!(got.len(), 2 + EVENTS_PER_CALL);
    assert_eq!(got.last().unwrap().text, "and 11 more changes at once");
    while m.events(None).await.unwrap().len() < EVENTS_KEPT {
        let more: Vec<ClusterEvent> = (0..EVENTS_PER_CALL).map(ev).collect();
        rev = m
            .record_events(&more, b"seen 2", rev)
            .await
            .unwrap()
            .unwrap();
    }
    let got = m.events(None).await.unwrap();
    assert_eq!(got.len(), EVENTS_KEPT);
    let newest = got.last().unwrap().seq;
    assert_eq!(got[0].seq, newest - EVENTS_KEPT as u64 + 1);
    assert!(got.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    let last3 = m.events(Some(3)).await.unwrap();
    assert_eq!(last3.len(), 3);
    assert_eq!(last3[2].seq, newest);
    let r2 = rev;
    // A mark alone (nothing to say) is a write too.
    assert!(m.record_events(&[], b"seen 3", r2).await.unwrap().is_some());
    assert_eq!(m.events(None).await.unwrap().len(), EVENTS_KEPT);
}
