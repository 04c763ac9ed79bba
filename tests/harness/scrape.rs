//! Scraping `/metrics` in tests: a plain HTTP/1.0 GET over a `TcpStream`, and a parser of the
//! OpenMetrics text format (samples only: name, labels, value).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// `GET path` from `addr` (`HOST:PORT`): the status line's code and the body; `None` when the
/// endpoint cannot be reached (not up yet, or gone).
pub fn get(addr: &str, path: &str) -> Option<(u16, String, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, head.to_string(), body.to_string()))
}

/// One sample: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// The samples of an OpenMetrics text (comments skipped). Panics on a malformed line: the
/// encoder under test must produce none.
pub fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (
                n,
                labels(rest.strip_suffix('}').expect("labels end with }")),
            ),
            None => (series, BTreeMap::new()),
        };
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    out
}

fn labels(s: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let mut rest = s;
    while let Some((k, v)) = rest.split_once("=\"") {
        let end = v.find('"').expect("a label value ends with \"");
        m.insert(k.trim_start_matches(',').to_string(), v[..end].to_string());
        rest = &v[end + 1..];
    }
    m
}

/// The value of the sample `name` whose labels include `want`, if present.
pub fn value(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && want
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}

/// Scrapes `http://addr/metrics`: the parsed samples, `None` if unreachable or not 200.
pub fn scrape(addr: &str) -> Option<Vec<Sample>> {
    match get(addr, "/metrics")? {
        (200, _, body) => Some(parse(&body)),
        _ => None,
    }
}

/// The `HOST:PORT` a `... metrics at http://HOST:PORT/metrics` line names, as `127.0.0.1:PORT`.
pub fn announced(output: &str) -> Option<String> {
    let line = output.lines().find(|l| l.contains("metrics at http://"))?;
    let url = line.split("http://").nth(1)?;
    let port = url.split('/').next()?.rsplit(':').next()?;
    Some(format!("127.0.0.1:{port}"))
}

#[test]
fn metrics_text_parses_samples_with_labels() {
    let s = parse("# TYPE a counter\na_total{x=\"1\",y=\"\"} 2\nb 0.5\n# EOF\n");
    assert_eq!(value(&s, "a_total", &[("x", "1"), ("y", "")]), Some(2.0));
    assert_eq!(value(&s, "b", &[]), Some(0.5));
    assert_eq!(
        announced("x\ndrun: metrics at http://host.example:4321/metrics\n").as_deref(),
        Some("127.0.0.1:4321")
    );
}
