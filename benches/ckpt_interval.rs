//! `--ckpt-interval auto` against fixed intervals, in simulation (no processes, no clock).
//!
//! `cargo bench --bench ckpt_interval` prints one row per (C, M): a job that needs `WORK_MTBFS`·M
//! seconds of useful work, failures arriving as a Poisson process of mean M (exponential gaps,
//! seeded: every policy meets the same failures at the same wall-clock instants), a save taking
//! C seconds, a failure losing everything since the last completed save (a save cut short too).
//! Restarts cost nothing here: they add the same per failure whatever the interval.
//!
//! The overhead of a policy is its wall time minus the useful work: time spent saving plus work
//! lost, in % of the useful work. Fixed intervals are tried on a fine logarithmic grid (8 % steps
//! from √(2·C·M)/8 to 8·√(2·C·M)): "best fixed" is the best of them in hindsight. `auto` is drun's
//! [`drun_rendezvous::decisions::ckpt_interval::decide`] fed what drun measures — the save costs, the
//! failures so far and the time the job has run — re-evaluated after every seal and failure,
//! starting from the default prior (`--expected-mtbf` 4 h) and the 1 s prior cost.
//! `DRUN_BENCH_SEED` changes the seed (default 1).

use drun_rendezvous::decisions::ckpt_interval::{
    decide, IntervalMode, Observed, DEFAULT_EXPECTED_MTBF_S,
};

/// Useful work of each simulated job, in units of M (so ~this many failures each).
const WORK_MTBFS: f64 = 2000.0;

/// splitmix64: a small seeded generator (no dependency; the numbers only need to be uniform).
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An exponential gap of mean `mean`.
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next_f64()).ln()
    }
}

/// How a policy picks the next interval.
trait Policy {
    fn interval(&mut self) -> f64;
    fn sealed(&mut self, _cost: f64, _now: f64) {}
    fn failed(&mut self, _now: f64) {}
}

struct Fixed(f64);

impl Policy for Fixed {
    fn interval(&mut self) -> f64 {
        self.0
    }
}

/// drun's `auto`: the interval re-evaluated from what was measured, after each seal and failure.
struct Auto {
    obs: Observed,
    current: f64,
    /// Intervals used, for the mean reported.
    used: (f64, u64),
}

impl Auto {
    fn new() -> Self {
        let mut a = Auto {
            obs: Observed::default(),
            current: 0.0,
            used: (0.0, 0),
        };
        a.evaluate(0.0);
        a
    }

    fn evaluate(&mut self, now: f64) {
        self.obs.exposure_s = now;
        self.current = decide(IntervalMode::Auto, &self.obs, DEFAULT_EXPECTED_MTBF_S)
            .expect("auto is on")
            .interval_s;
    }
}

impl Policy for Auto {
    fn interval(&mut self) -> f64 {
        self.used.0 += self.current;
        self.used.1 += 1;
        self.current
    }
    fn sealed(&mut self, cost: f64, now: f64) {
        self.obs.save_costs_s.push(cost);
        if self.obs.save_costs_s.len() > 64 {
            self.obs.save_costs_s.drain(..32);
        }
        self.evaluate(now);
    }
    fn failed(&mut self, now: f64) {
        self.obs.failures += 1;
        self.evaluate(now);
    }
}

/// Runs a job of `work` seconds with save cost `c` and failures of mean `m` (seed `seed`)
/// under `p`; returns the overhead in % of `work`.
fn simulate(p: &mut dyn Policy, c: f64, m: f64, work: f64, seed: u64) -> f64 {
    let mut rng = Rng(seed);
    let (mut t, mut done) = (0.0f64, 0.0f64);
    let mut next_fail = rng.exp(m);
    while done < work {
        let seg = p.interval().min(work - done);
        let end = t + seg + c;
        if end <= next_fail {
            t = end;
            done += seg;
            p.sealed(c, t);
        } else {
            t = next_fail;
            next_fail = t + rng.exp(m);
            p.failed(t);
        }
    }
    (t - work) / work * 100.0
}

fn human(s: f64) -> String {
    if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

fn main() {
    let seed: u64 = std::env::var("DRUN_BENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    println!("ckpt_interval: overhead (saving + lost work, % of useful work) of fixed intervals vs --ckpt-interval auto");
    println!("({WORK_MTBFS}·M of work per job, exponential failures, seed {seed}; auto starts from the 4 h prior)\n");
    println!("| C | M | √(2·C·M) | best fixed | its overhead | auto (mean interval) | auto overhead | auto vs best | fixed 10 min | fixed 1 h |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut worst: f64 = 0.0;
    for c in [10.0, 60.0, 300.0] {
        for m in [1800.0, 7200.0, 28_800.0, 86_400.0] {
            let work = WORK_MTBFS * m;
            let opt = (2.0 * c * m).sqrt();
            let grid: Vec<f64> = (-27..=27).map(|k| opt * 1.08f64.powi(k)).collect();
            let fixed: Vec<(f64, f64)> = grid
                .iter()
                .map(|&t| (t, simulate(&mut Fixed(t), c, m, work, seed)))
                .collect();
            let (best_t, best) = fixed
                .iter()
                .copied()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .expect("grid not empty");
            let mut auto = Auto::new();
            let auto_ov = simulate(&mut auto, c, m, work, seed);
            let mean_t = auto.used.0 / auto.used.1 as f64;
            let rel = auto_ov / best - 1.0;
            worst = worst.max(rel);
            let at = |t: f64| simulate(&mut Fixed(t), c, m, work, seed);
            println!(
                "| {} | {} | {} | {} | {best:.2} % | {} | {auto_ov:.2} % | {:+.1} % | {:.2} % | {:.2} % |",
                human(c),
                human(m),
                human(opt),
                human(best_t),
                human(mean_t),
                rel * 100.0,
                at(600.0),
                at(3600.0),
            );
        }
    }
    println!(
        "\nworst auto vs best fixed: {:+.1} % (relative overhead)",
        worst * 100.0
    );
}
