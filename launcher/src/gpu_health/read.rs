//! What `nvidia-smi` and the kernel log say about this node's GPUs, parsed (pure): the text in,
//! typed readings out. The seam that runs them is [`super::probe`].

/// The `--query-gpu` fields [`readings`] parses, in this order. Each is accepted by every
/// `nvidia-smi` since the R450 drivers (`clocks_throttle_reasons.active` is still accepted where
/// newer drivers call it `clocks_event_reasons.active`).
pub const QUERY: &str = "index,pci.bus_id,uuid,name,memory.used,memory.total,\
ecc.errors.uncorrected.volatile.total,clocks_throttle_reasons.active";

/// One GPU as `nvidia-smi` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// `nvidia-smi`'s index (PCI order).
    pub index: u32,
    /// PCI address in sysfs's shape (`0000:18:00.0`).
    pub bus_id: String,
    /// `GPU-…`.
    pub uuid: String,
    /// Model.
    pub name: String,
    /// Memory in use and in all, MiB (`None`: not reported).
    pub memory_used_mib: Option<u64>,
    /// See `memory_used_mib`.
    pub memory_total_mib: Option<u64>,
    /// Uncorrectable ECC errors since the driver loaded (`None`: ECC off or not reported).
    pub ecc_uncorrected: Option<u64>,
    /// The active clock throttle reasons, NVML's bit mask (`None`: not reported).
    pub throttle: Option<u64>,
}

/// A GPU `nvidia-smi` could not reach ("Unable to determine the device handle for GPU …",
/// "GPU is lost"): fallen off the bus, or wedged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// PCI address in sysfs's shape, when the line names one.
    pub bus_id: Option<String>,
    /// The line, trimmed.
    pub line: String,
}

/// An `NVRM: Xid` line of the kernel log.
#[derive(Debug, Clone, PartialEq)]
pub struct Xid {
    /// PCI address in sysfs's shape.
    pub bus_id: String,
    /// The Xid number.
    pub code: u32,
    /// Seconds since boot when the kernel logged it.
    pub at: f64,
    /// The rest of the line (after the code), trimmed.
    pub text: String,
}

/// `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits` with its error lines: the
/// readings of the rows that parse, and the GPUs the error lines say are lost.
pub fn readings(out: &str) -> (Vec<Reading>, Vec<Lost>) {
    let mut readings = Vec::new();
    let mut lost = Vec::new();
    for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(r) = reading(line) {
            readings.push(r);
        } else if line.contains("Unable to determine the device handle")
            || line.contains("GPU is lost")
            || line.contains("fallen off the bus")
        {
            lost.push(Lost {
                bus_id: bus_id_in(line),
                line: line.to_string(),
            });
        }
    }
    (readings, lost)
}

fn reading(line: &str) -> Option<Reading> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if f.len() != 8 {
        return None;
    }
    Some(Reading {
        index: f[0].parse().ok()?,
        bus_id: normal_bus_id(f[1])?,
        uuid: f[2].to_string(),
        name: f[3].to_string(),
        memory_used_mib: f[4].parse().ok(),
        memory_total_mib: f[5].parse().ok(),
        ecc_uncorrected: f[6].parse().ok(),
        throttle: f[7]
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok()),
    })
}

/// `00000000:18:00.0` (nvidia-smi) or `0000:18:00.0` (sysfs, the kernel log) →
/// `0000:18:00.0`, lower case; `None` when `s` is not shaped like a PCI address.
pub fn normal_bus_id(s: &str) -> Option<String> {
    let s = s.trim().to_ascii_lowercase();
    let (domain, rest) = s.split_once(':')?;
    let (bus, devfn) = rest.split_once(':')?;
    let (dev, func) = devfn.split_once('.')?;
    let hex = |x: &str, n: usize| x.len() == n && x.chars().all(|c| c.is_ascii_hexdigit());
    if domain.is_empty()
        || domain.len() > 8
        || !domain.chars().all(|c| c.is_ascii_hexdigit())
        || !hex(bus, 2)
        || !hex(dev, 2)
        || !hex(func, 1)
    {
        return None;
    }
    let domain = u32::from_str_radix(domain, 16).ok()?;
    Some(format!("{domain:04x}:{bus}:{dev}.{func}"))
}

/// The first PCI address in `line` ("…for GPU 00000000:3B:00.0: Unknown Error",
/// "…GPU0000:3B:00.0…", "(PCI:0000:3b:00)").
fn bus_id_in(line: &str) -> Option<String> {
    line.split(|c: char| !(c.is_ascii_hexdigit() || c == ':' || c == '.'))
        .flat_map(|w| {
            // "GPU0000:3B:00.0" splits after "GPU"'s non-hex letters; "PCI:0000:3b:00" keeps
            // a leading ':'.
            let w = w.trim_matches(|c| c == ':' || c == '.');
            [w.to_string(), format!("{w}.0")]
        })
        .find_map(|w| normal_bus_id(&w))
}

/// The `NVRM: Xid` records of `/dev/kmsg` text (`PRI,SEQ,USEC,FLAGS;MESSAGE` per line), e.g.
/// `3,1024,812345678,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.`
pub fn xids(kmsg: &str) -> Vec<Xid> {
    kmsg.lines()
        .filter_map(|line| {
            let (head, msg) = line.split_once(';')?;
            let usec: f64 = head.split(',').nth(2)?.parse().ok()?;
            let rest = msg.split_once("NVRM: Xid")?.1;
            let (pci, after) = rest.split_once("):")?;
            let pci = pci
                .trim()
                .trim_start_matches('(')
                .trim_start_matches("PCI:");
            let bus_id = normal_bus_id(pci).or_else(|| normal_bus_id(&format!("{pci}.0")))?;
            let after = after.trim();
            let (code, text) = after.split_once(',').unwrap_or((after, ""));
            Some(Xid {
                bus_id,
                code: code.trim().parse().ok()?,
                at: usec / 1e6,
                text: text.trim().to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits` prints on a node of
    /// two H100s, the second with ECC off and its clocks held back by a hardware slowdown.
    const TWO: &str = "0, 00000000:18:00.0, GPU-5f3c1d2a-0b1e-4c55-9a1d-7e2f3a4b5c6d, NVIDIA H100 80GB HBM3, 1, 81559, 0, 0x0000000000000001\n\
                       1, 00000000:3B:00.0, GPU-9a8b7c6d-1e2f-4a3b-8c9d-0e1f2a3b4c5d, NVIDIA H100 80GB HBM3, 2, 81559, [N/A], 0x0000000000000008\n";

    #[test]
    fn rows_become_readings_with_sysfs_bus_ids() {
        let (r, lost) = readings(TWO);
        assert!(lost.is_empty());
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].index, 0);
        assert_eq!(r[0].bus_id, "0000:18:00.0");
        assert_eq!(r[0].memory_used_mib, Some(1));
        assert_eq!(r[0].memory_total_mib, Some(81559));
        assert_eq!(r[0].ecc_uncorrected, Some(0));
        assert_eq!(r[0].throttle, Some(1));
        assert_eq!(r[1].bus_id, "0000:3b:00.0");
        assert_eq!(r[1].ecc_uncorrected, None, "[N/A] is not a count");
        assert_eq!(r[1].throttle, Some(8));
    }

    #[test]
    fn an_unreachable_gpu_is_lost_with_its_address() {
        let out = format!(
            "{}\nUnable to determine the device handle for GPU 00000000:3B:00.0: Unknown Error\n",
            TWO.lines().next().unwrap()
        );
        let (r, lost) = readings(&out);
        assert_eq!(r.len(), 1);
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0].bus_id.as_deref(), Some("0000:3b:00.0"));
        let (_, lost) = readings("Unable to determine the device handle for GPU0000:86:00.0: GPU is lost.  Reboot the system to recover this GPU\n");
        assert_eq!(lost[0].bus_id.as_deref(), Some("0000:86:00.0"));
    }

    #[test]
    fn other_lines_are_neither() {
        let (r, lost) =
            readings("No devices were found\nField \"x\" is not a valid field to query.\n");
        assert!(r.is_empty() && lost.is_empty());
    }

    #[test]
    fn bus_ids_are_normalised_or_refused() {
        assert_eq!(
            normal_bus_id("00000000:B1:00.0").as_deref(),
            Some("0000:b1:00.0")
        );
        assert_eq!(
            normal_bus_id("0000:b1:00.0").as_deref(),
            Some("0000:b1:00.0")
        );
        assert_eq!(normal_bus_id("GPU-0"), None);
        assert_eq!(normal_bus_id("0000:b1:00"), None);
    }

    #[test]
    fn xid_records_of_the_kernel_log() {
        let kmsg = "6,100,5000000,-;usb 1-1: new device\n\
                    3,1024,812345678,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n\
                    4,1030,900000000,-;NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python, Graphics Exception\n";
        let x = xids(kmsg);
        assert_eq!(x.len(), 2);
        assert_eq!(x[0].bus_id, "0000:3b:00.0");
        assert_eq!(x[0].code, 79);
        assert!((x[0].at - 812.345678).abs() < 1e-9);
        assert_eq!(x[0].text, "pid=0, GPU has fallen off the bus.");
        assert_eq!(x[1].code, 13);
    }
}
