//! `--preflight` on a bed where one host's links are slowed to 20 Mbit/s among fast ones.

use super::*;

/// Three hosts (1 torch worker each) whose `n2` sends and receives at 20 Mbit/s (token buckets)
/// beside ~10 Gbit/s veth links: `--preflight` names n2's two ring links slow, and only those,
/// from what they moved in their slots, names n2 the slow node (in a ring of 3 its two links
/// are the median, so only the links between the other nodes tell), and measures for at most
/// 5 s (before the time slots it took 39 s here: its time grew with the slowest link). One slow
/// link alone is named by `preflight::a_slowed_link_is_named_in_the_table`.
#[test]
fn preflight_names_a_host_slowed_to_20_mbit_among_fast_ones_within_five_seconds() {
    let Some(Stage {
        python,
        bed,
        server,
        out,
        dir: _dir,
    }) = stage()
    else {
        return;
    };
    bed.limit_rate("n2", "20mbit");
    bed.limit_receive_rate("n2", "20mbit");
    let agents = trainers(
        &bed,
        &["n0", "n1", "n2"],
        &server,
        &python,
        ("slowlink", "3"),
        |c| {
            c.arg("--preflight")
                .arg(worker("steps.py"))
                .arg(&out)
                .arg("3");
        },
    );
    let mut table = String::new();
    for a in agents {
        let (code, _, err) = a.wait(Duration::from_secs(180));
        assert_eq!(code, 0, "{err}");
        if err.contains("  link  ") {
            table = err;
        }
    }
    let rows: Vec<&str> = table.lines().filter(|l| l.contains(" Gbit/s ")).collect();
    let links: Vec<&&str> = rows.iter().filter(|l| l.contains("node ")).collect();
    assert_eq!(links.len(), 3, "three ring links:\n{table}");
    for l in links {
        let through_n2 = l.contains("n2 → ") || l.contains("→ n2");
        assert_eq!(
            l.contains("SLOW: "),
            through_n2,
            "only n2's links are slow:\n{table}"
        );
    }
    let node_line = table
        .lines()
        .find(|l| l.contains("SLOW NODE: "))
        .unwrap_or_else(|| panic!("no slow node named:\n{table}"));
    assert!(node_line.contains("(n2)"), "{node_line}");
    let heading = table
        .lines()
        .find(|l| l.contains("preflight: 3 ranks on 3 nodes (gloo) in "))
        .unwrap_or_else(|| panic!("no heading:\n{table}"));
    let measuring: f64 = heading
        .rsplit(", ")
        .next()
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no measuring time in {heading:?}"));
    assert!(measuring <= 5.0, "{heading}");
    eprintln!("{heading}\n{}", rows.join("\n"));
}
