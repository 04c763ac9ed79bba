//! Slurm hostlists (`SLURM_JOB_NODELIST`): `n[1-3,7],gpu-a[01-02]` expanded into host names,
//! within bounds on the names and bytes produced.

/// A hostlist that does not parse, or expands past the bounds ([`parse_hostlist`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    /// A `[` without `]` or the reverse.
    #[error("unbalanced brackets")]
    Unbalanced,
    /// A bracket inside a bracket, or a `]` before its `[`.
    #[error("unbalanced or nested brackets")]
    Nested,
    /// An empty item (`a,,b`).
    #[error("empty host name")]
    EmptyName,
    /// A bracket part that is neither a number nor a `lo-hi` range.
    #[error("'{0}' is not a number or range")]
    NotARange(String),
    /// A range whose end is below its start.
    #[error("range '{0}' ends before it starts")]
    Backwards(String),
    /// A range of more than a million numbers.
    #[error("range '{0}' is too large")]
    RangeTooLarge(String),
    /// A number padded wider than [`MAX_WIDTH`] digits.
    #[error("'{0}' is padded wider than {MAX_WIDTH} digits")]
    TooWide(String),
    /// More than [`MAX_HOSTS`] names or [`MAX_HOSTLIST_BYTES`] bytes.
    #[error("expands to more than {MAX_HOSTS} host names or {MAX_HOSTLIST_BYTES} bytes")]
    TooLarge,
}

/// Expands a Slurm hostlist (`n[1-3,7],gpu-a[01-02],login`) into host names, in order.
///
/// Follows Slurm's `hostlist_create` syntax: comma-separated items; in an item each bracket group
/// is a comma-separated list of numbers and `lo-hi` ranges whose zero padding (the width of `lo`)
/// is kept; several groups in one item multiply (`r[1-2]n[1-2]` → r1n1, r1n2, r2n1, r2n2).
///
/// # Errors
/// Unbalanced brackets, an empty item or range, a range whose end is below its start, a
/// number padded wider than [`MAX_WIDTH`] digits, a list that expands to more than
/// [`MAX_HOSTS`] names or [`MAX_HOSTLIST_BYTES`] bytes of names.
pub fn parse_hostlist(list: &str) -> Result<Vec<String>, HostlistError> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(HostlistError::Nested);
        }
    }
    if depth != 0 {
        return Err(HostlistError::Unbalanced);
    }
    items.push(&list[start..]);
    let mut hosts = Vec::new();
    let mut budget = Budget {
        hosts: MAX_HOSTS,
        bytes: MAX_HOSTLIST_BYTES,
    };
    for item in items {
        let item = item.trim();
        if item.is_empty() {
            return Err(HostlistError::EmptyName);
        }
        let expanded = expand(item, &mut budget)?;
        budget.spend(&expanded)?;
        hosts.extend(expanded);
    }
    Ok(hosts)
}

/// Most host names a hostlist may expand to (Slurm's own clusters stay far below).
pub const MAX_HOSTS: usize = 1_000_000;

/// Most bytes of host names a hostlist may expand to: 64 MiB (`n[0-999999]` is 6.9 MB).
pub const MAX_HOSTLIST_BYTES: usize = 64 << 20;

/// Widest zero padding of a hostlist number accepted (a `u64` has at most 20 digits).
pub const MAX_WIDTH: usize = 64;

/// What an expansion may still produce: several bracket groups multiply
/// (`a[0-999999]b[0-999999]` is 10¹² names) and a long prefix or zero padding multiplies the
/// bytes, so the product is bounded, not only each range.
struct Budget {
    hosts: usize,
    bytes: usize,
}

impl Budget {
    /// Takes `names` out of the budget, or says the list is too large.
    fn spend(&mut self, names: &[String]) -> Result<(), HostlistError> {
        self.check(names.len(), names.iter().map(String::len).sum())?;
        self.hosts -= names.len();
        self.bytes -= names.iter().map(String::len).sum::<usize>();
        Ok(())
    }

    /// Whether `hosts` more names of `bytes` bytes in all still fit.
    fn check(&self, hosts: usize, bytes: usize) -> Result<(), HostlistError> {
        if hosts > self.hosts || bytes > self.bytes {
            return Err(HostlistError::TooLarge);
        }
        Ok(())
    }
}

fn expand(item: &str, budget: &mut Budget) -> Result<Vec<String>, HostlistError> {
    let Some(open) = item.find('[') else {
        return Ok(vec![item.to_string()]);
    };
    let close = item[open..]
        .find(']')
        .map(|c| open + c)
        .ok_or(HostlistError::Unbalanced)?;
    let (prefix, body, rest) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
    let tails = expand(rest, budget)?;
    let tail_bytes: usize = tails.iter().map(String::len).sum();
    let mut out = Vec::new();
    let mut out_bytes = 0usize;
    for part in body.split(',') {
        let part = part.trim();
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let width = lo.len();
        let parse = |s: &str| {
            s.parse::<u64>()
                .map_err(|_| HostlistError::NotARange(part.to_string()))
        };
        let (a, b) = (parse(lo)?, parse(hi)?);
        if b < a {
            return Err(HostlistError::Backwards(part.to_string()));
        }
        if b - a > 1_000_000 {
            return Err(HostlistError::RangeTooLarge(part.to_string()));
        }
        if width > MAX_WIDTH {
            // Formatting panics past u16::MAX digits of padding; no host name needs more than 20.
            return Err(HostlistError::TooWide(part.to_string()));
        }
        for n in a..=b {
            let digits = n.checked_ilog10().map_or(1, |d| d as usize + 1);
            let name_bytes = prefix.len() + width.max(digits);
            out_bytes += name_bytes * tails.len() + tail_bytes;
            budget.check(out.len() + tails.len(), out_bytes)?;
            for t in &tails {
                out.push(format!("{prefix}{n:0width$}{t}"));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostlists_expand_like_scontrol_show_hostnames() {
        let h = |s: &str| parse_hostlist(s).unwrap();
        assert_eq!(h("n1"), ["n1"]);
        assert_eq!(h("n[1-3]"), ["n1", "n2", "n3"]);
        assert_eq!(h("n[1-2,7]"), ["n1", "n2", "n7"]);
        assert_eq!(h("gpu-a[01-03]"), ["gpu-a01", "gpu-a02", "gpu-a03"]);
        assert_eq!(h("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(
            h("n[0-999999]").len(),
            1_000_000,
            "the largest range still expands"
        );
        assert_eq!(
            h("n[1-2,7],gpu-a[01-02],login"),
            ["n1", "n2", "n7", "gpu-a01", "gpu-a02", "login"]
        );
        assert_eq!(h("r[1-2]n[1-2]"), ["r1n1", "r1n2", "r2n1", "r2n2"]);
        assert_eq!(h("a,b, c"), ["a", "b", "c"]);
        assert_eq!(h("node[5]-ib"), ["node5-ib"]);
        for bad in ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "a,,b", "n[[1]]"] {
            assert!(parse_hostlist(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hostlist_bombs_are_refused_not_expanded() {
        // Each range is within bounds; their product (10^12 names), a 100-byte prefix times a
        // million, or a million-name list repeated, is not.
        let long = format!("{}[0-999999]", "p".repeat(100));
        let twice = ["n[0-999999]"; 2].join(",");
        for bomb in ["a[0-999999]b[0-999999]", &long, &twice] {
            let e = parse_hostlist(bomb).unwrap_err().to_string();
            assert!(e.contains("expands to more than"), "{e}");
        }
        // Zero padding past u16::MAX digits made the formatter panic (found by the fuzz corpus).
        let wide = format!("n[{}1]", "0".repeat(70_000));
        assert!(parse_hostlist(&wide)
            .unwrap_err()
            .to_string()
            .contains("padded wider"));
        assert_eq!(
            parse_hostlist(&format!("n[{}1]", "0".repeat(63))).unwrap()[0].len(),
            65
        );
    }
}
