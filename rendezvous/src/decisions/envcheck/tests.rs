//! Tests of the environment check on synthetic fingerprints.

use super::*;

fn fp(pairs: &[(&str, &str)]) -> Fingerprint {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn base() -> Fingerprint {
    fp(&[
        ("drun", "0.1.0"),
        ("config.nnodes", "3:3"),
        ("config.script-sha256", "abc"),
        ("torch", "2.4.0"),
        ("fingerprint-cmd", "sha256:img1"),
    ])
}

fn with(mut f: Fingerprint, k: &str, v: &str) -> Fingerprint {
    f.insert(k.into(), v.into());
    f
}

fn reports<'a>(nodes: &'a [(&'a str, Fingerprint, Option<EnvCheck>)]) -> Vec<Report<'a>> {
    nodes
        .iter()
        .map(|(id, f, c)| Report {
            node_id: id,
            fingerprint: f,
            env_check: *c,
        })
        .collect()
}

const WARN: Option<EnvCheck> = Some(EnvCheck::Warn);
const STRICT: Option<EnvCheck> = Some(EnvCheck::Strict);
const OFF: Option<EnvCheck> = Some(EnvCheck::Off);

#[test]
fn identical_members_are_consistent() {
    let nodes = [("a", base(), STRICT), ("b", base(), STRICT)];
    assert_eq!(verdict(&reports(&nodes)), Verdict::Consistent);
    // One node: nothing to compare.
    assert_eq!(verdict(&reports(&nodes[..1])), Verdict::Consistent);
}

#[test]
fn differences_list_each_value_with_its_nodes() {
    let nodes = [
        ("a", base(), WARN),
        ("b", with(base(), "fingerprint-cmd", "sha256:img2"), WARN),
        ("c", with(base(), "torch", "2.3.1"), WARN),
    ];
    let d = differences(&reports(&nodes));
    assert_eq!(
        d,
        [
            Difference {
                key: "fingerprint-cmd".into(),
                values: vec![
                    ("sha256:img1".into(), vec!["a".into(), "c".into()]),
                    ("sha256:img2".into(), vec!["b".into()]),
                ],
            },
            Difference {
                key: "torch".into(),
                values: vec![
                    ("2.3.1".into(), vec!["c".into()]),
                    ("2.4.0".into(), vec!["a".into(), "b".into()]),
                ],
            },
        ]
    );
}

#[test]
fn a_key_one_node_lacks_differs_as_unset() {
    let mut no_env = base();
    no_env.remove("torch");
    let nodes = [("a", base(), WARN), ("b", no_env, WARN)];
    let d = differences(&reports(&nodes));
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].values[0], ("(unset)".into(), vec!["b".into()]));
}

#[test]
fn warn_prints_one_table_of_the_differing_keys() {
    let nodes = [
        ("a", base(), WARN),
        ("b", with(base(), "fingerprint-cmd", "sha256:img2"), None),
        ("c", with(base(), "torch", "2.3.1"), WARN),
    ];
    let Verdict::Warn(t) = verdict(&reports(&nodes)) else {
        panic!("expected a warning");
    };
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[0].contains("differ in 2 key(s)"), "{t}");
    assert_eq!(lines.len(), 6, "{t}");
    assert!(
        lines[2].contains("fingerprint-cmd") && lines[2].ends_with("a, c"),
        "{t}"
    );
    assert!(
        lines[3].contains("sha256:img2") && lines[3].ends_with(" b"),
        "{t}"
    );
    assert!(
        lines[5].contains("2.4.0") && lines[5].ends_with("a, b"),
        "{t}"
    );
    // Keys that agree are not listed.
    assert!(!t.contains("drun"), "{t}");
}

#[test]
fn the_strictest_setting_wins() {
    let odd = with(base(), "torch", "2.3.1");
    let nodes = [("a", base(), OFF), ("b", odd.clone(), STRICT)];
    let Verdict::Refuse(m) = verdict(&reports(&nodes)) else {
        panic!("strict on one node refuses");
    };
    assert!(is_refusal(&m), "{m}");
    assert!(m.contains("torch (2.3.1 on b; 2.4.0 on a)"), "{m}");
    let nodes = [("a", base(), OFF), ("b", odd.clone(), OFF)];
    assert_eq!(verdict(&reports(&nodes)), Verdict::Consistent);
    // Nobody said anything (older agents): warn.
    let nodes = [("a", base(), None), ("b", odd, None)];
    assert!(matches!(verdict(&reports(&nodes)), Verdict::Warn(_)));
    assert_eq!(effective(&[]), EnvCheck::Warn);
}

#[test]
fn a_breaking_config_difference_is_refused_even_with_off() {
    let nodes = [
        ("a", base(), OFF),
        ("b", with(base(), "config.nnodes", "2:3"), OFF),
        ("c", with(base(), "torch", "2.3.1"), OFF),
    ];
    let Verdict::Refuse(m) = verdict(&reports(&nodes)) else {
        panic!("different --nnodes must be refused");
    };
    assert!(is_refusal(&m));
    assert!(m.contains("config.nnodes (2:3 on b; 3:3 on a, c)"), "{m}");
    // Only the breaking keys are named.
    assert!(!m.contains("torch"), "{m}");
}

#[test]
fn members_without_a_fingerprint_are_left_out() {
    let empty = Fingerprint::new();
    let nodes = [
        ("a", base(), STRICT),
        ("old", empty, None),
        ("c", base(), None),
    ];
    assert_eq!(verdict(&reports(&nodes)), Verdict::Consistent);
}

#[test]
fn long_values_are_cut() {
    let long = "x".repeat(200);
    let nodes = [
        ("a", base(), WARN),
        ("b", with(base(), "torch", &long), WARN),
    ];
    let Verdict::Warn(t) = verdict(&reports(&nodes)) else {
        panic!();
    };
    assert!(t.contains('…') && !t.contains(&long), "{t}");
}

#[test]
fn settings_parse() {
    for c in [EnvCheck::Off, EnvCheck::Warn, EnvCheck::Strict] {
        assert_eq!(EnvCheck::parse(c.as_str()), Some(c));
    }
    assert_eq!(EnvCheck::parse("loud"), None);
    assert!(EnvCheck::Strict > EnvCheck::Warn && EnvCheck::Warn > EnvCheck::Off);
}

#[test]
fn a_large_groups_majority_is_counted_not_listed() {
    let mut nodes: Vec<(String, Fingerprint, Option<EnvCheck>)> = (0..20)
        .map(|i| (format!("n{i:02}"), base(), WARN))
        .collect();
    nodes[7].1 = with(base(), "torch", "2.3.1");
    let reports: Vec<Report<'_>> = nodes
        .iter()
        .map(|(id, f, c)| Report {
            node_id: id,
            fingerprint: f,
            env_check: *c,
        })
        .collect();
    let Verdict::Warn(t) = verdict(&reports) else {
        panic!();
    };
    assert!(t.contains("2.3.1  n07"), "{t}");
    assert!(
        t.contains("n00, n01, n02, n03, n04, n05, n06, n08 (+11 more)"),
        "{t}"
    );
}

#[test]
fn long_values_are_shown_where_they_differ() {
    let args = |out: &str| {
        format!(
            r#"["--step-sleep","0.05","--epochs","30","--out","/tmp/nu/{out}","--global-batch","96"]"#
        )
    };
    let d = Difference {
        key: "config.args".into(),
        values: vec![
            (args("out1"), vec!["a".into()]),
            (args("out2"), vec!["b".into()]),
        ],
    };
    let w = table(&[&d]);
    assert!(
        w.contains("/tmp/nu/out1") && w.contains("/tmp/nu/out2"),
        "{w}"
    );
    for line in w.lines().skip(2) {
        assert!(line.chars().count() < 60 + 30, "{line}");
    }
    // A short value is shown whole; a long one differing early is cut at its end.
    assert_eq!(cut_from("short", 0), "short");
    let long = "x".repeat(100);
    let c = cut_from(&long, 3);
    assert!(
        c.starts_with("xxx") && c.ends_with('…') && c.chars().count() == 60,
        "{c}"
    );
}
