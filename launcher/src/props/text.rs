//! The Slurm hostlist, `--rdzv-conf`, `--rdzv-endpoint` and the other flag values under random
//! strings: never a panic, a clear error or a value that keeps its promises, and the values a
//! user writes parse back to what they meant.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::{corpus, edits, mutate};
use crate::checks::{self, DEFAULT_PORT};
use crate::config::timing::parse_rdzv_conf;
use crate::slurm::parse_hostlist;

const CASES: u32 = 4_000;

/// A host name or a bracketed IPv6 address.
fn host() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9.-]{1,10}", Just("[::1]".to_string())]
}

/// A well-formed hostlist and the names it stands for.
fn hostlist() -> impl Strategy<Value = (String, Vec<String>)> {
    let range = (0u64..200, 0u64..5, 1usize..4);
    let item = (
        "[a-z][a-z-]{0,4}",
        prop::collection::vec(range, 0..3),
        "[a-z]{0,2}",
    );
    prop::collection::vec(item, 1..4).prop_map(|items| {
        let (mut text, mut names) = (Vec::new(), Vec::new());
        for (prefix, ranges, suffix) in items {
            if ranges.is_empty() {
                text.push(format!("{prefix}{suffix}"));
                names.push(format!("{prefix}{suffix}"));
                continue;
            }
            let body: Vec<String> = ranges
                .iter()
                .map(|&(lo, len, w)| format!("{lo:0w$}-{:0w$}", lo + len))
                .collect();
            text.push(format!("{prefix}[{}]{suffix}", body.join(",")));
            for &(lo, len, w) in &ranges {
                names.extend((lo..=lo + len).map(|n| format!("{prefix}{n:0w$}{suffix}")));
            }
        }
        (text.join(","), names)
    })
}

proptest! {
    #![proptest_config(super::config(CASES))]

    #[test]
    fn flag_values_never_panic(s in ".{0,40}", t in "[\\[\\]0-9a-z,:=\\- ]{0,40}") {
        checks::text(&s);
        checks::text(&t);
    }

    #[test]
    fn hostlists_expand_to_what_they_name((text, names) in hostlist(), e in edits()) {
        prop_assert_eq!(parse_hostlist(&text), Ok(names));
        checks::hostlist(&String::from_utf8_lossy(&mutate(text.into_bytes(), &e)));
    }

    #[test]
    fn rdzv_conf_round_trips(
        conf in prop::collection::btree_map("[a-z_]{1,8}", "[a-zA-Z0-9=:. _-]{0,8}", 0..5),
    ) {
        let text: Vec<String> = conf.iter().map(|(k, v)| format!(" {k} ={v}")).collect();
        let parsed = parse_rdzv_conf(&text.join(",")).unwrap();
        let expected: BTreeMap<String, String> = conf.into_iter().collect();
        prop_assert_eq!(parsed, expected);
    }

    #[test]
    fn endpoints_round_trip(
        list in prop::collection::vec((host(), prop::option::of(1u16..)), 1..4),
    ) {
        let text: Vec<String> = list
            .iter()
            .map(|(h, p)| p.map_or_else(|| h.clone(), |p| format!("{h}:{p}")))
            .collect();
        let expected: Vec<String> = list
            .iter()
            .map(|(h, p)| format!("{h}:{}", p.unwrap_or(DEFAULT_PORT)))
            .collect();
        prop_assert_eq!(crate::rdzv::endpoints(&text.join(", "), DEFAULT_PORT).unwrap(), expected);
    }
}

#[test]
fn the_text_corpora_parse_or_are_refused() {
    for target in ["hostlist", "rdzv_conf", "endpoint", "flags"] {
        for (name, bytes) in corpus(target) {
            eprintln!("{target}/{name}");
            checks::text(&String::from_utf8_lossy(&bytes));
        }
    }
}
