//! Chaos runs with real torch (gloo) workers: the fault-free reference model and the comparison
//! of a chaos run's final model with it (the model counterpart of invariant (a)).

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use super::check::Violation;
use super::history::Data;
use crate::harness::{drun, worker, Agent, DrunCmd};

/// The largest |Δ| allowed between a chaos run's final parameters and the fault-free run's:
/// float64 training whose only difference across world sizes is the summation order.
pub const TOL: f64 = 1e-5;

/// The torch worker's script.
pub fn script() -> String {
    worker("chaos_torch_worker.py")
}

/// What a worker's `final.json` says: the step it ended at and the parameters.
#[derive(Debug, serde::Deserialize)]
struct Final {
    step: u64,
    params: Vec<f64>,
}

/// The parameters in `<out>/final.json`, which the rank 0 that finished writes; an error when
/// it is missing, unreadable, or written at another step than the data's last.
pub fn final_params(out: &Path, data: Data) -> Result<Vec<f64>, String> {
    let path = out.join("final.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let f: Final =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}: {text}", path.display()))?;
    if f.step != data.total_steps() {
        return Err(format!(
            "{} was written at step {}, not at the last step {}",
            path.display(),
            f.step,
            data.total_steps()
        ));
    }
    Ok(f.params)
}

/// The largest |Δ| between `reference` and `got` when it is at most `tol`; else (or when their
/// lengths differ) why not, naming the worst parameter.
pub fn compare(reference: &[f64], got: &[f64], tol: f64) -> Result<f64, String> {
    if reference.len() != got.len() {
        return Err(format!(
            "{} parameters, the fault-free run has {}",
            got.len(),
            reference.len()
        ));
    }
    let (mut worst, mut at) = (0.0_f64, 0);
    for (i, (r, g)) in reference.iter().zip(got).enumerate() {
        let d = (r - g).abs();
        // A NaN is never within the tolerance.
        if d.is_nan() || d > worst {
            (worst, at) = (if d.is_nan() { f64::INFINITY } else { d }, i);
        }
    }
    if worst <= tol {
        Ok(worst)
    } else {
        Err(format!(
            "max |Δ| {worst:e} > {tol:e} at parameter {at} ({} here, {} without faults)",
            got[at], reference[at]
        ))
    }
}

/// The final parameters of the same training without faults: one agent, one worker (world size
/// 1, the same global batch and steps, no sleep), run once per nextest run and shared by the
/// torch chaos tests. Without warm workers: nothing restarts, so a waiting interpreter would
/// import torch for nothing.
pub fn reference(python: &Path, data: Data) -> Result<Vec<f64>, String> {
    static REF: OnceLock<Result<Vec<f64>, String>> = OnceLock::new();
    REF.get_or_init(|| {
        let dir = crate::harness::reference::shared("chaos-torch-world-1", |dir| {
            let out = dir.join("out");
            std::fs::create_dir_all(&out).unwrap();
            let mut c = drun();
            c.args(["--standalone", "--warm-workers", "off"])
                .nproc(1)
                .python(python)
                .arg("--ckpt-dir")
                .arg(dir.join("ckpt"))
                .arg(script())
                .env("CHAOS_OUT", &out)
                .env("CHAOS_SLEEP", "0");
            let (code, _, err) = Agent::start(c).wait(Duration::from_secs(180));
            if code != 0 {
                let why = format!("the fault-free run exited {code}:\n{err}");
                std::fs::write(dir.join("failed"), why).unwrap();
            }
        });
        if let Ok(why) = std::fs::read_to_string(dir.join("failed")) {
            return Err(why);
        }
        final_params(&dir.join("out"), data)
    })
    .clone()
}

/// The model check of a torch chaos run whose workers wrote to `out`: a violation ('m') unless
/// its final parameters are within [`TOL`] of the fault-free run's; the max |Δ| when they are.
pub fn check_model(python: &Path, out: &Path, data: Data) -> Result<f64, Violation> {
    let m = |what: String| Violation {
        invariant: 'm',
        what,
        excerpt: vec![],
    };
    let want = reference(python, data).map_err(|e| m(format!("no reference model: {e}")))?;
    let got = final_params(out, data).map_err(|e| m(format!("no final model: {e}")))?;
    compare(&want, &got, TOL).map_err(|e| {
        m(format!(
            "the final model differs from the fault-free run's at the same global batch: {e}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chaos_model_comparison_within_tolerance_passes() {
        let r = [1.0, -2.0, 0.5];
        assert_eq!(compare(&r, &r, TOL), Ok(0.0));
        let d = compare(&r, &[1.0 + 4e-6, -2.0 - 9e-6, 0.5], TOL).unwrap();
        assert!((d - 9e-6).abs() < 1e-12, "{d}");
    }

    #[test]
    fn chaos_model_comparison_catches_a_differing_parameter() {
        let r = [1.0, -2.0, 0.5];
        let e = compare(&r, &[1.0, -2.0, 0.5 + 2e-5], TOL).unwrap_err();
        assert!(e.contains("at parameter 2"), "{e}");
        assert!(compare(&r, &[1.0, f64::NAN, 0.5], TOL)
            .unwrap_err()
            .contains("at parameter 1"));
        assert!(compare(&r, &[1.0, -2.0], TOL)
            .unwrap_err()
            .contains("2 parameters"));
    }
}
