//! The preflight report as printed: one table (node rank 0's agent) and one summary line (every
//! other agent).

use super::{slow_nodes, within, Report, Slow};

/// The table: a heading with the check's total time, the `all_reduce` line, then one row per
/// link with its bandwidth and latency, slow links marked with the reason.
pub fn lines(r: &Report, slow: &[Slow]) -> Vec<String> {
    let ar = &r.all_reduce;
    let mut out = vec![
        format!(
            "preflight: {} ranks on {} node{} ({}) in {:.2} s, {:.2} s of it measuring",
            r.world_size,
            r.nodes,
            if r.nodes == 1 { "" } else { "s" },
            r.backend,
            r.seconds,
            r.measure_seconds
        ),
        format!(
            "  all_reduce of {} over all ranks: bus bandwidth {:.2} Gbit/s (algorithm {:.2} \
             Gbit/s), {:.1} ms",
            bytes(ar.bytes),
            ar.busbw_gbps,
            ar.algbw_gbps,
            ar.seconds * 1e3
        ),
    ];
    out.extend(within::lines(&r.within, &within::judge(&r.within)));
    if r.links.is_empty() {
        out.push("  links: one node, none to test".into());
        return out;
    }
    let names: Vec<(String, String)> = r
        .links
        .iter()
        .map(|l| {
            (
                format!("node {} → {}", l.src, l.dst),
                format!("{} → {}", l.src_host, l.dst_host),
            )
        })
        .collect();
    let w0 = names
        .iter()
        .map(|n| n.0.chars().count())
        .max()
        .unwrap_or(0)
        .max(4);
    let w1 = names
        .iter()
        .map(|n| n.1.chars().count())
        .max()
        .unwrap_or(0)
        .max(5);
    out.push(format!(
        "  {:w0$}  {:w1$}  {:>14}  {:>10}",
        "link", "hosts", "bandwidth", "latency"
    ));
    for ((l, (link, hosts)), why) in r.links.iter().zip(&names).zip(slow) {
        let bw = format!("{:.2} Gbit/s", l.gbps);
        let lat = format!("{:.0} µs", l.latency_us);
        let mut row = format!("  {link:w0$}  {hosts:w1$}  {bw:>14}  {lat:>10}");
        if let Some(why) = why {
            row.push_str(&format!(
                "  SLOW: {why}; moved {} in {:.2} s",
                bytes(l.bytes),
                l.seconds
            ));
        }
        out.push(row);
    }
    for n in slow_nodes(&r.links) {
        out.push(format!(
            "  SLOW NODE: node {} ({}): in {:.2} and out {:.2} Gbit/s, the links between the other \
             nodes {:.2}: check its NIC, cable and load",
            n.node, n.host, n.gbps_in, n.gbps_out, n.others
        ));
    }
    out
}

/// A byte count in KiB below a MiB, else in MiB.
fn bytes(n: u64) -> String {
    if n < 1 << 20 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{:.1} MiB", n as f64 / f64::from(1u32 << 20))
    }
}

/// One line for the agents that do not print the table.
pub fn summary(r: &Report, slow: &[Slow]) -> String {
    let named: Vec<String> = r
        .links
        .iter()
        .zip(slow)
        .filter(|(_, s)| s.is_some())
        .map(|(l, _)| format!("node {} → {}", l.src, l.dst))
        .collect();
    let mut nodes: Vec<String> = slow_nodes(&r.links)
        .into_iter()
        .map(|n| format!("; slow node: node {} ({})", n.node, n.host))
        .collect();
    for (w, why) in r.within.iter().zip(within::judge(&r.within)) {
        if why.is_some() {
            nodes.push(format!("; slow within node: node {} ({})", w.node, w.host));
        }
    }
    format!(
        "preflight: all_reduce bus bandwidth {:.2} Gbit/s, {} link{} measured, {}{} (table on \
         node rank 0) in {:.2} s",
        r.all_reduce.busbw_gbps,
        r.links.len(),
        if r.links.len() == 1 { "" } else { "s" },
        if named.is_empty() {
            "none slow".to_string()
        } else {
            format!("slow: {}", named.join(", "))
        },
        nodes.concat(),
        r.seconds
    )
}
