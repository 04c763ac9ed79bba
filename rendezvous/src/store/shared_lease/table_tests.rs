//! The lease table's rules, with synthetic instants.

use std::time::Duration;

use tokio::time::Instant;

use super::table::{Ended, LeaseTable};

const TTL: Duration = Duration::from_secs(10);
const CARRIER: i64 = 77;

fn at(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

#[test]
fn a_renewed_lease_lives_a_ttl_from_its_renewal_and_an_expired_one_cannot_be_renewed() {
    let t0 = Instant::now();
    let mut t = LeaseTable::default();
    t.grant(1, TTL, CARRIER, t0);
    assert_eq!(t.renew(1, at(t0, 9_000)), Some(TTL));
    assert!(t.take_expired(at(t0, 18_999)).is_empty(), "renewed at 9 s");
    assert_eq!(t.carrier(1, at(t0, 18_999)), Some(CARRIER));
    assert_eq!(t.carrier(1, at(t0, 19_000)), None, "past its deadline");
    assert_eq!(t.renew(1, at(t0, 19_000)), None);
    assert_eq!(t.take_expired(at(t0, 19_000)).len(), 1);
    assert!(t.is_empty());
    assert_eq!(t.renew(2, t0), None, "unknown");
}

#[test]
fn an_ended_lease_names_the_keys_it_last_wrote_with_their_revisions() {
    let t0 = Instant::now();
    let mut t = LeaseTable::default();
    t.grant(1, TTL, CARRIER, t0);
    t.grant(2, TTL, CARRIER, t0);
    for (k, rev) in [("/a", 5), ("/b", 6), ("/c", 7)] {
        t.writing(1, k);
        assert!(t.wrote(k, Some(1), rev));
    }
    assert!(
        t.wrote("/b", Some(2), 8),
        "/b now belongs to lease 2, as in etcd"
    );
    assert!(t.wrote("/c", None, 9), "/c rewritten without a lease");
    t.writing(1, "/pending"); // in flight, never confirmed
    t.deleted("/missing");
    assert_eq!(
        t.end(1),
        Some(Ended {
            lease: 1,
            keys: vec![("/a".into(), 5)]
        })
    );
    assert_eq!(t.end(1), None);
    assert_eq!(
        t.take_expired(at(t0, 10_000)),
        vec![Ended {
            lease: 2,
            keys: vec![("/b".into(), 8)]
        }]
    );
}

#[test]
fn a_write_that_lands_after_its_lease_ended_is_reported_for_deletion() {
    let t0 = Instant::now();
    let mut t = LeaseTable::default();
    t.grant(1, TTL, CARRIER, t0);
    t.writing(1, "/k");
    assert_eq!(t.take_expired(at(t0, 10_000)).len(), 1);
    assert!(!t.wrote("/k", Some(1), 3), "the caller deletes it");
}

#[test]
fn deletes_release_keys() {
    let t0 = Instant::now();
    let mut t = LeaseTable::default();
    t.grant(1, TTL, CARRIER, t0);
    for (k, rev) in [("/p/1", 1), ("/p/2", 2), ("/q", 3)] {
        t.writing(1, k);
        t.wrote(k, Some(1), rev);
    }
    t.deleted_prefix("/p/");
    assert_eq!(t.end(1).unwrap().keys, vec![("/q".into(), 3)]);
}

#[test]
fn the_writing_list_names_every_key_that_may_be_attached() {
    let t0 = Instant::now();
    let mut t = LeaseTable::default();
    t.grant(1, TTL, CARRIER, t0);
    assert_eq!(t.writing(1, "/b"), vec!["/b".to_string()]);
    assert_eq!(t.writing(1, "/a"), vec!["/a".to_string(), "/b".to_string()]);
    assert!(t.writing(9, "/x").is_empty(), "unknown lease");
}

#[test]
fn a_lost_carrier_takes_its_leases_only() {
    let t0 = Instant::now();
    let mut t = LeaseTable::default();
    t.grant(1, TTL, CARRIER, t0);
    t.grant(2, TTL, CARRIER, t0);
    t.grant(3, TTL, 78, t0);
    let mut lost = t.carrier_lost(CARRIER);
    lost.sort();
    assert_eq!(lost, vec![1, 2]);
    assert_eq!(t.len(), 1);
    assert_eq!(t.carrier(3, t0), Some(78));
}

#[test]
fn a_stall_moves_every_deadline() {
    let t0 = Instant::now();
    let mut t = LeaseTable::default();
    t.grant(1, TTL, CARRIER, t0);
    t.shift(Duration::from_secs(20));
    assert!(t.take_expired(at(t0, 29_999)).is_empty());
    assert_eq!(t.next_deadline(), Some(at(t0, 30_000)));
    assert_eq!(t.renew(1, at(t0, 29_999)), Some(TTL));
}
