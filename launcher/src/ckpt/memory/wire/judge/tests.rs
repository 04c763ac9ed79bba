//! The receiver's judgement of offers and fetches.

use super::*;
use crate::ckpt::memory::wire::{decode, Header, HeaderError, OfferFile};

fn offer(from: &str) -> Offer {
    Offer {
        run_id: "job".into(),
        generation: 2,
        step: 8,
        from: from.into(),
        files: vec![OfferFile {
            path: "/ck/job/step-8-g2/rank0.pt".into(),
            bytes: 3,
            digest: String::new(),
            rank: Some(0),
        }],
        mac: String::new(),
    }
}

fn nodes() -> Vec<(String, String)> {
    ["a", "b", "c"]
        .map(|n| (n.to_string(), "127.0.0.1".to_string()))
        .to_vec()
}

const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

fn fetch(from: &str) -> Fetch {
    Fetch {
        fetch: true,
        run_id: "job".into(),
        generation: 3,
        from: from.into(),
        step: 8,
        saved_in: 2,
        files: offer("a").files,
        mac: String::new(),
    }
}

#[test]
fn a_fetch_is_served_to_any_member_of_the_followed_generation_and_told_from_an_offer() {
    let n = nodes();
    let r = Receiver {
        run_id: "job",
        generation: Some((3, &n)),
        me: "b",
        peer: LOCAL,
        token: Some("tok"),
        nonce: b"0123456789abcdef",
        ckpt_dir: Path::new("/ck"),
    };
    let mut f = fetch("c");
    f.sign(Some("tok"), r.nonce);
    assert_eq!(
        judge_fetch(&f, &r),
        Ok(()),
        "c is not b's predecessor: still served"
    );
    let Header::Fetch(back) = decode(&f.encode()[4..]).unwrap() else {
        panic!("a fetch decodes as one")
    };
    assert_eq!(back, f);
    assert!(matches!(
        decode(&offer("a").encode()[4..]),
        Ok(Header::Offer(_))
    ));
    assert!(matches!(decode(b"{}"), Err(HeaderError::NotAnOffer(_))));
    assert!(matches!(
        decode(br#"{"fetch": true}"#),
        Err(HeaderError::NotAFetch(_))
    ));
    assert!(decode(b"{}")
        .unwrap_err()
        .to_string()
        .starts_with("not an offer: "));
    let unsigned = fetch("c");
    assert_eq!(judge_fetch(&unsigned, &r), Err(Refusal::FetchMac));
    assert_eq!(
        Refusal::FetchMac.to_string(),
        "the fetch's MAC does not match this run's token"
    );
    let mut stranger = fetch("x");
    stranger.sign(Some("tok"), r.nonce);
    assert_eq!(
        judge_fetch(&stranger, &r).unwrap_err().to_string(),
        "'x' is not a member of generation 3"
    );
    let earlier = Receiver {
        generation: Some((2, &n)),
        ..r
    };
    let refused = judge_fetch(&f, &earlier).unwrap_err();
    assert_eq!(
        refused,
        Refusal::FetchInGeneration {
            generation: 3,
            follows: 2
        }
    );
    assert_eq!(
        refused.to_string(),
        "a fetch in generation 3, this node follows generation 2"
    );
    let elsewhere = Receiver {
        peer: "10.0.0.9".parse().unwrap(),
        ..r
    };
    let refused = judge_fetch(&f, &elsewhere).unwrap_err();
    assert!(matches!(
        refused,
        Refusal::FetchFromElsewhere { ref from, advertised, .. } if from == "c" && advertised == LOCAL
    ));
    assert_eq!(
        refused.to_string(),
        "the connection of 'c' came from 10.0.0.9, but that node advertises 127.0.0.1"
    );
    let mut escape = fetch("c");
    escape.files[0].path = "/ck/../etc/passwd".into();
    escape.sign(Some("tok"), r.nonce);
    let refused = judge_fetch(&escape, &r).unwrap_err();
    assert!(matches!(refused, Refusal::Outside { .. }));
    assert_eq!(
        refused.to_string(),
        "'/ck/../etc/passwd' is not a plain path inside --ckpt-dir /ck"
    );
    escape.files.clear();
    escape.sign(Some("tok"), r.nonce);
    assert_eq!(judge_fetch(&escape, &r), Err(Refusal::NoFilesFetched));
    let mut other = fetch("c");
    other.run_id = "other".into();
    assert!(matches!(
        judge_fetch(&other, &r),
        Err(Refusal::FetchOfRun { .. })
    ));
    let between = Receiver {
        generation: None,
        ..r
    };
    assert_eq!(judge_fetch(&f, &between), Err(Refusal::NoGeneration));
}

#[test]
fn an_offer_is_taken_only_from_the_ring_predecessor_of_the_followed_generation() {
    let n = nodes();
    let r = Receiver {
        run_id: "job",
        generation: Some((2, &n)),
        me: "b",
        peer: LOCAL,
        token: None,
        nonce: b"0123456789abcdef",
        ckpt_dir: Path::new("/ck"),
    };
    assert_eq!(judge(&offer("a"), &r), Ok(()));
    let refused = judge(&offer("c"), &r).unwrap_err();
    assert_eq!(
        refused,
        Refusal::NotPredecessor {
            from: "c".into(),
            generation: 2,
            predecessor: Some("a".into())
        }
    );
    assert_eq!(
        refused.to_string(),
        "'c' is not the node whose replicas this node holds in generation 2 (a)"
    );
    assert!(
        matches!(judge(&offer("x"), &r), Err(Refusal::NotPredecessor { .. })),
        "not in the generation"
    );
    let elsewhere = Receiver {
        peer: "10.0.0.9".parse().unwrap(),
        ..r
    };
    let refused = judge(&offer("a"), &elsewhere).unwrap_err();
    assert!(matches!(refused, Refusal::OfferFromElsewhere { .. }));
    assert_eq!(
        refused.to_string(),
        "the offer of 'a' came from 10.0.0.9, but that node advertises 127.0.0.1"
    );
    let later = Receiver {
        generation: Some((3, &n)),
        ..r
    };
    let refused = judge(&offer("a"), &later).unwrap_err();
    assert_eq!(
        refused,
        Refusal::OfferOfGeneration {
            generation: 2,
            follows: 3
        }
    );
    assert_eq!(
        refused.to_string(),
        "an offer of generation 2, this node follows generation 3"
    );
    let none = Receiver {
        generation: None,
        ..r
    };
    assert_eq!(judge(&offer("a"), &none), Err(Refusal::NoGeneration));
    assert_eq!(
        Refusal::NoGeneration.to_string(),
        "this node follows no generation now"
    );
    let mut other = offer("a");
    other.run_id = "other".into();
    let refused = judge(&other, &r).unwrap_err();
    assert!(matches!(refused, Refusal::OfferOfRun { ref run_id, .. } if run_id == "other"));
    assert_eq!(refused.to_string(), "an offer of run 'other', not 'job'");
    let mut escape = offer("a");
    escape.files[0].path = "/ck/../etc/passwd".into();
    assert_eq!(
        judge(&escape, &r).unwrap_err().to_string(),
        "'/ck/../etc/passwd' is not a plain path inside --ckpt-dir /ck"
    );
    escape.files.clear();
    assert_eq!(judge(&escape, &r), Err(Refusal::NoFilesOffered));
    assert_eq!(Refusal::NoFilesOffered.to_string(), "an offer of no files");
}

#[test]
fn with_a_token_only_an_offer_signed_for_this_nonce_is_taken() {
    let n = nodes();
    let nonce = b"0123456789abcdef";
    let r = Receiver {
        run_id: "job",
        generation: Some((2, &n)),
        me: "b",
        peer: LOCAL,
        token: Some("s3cret"),
        nonce,
        ckpt_dir: Path::new("/ck"),
    };
    let mut o = offer("a");
    assert_eq!(judge(&o, &r), Err(Refusal::OfferMac), "unsigned");
    assert_eq!(
        Refusal::OfferMac.to_string(),
        "the offer's MAC does not match this run's token"
    );
    o.sign(Some("s3cret"), nonce);
    assert_eq!(judge(&o, &r), Ok(()));
    o.sign(Some("wrong"), nonce);
    assert_eq!(judge(&o, &r), Err(Refusal::OfferMac), "another token");
    o.sign(Some("s3cret"), b"another nonce!!!");
    assert_eq!(judge(&o, &r), Err(Refusal::OfferMac), "a replayed offer");
    o.sign(Some("s3cret"), nonce);
    o.step = 9;
    assert_eq!(
        judge(&o, &r),
        Err(Refusal::OfferMac),
        "altered after signing"
    );
    let bytes = o.encode();
    let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
    let back: Offer = serde_json::from_slice(&bytes[4..4 + len]).unwrap();
    assert_eq!(back, o);
}
