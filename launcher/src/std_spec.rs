//! `--redirects` / `--tee` values: which worker streams go to files (torchrun's `Std`).
//!
//! Format per `torch/distributed/elastic/multiprocessing/api.py` (`Std.from_str`): `0` none,
//! `1` stdout, `2` stderr, `3` both, applied to every local rank; or a map `LR:V,LR:V` where
//! local ranks missing from the map get `0`. torchrun's map regex only accepts single-digit local
//! ranks; drun accepts any non-negative integer (a superset).

use std::collections::HashMap;

use crate::ConfigError;

/// Which streams of one worker are selected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Std {
    /// stdout selected.
    pub out: bool,
    /// stderr selected.
    pub err: bool,
}

impl Std {
    fn from_digit(d: u32) -> Option<Self> {
        (d <= 3).then_some(Std {
            out: d & 1 != 0,
            err: d & 2 != 0,
        })
    }
}

/// A parsed `--redirects`/`--tee` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StdSpec {
    /// The same for every local rank.
    All(Std),
    /// Per local rank; absent ranks select nothing.
    PerRank(HashMap<u32, Std>),
}

impl StdSpec {
    /// Parses `value` for flag `flag` (used in the error message).
    pub fn parse(flag: &'static str, value: &str) -> Result<Self, ConfigError> {
        let bad = |why: &str| ConfigError::Invalid {
            flag,
            value: value.to_string(),
            why: why.to_string(),
        };
        let v = value.trim();
        if let Ok(d) = v.parse::<u32>() {
            return Std::from_digit(d).map(StdSpec::All).ok_or_else(|| {
                bad("use 0 (none), 1 (stdout), 2 (stderr), 3 (both) or LOCAL_RANK:N,...")
            });
        }
        let mut map = HashMap::new();
        for part in v.split(',') {
            let (lr, d) = part
                .split_once(':')
                .ok_or_else(|| bad("expected 0-3 or a map like 0:1,1:2"))?;
            let lr = lr
                .trim()
                .parse::<u32>()
                .map_err(|_| bad("local rank must be an integer"))?;
            let d = d
                .trim()
                .parse::<u32>()
                .ok()
                .and_then(Std::from_digit)
                .ok_or_else(|| bad("stream selector must be 0, 1, 2 or 3"))?;
            map.insert(lr, d);
        }
        Ok(StdSpec::PerRank(map))
    }

    /// Selection for `local_rank`.
    pub fn for_rank(&self, local_rank: u32) -> Std {
        match self {
            StdSpec::All(s) => *s,
            StdSpec::PerRank(m) => m.get(&local_rank).copied().unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_torchrun_forms() {
        assert_eq!(
            StdSpec::parse("--tee", "3").unwrap().for_rank(5),
            Std {
                out: true,
                err: true
            }
        );
        let m = StdSpec::parse("--redirects", "0:1,1:2").unwrap();
        assert_eq!(
            m.for_rank(0),
            Std {
                out: true,
                err: false
            }
        );
        assert_eq!(
            m.for_rank(1),
            Std {
                out: false,
                err: true
            }
        );
        assert_eq!(m.for_rank(2), Std::default());
        assert!(StdSpec::parse("--tee", "4").is_err());
        assert!(StdSpec::parse("--tee", "0:9").is_err());
        assert!(StdSpec::parse("--tee", "x").is_err());
    }
}
