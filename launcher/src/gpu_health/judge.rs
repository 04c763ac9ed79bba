//! Whether this node's GPUs may train (pure): the GPUs the workers would see, judged from one
//! probe's readings, lost GPUs and recent Xids, with one reason per GPU that may not.

use std::time::Duration;

use super::read::{Lost, Reading, Xid};

/// NVML's clock throttle reasons that mean the hardware holds the clocks back (not the power
/// cap a busy GPU reaches, nor an idle GPU's low clocks).
const HW_SLOWDOWN: u64 = 0x8;
const SW_THERMAL_SLOWDOWN: u64 = 0x20;
const HW_THERMAL_SLOWDOWN: u64 = 0x40;
const HW_POWER_BRAKE_SLOWDOWN: u64 = 0x80;

/// Xids that mean the GPU, its memory or its links failed (NVIDIA's Xid catalogue), not the
/// application (13, 31, 43, 45 and 94 are an application's faults and are not held against the
/// node): 48 double-bit ECC, 61/62 internal micro-controller, 63/64 row remapping, 74 NVLink,
/// 79 fallen off the bus, 92 high single-bit ECC rate, 95 uncontained ECC, 119/120 GSP, 140
/// unrecovered ECC.
pub const NODE_XIDS: &[u32] = &[48, 61, 62, 63, 64, 74, 79, 92, 95, 119, 120, 140];

/// The rules' numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    /// A GPU with more than this share of its memory in use before the node's workers start
    /// holds another process's memory (a leftover of an earlier job).
    pub max_used_share: f64,
    /// ... unless that is less than this many MiB (the driver's own reservation).
    pub used_floor_mib: u64,
    /// An Xid of [`NODE_XIDS`] this recent (before the probe) keeps the GPU out.
    pub xid_window: Duration,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            max_used_share: 0.05,
            used_floor_mib: 1024,
            xid_window: Duration::from_secs(600),
        }
    }
}

/// One probe of the node: what it read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Probe {
    /// The rows `nvidia-smi` answered.
    pub readings: Vec<Reading>,
    /// The GPUs it could not reach.
    pub lost: Vec<Lost>,
    /// The kernel log's Xids (empty when it cannot be read).
    pub xids: Vec<Xid>,
    /// Seconds since boot at the probe (to tell recent Xids), when known.
    pub uptime: Option<f64>,
    /// Why `nvidia-smi` gave nothing usable (did not start, timed out, failed with no rows),
    /// when it did not.
    pub failed: Option<String>,
    /// The node's own workers ran during the probe: the memory in use is theirs, not held
    /// against the GPU.
    pub workers_running: bool,
}

/// A GPU that may not train, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// "GPU 1 (0000:3b:00.0)".
    pub gpu: String,
    /// "2 uncorrectable ECC errors".
    pub reason: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.gpu, self.reason)
    }
}

/// What a probe came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every visible GPU may train.
    Healthy {
        /// How many were judged.
        gpus: usize,
    },
    /// These may not.
    Unhealthy(Vec<Finding>),
    /// The check could not be made (the tool failed): training is not held back for it.
    Unknown(String),
}

/// Judges the GPUs of `probe` that `CUDA_VISIBLE_DEVICES` (`visible`, as the workers get it)
/// shows the workers; `expected` is how many the node asked for (`--nproc-per-node gpu`: the
/// count seen at start), when it asked for GPUs by count.
pub fn judge(
    probe: &Probe,
    visible: Option<&str>,
    expected: Option<usize>,
    rules: &Rules,
) -> Verdict {
    if probe.readings.is_empty() && probe.lost.is_empty() {
        return Verdict::Unknown(
            probe
                .failed
                .clone()
                .unwrap_or_else(|| "nvidia-smi listed no GPU".to_string()),
        );
    }
    // The answering GPUs in index (PCI) order, as CUDA_VISIBLE_DEVICES counts them.
    let all: Vec<(String, Option<String>)> = probe
        .readings
        .iter()
        .map(|r| (r.bus_id.clone(), Some(r.uuid.clone())))
        .collect();
    let mut findings = Vec::new();
    let shown: Vec<String> = match crate::numa::topology::visible(&all, visible) {
        Ok(v) => v,
        Err(e) => return Verdict::Unknown(e.to_string()),
    };
    for l in &probe.lost {
        // A lost GPU is named whether or not it is visible: its index is unknown, so the
        // visible list cannot say.
        findings.push(Finding {
            gpu: l
                .bus_id
                .as_ref()
                .map_or("a GPU".to_string(), |b| format!("GPU {b}")),
            reason: "nvidia-smi cannot reach it (fallen off the bus or wedged)".to_string(),
        });
    }
    for r in probe.readings.iter().filter(|r| shown.contains(&r.bus_id)) {
        let reasons = reasons(r, probe, rules);
        if !reasons.is_empty() {
            findings.push(Finding {
                gpu: format!("GPU {} ({})", r.index, r.bus_id),
                reason: reasons.join(", "),
            });
        }
    }
    let answering = shown.len();
    if let Some(n) = expected {
        if answering < n && probe.lost.is_empty() {
            findings.push(Finding {
                gpu: "this node".to_string(),
                reason: format!("{answering} GPU(s) visible, {n} asked for"),
            });
        }
    }
    if findings.is_empty() {
        Verdict::Healthy { gpus: answering }
    } else {
        Verdict::Unhealthy(findings)
    }
}

/// Why one answering GPU may not train (empty: it may).
fn reasons(r: &Reading, probe: &Probe, rules: &Rules) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(n) = r.ecc_uncorrected.filter(|n| *n > 0) {
        out.push(format!(
            "{n} uncorrectable ECC error(s) since the driver loaded"
        ));
    }
    if let (Some(used), Some(total), false) =
        (r.memory_used_mib, r.memory_total_mib, probe.workers_running)
    {
        if used > rules.used_floor_mib && used as f64 > rules.max_used_share * total as f64 {
            out.push(format!(
                "{used} MiB of {total} MiB in use by another process before the workers start"
            ));
        }
    }
    if let Some(t) = r.throttle {
        let held: Vec<&str> = [
            (HW_SLOWDOWN, "hardware slowdown"),
            (HW_THERMAL_SLOWDOWN, "hardware thermal slowdown"),
            (SW_THERMAL_SLOWDOWN, "thermal slowdown"),
            (HW_POWER_BRAKE_SLOWDOWN, "power brake"),
        ]
        .iter()
        .filter(|(bit, _)| t & bit != 0)
        .map(|(_, name)| *name)
        .collect();
        if !held.is_empty() {
            out.push(format!("clocks held back ({})", held.join(", ")));
        }
    }
    if let Some(now) = probe.uptime {
        let window = rules.xid_window.as_secs_f64();
        let mut codes: Vec<u32> = Vec::new();
        for x in probe
            .xids
            .iter()
            .filter(|x| x.bus_id == r.bus_id && NODE_XIDS.contains(&x.code))
            .filter(|x| x.at <= now && now - x.at <= window)
        {
            if !codes.contains(&x.code) {
                codes.push(x.code);
            }
        }
        if !codes.is_empty() {
            let list: Vec<String> = codes.iter().map(u32::to_string).collect();
            out.push(format!(
                "Xid {} in the kernel log in the last {}",
                list.join(", "),
                drun_rendezvous::human::duration(rules.xid_window)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, bus: &str) -> Reading {
        Reading {
            index,
            bus_id: bus.to_string(),
            uuid: format!("GPU-{index}aaa"),
            name: "NVIDIA H200".to_string(),
            memory_used_mib: Some(1),
            memory_total_mib: Some(143_771),
            ecc_uncorrected: Some(0),
            throttle: Some(0x1),
        }
    }

    fn probe(readings: Vec<Reading>) -> Probe {
        Probe {
            readings,
            uptime: Some(10_000.0),
            ..Probe::default()
        }
    }

    fn two() -> Vec<Reading> {
        vec![gpu(0, "0000:18:00.0"), gpu(1, "0000:3b:00.0")]
    }

    fn findings(v: Verdict) -> Vec<String> {
        match v {
            Verdict::Unhealthy(f) => f.iter().map(ToString::to_string).collect(),
            other => panic!("expected unhealthy, got {other:?}"),
        }
    }

    #[test]
    fn idle_gpus_are_healthy() {
        let v = judge(&probe(two()), None, Some(2), &Rules::default());
        assert_eq!(v, Verdict::Healthy { gpus: 2 });
    }

    #[test]
    fn an_uncorrectable_ecc_error_keeps_that_gpu_out_and_names_it() {
        let mut g = two();
        g[1].ecc_uncorrected = Some(2);
        let f = findings(judge(&probe(g), None, None, &Rules::default()));
        assert_eq!(
            f,
            ["GPU 1 (0000:3b:00.0): 2 uncorrectable ECC error(s) since the driver loaded"]
        );
    }

    #[test]
    fn only_the_gpus_the_workers_see_are_judged() {
        let mut g = two();
        g[1].ecc_uncorrected = Some(2);
        let v = judge(&probe(g.clone()), Some("0"), None, &Rules::default());
        assert_eq!(v, Verdict::Healthy { gpus: 1 });
        let v = judge(&probe(g), Some("GPU-1a"), None, &Rules::default());
        assert!(matches!(v, Verdict::Unhealthy(_)));
    }

    #[test]
    fn memory_held_by_another_process_is_named_above_the_floor_only() {
        let mut g = two();
        g[0].memory_used_mib = Some(900); // under the driver floor
        g[1].memory_used_mib = Some(20_000);
        let f = findings(judge(&probe(g), None, None, &Rules::default()));
        assert_eq!(f.len(), 1);
        assert!(
            f[0].starts_with("GPU 1 (0000:3b:00.0): 20000 MiB of 143771 MiB in use"),
            "{f:?}"
        );
    }

    #[test]
    fn the_nodes_own_workers_memory_is_not_held_against_the_gpu() {
        let mut g = two();
        g[1].memory_used_mib = Some(70_000);
        let mut p = probe(g);
        assert!(matches!(
            judge(&p, None, None, &Rules::default()),
            Verdict::Unhealthy(_)
        ));
        p.workers_running = true;
        assert_eq!(
            judge(&p, None, None, &Rules::default()),
            Verdict::Healthy { gpus: 2 }
        );
    }

    #[test]
    fn hardware_and_thermal_slowdowns_count_and_the_power_cap_does_not() {
        let mut g = two();
        g[0].throttle = Some(0x4); // SW power cap: a busy GPU's normal state
        g[1].throttle = Some(0x8 | 0x40);
        let f = findings(judge(&probe(g), None, None, &Rules::default()));
        assert_eq!(
            f,
            ["GPU 1 (0000:3b:00.0): clocks held back (hardware slowdown, hardware thermal slowdown)"]
        );
    }

    #[test]
    fn a_recent_hardware_xid_counts_and_an_old_or_application_one_does_not() {
        let xid = |code, at| Xid {
            bus_id: "0000:18:00.0".to_string(),
            code,
            at,
            text: String::new(),
        };
        let mut p = probe(two());
        p.xids = vec![xid(13, 9_990.0), xid(79, 1_000.0)];
        // (a repeated code is named once, wherever it repeats: below, 48 79 48)
        assert_eq!(
            judge(&p, None, None, &Rules::default()),
            Verdict::Healthy { gpus: 2 }
        );
        p.xids.push(xid(48, 9_700.0));
        let f = findings(judge(&p, None, None, &Rules::default()));
        assert_eq!(
            f,
            ["GPU 0 (0000:18:00.0): Xid 48 in the kernel log in the last 600 s"]
        );
        // Without the time since boot, no Xid can be called recent.
        p.uptime = None;
        assert_eq!(
            judge(&p, None, None, &Rules::default()),
            Verdict::Healthy { gpus: 2 }
        );
    }

    #[test]
    fn a_lost_gpu_is_named_and_a_missing_one_is_counted() {
        let mut p = probe(vec![gpu(0, "0000:18:00.0")]);
        p.lost = vec![Lost {
            bus_id: Some("0000:3b:00.0".to_string()),
            line: "Unable to determine the device handle for GPU 00000000:3B:00.0".to_string(),
        }];
        let f = findings(judge(&p, None, Some(2), &Rules::default()));
        assert_eq!(
            f,
            ["GPU 0000:3b:00.0: nvidia-smi cannot reach it (fallen off the bus or wedged)"]
        );
        p.lost.clear();
        let f = findings(judge(&p, None, Some(2), &Rules::default()));
        assert_eq!(f, ["this node: 1 GPU(s) visible, 2 asked for"]);
    }

    #[test]
    fn a_probe_that_read_nothing_is_unknown_not_unhealthy() {
        let p = Probe {
            failed: Some("nvidia-smi did not answer within 10 s".to_string()),
            ..Probe::default()
        };
        assert_eq!(
            judge(&p, None, Some(2), &Rules::default()),
            Verdict::Unknown("nvidia-smi did not answer within 10 s".to_string())
        );
    }
}
