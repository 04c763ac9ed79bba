//! The recovery benchmark's table: cells of samples, medians, ratios drun/torchrun.

use std::time::Duration;

use super::Launcher;

/// The unit a row is measured in.
#[derive(Clone, Copy)]
pub(super) enum Unit {
    Seconds,
    Mib,
    CpuSeconds,
}

pub(super) fn fmt(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Mib => format!("{v:.1} MiB"),
        // /proc counts CPU time in 10 ms ticks.
        Unit::CpuSeconds if v < 0.01 => "< 10 ms".into(),
        Unit::CpuSeconds if v < 1.0 => format!("{:.0} ms", v * 1e3),
        Unit::Seconds | Unit::CpuSeconds => {
            if v >= 10.0 {
                format!("{v:.1} s")
            } else if v >= 1.0 {
                format!("{v:.2} s")
            } else if v >= 0.01 {
                format!("{:.0} ms", v * 1e3)
            } else {
                format!("{:.1} ms", v * 1e3)
            }
        }
    }
}

/// One launcher's samples of one row; `f64::INFINITY` is a run that did not recover.
#[derive(Default)]
pub(super) struct Cell {
    pub(super) values: Vec<f64>,
    pub(super) setup_failed: usize,
    /// Why it was not measured at all.
    pub(super) absent: Option<String>,
    /// Said after the numbers (e.g. how many runs re-formed).
    pub(super) note: Option<String>,
}

impl Cell {
    pub(super) fn absent(why: &str) -> Cell {
        Cell {
            absent: Some(why.into()),
            ..Cell::default()
        }
    }

    pub(super) fn gave_up(&self) -> bool {
        self.values.iter().any(|v| v.is_infinite())
    }

    pub(super) fn median(&self) -> Option<f64> {
        let mut v = self.values.clone();
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[v.len() / 2])
    }

    pub(super) fn show(&self, unit: Unit, bound: Duration, runs: usize) -> String {
        match &self.note {
            Some(note) => format!("{} ({note})", self.numbers(unit, bound, runs)),
            None => self.numbers(unit, bound, runs),
        }
    }

    fn numbers(&self, unit: Unit, bound: Duration, runs: usize) -> String {
        if let Some(why) = &self.absent {
            return why.clone();
        }
        let failed = if self.setup_failed > 0 {
            format!(" ({} runs failed to start)", self.setup_failed)
        } else {
            String::new()
        };
        let Some(med) = self.median() else {
            return format!("no sample{failed}");
        };
        let lost = self.values.iter().filter(|v| v.is_infinite()).count();
        let n = self.values.len();
        if med.is_infinite() {
            let not_repeated = if n < runs { "; not repeated" } else { "" };
            return format!(
                "did not recover in {} s ({lost}/{n} runs{not_repeated}){failed}",
                bound.as_secs()
            );
        }
        let lo = self.values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = self.values.iter().copied().fold(0.0, f64::max);
        let mut s = if n > 1 {
            format!("{} [{}–{}]", fmt(med, unit), fmt(lo, unit), fmt(hi, unit))
        } else {
            fmt(med, unit)
        };
        if hi.is_infinite() {
            s = format!(
                "{} [{}–∞] ({lost}/{n} did not recover in {} s)",
                fmt(med, unit),
                fmt(lo, unit),
                bound.as_secs()
            );
        }
        s + &failed
    }
}

pub(super) struct Row {
    pub(super) name: String,
    pub(super) unit: Unit,
    pub(super) drun: Cell,
    pub(super) torchrun: Cell,
}

impl Row {
    pub(super) fn new(name: impl Into<String>, unit: Unit) -> Row {
        Row {
            name: name.into(),
            unit,
            drun: Cell::default(),
            torchrun: Cell::default(),
        }
    }

    pub(super) fn cell(&mut self, l: Launcher) -> &mut Cell {
        match l {
            Launcher::Drun => &mut self.drun,
            Launcher::Torchrun => &mut self.torchrun,
        }
    }

    pub(super) fn ratio(&self, bound: Duration) -> String {
        match (self.drun.median(), self.torchrun.median()) {
            (Some(_), Some(t)) if matches!(self.unit, Unit::CpuSeconds) && t < 0.01 => "—".into(),
            (Some(d), Some(t)) if matches!(self.unit, Unit::CpuSeconds) && d < 0.01 => {
                format!("< {:.3}", 0.01 / t)
            }
            (Some(d), Some(t)) if d.is_finite() && t.is_finite() => format!("{:.3}", d / t),
            (Some(d), Some(_)) if d.is_finite() => {
                format!("< {:.3}", d / bound.as_secs_f64())
            }
            _ => "—".into(),
        }
    }
}
