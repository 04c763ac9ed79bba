//! The name of a run's log directory: `<run id>_<suffix>` under `--log-dir`, or
//! `drun_<run id>_<suffix>` under the temporary directory (torchrun's `torchelastic_<id>_...`
//! in spirit). A run id may be 253 bytes and a file name at most 255 (Linux `NAME_MAX`), so a
//! long id is cut to its first [`MAX_ID_PART`] bytes; the random suffix keeps names unique.

/// The most bytes of the run id a log directory's name holds.
pub const MAX_ID_PART: usize = 200;

/// The directory name for run `run_id` with the random `suffix`; `temp`: under the temporary
/// directory, where the `drun_` prefix says whose it is.
pub fn name(run_id: &str, suffix: &str, temp: bool) -> String {
    let mut end = run_id.len().min(MAX_ID_PART);
    while !run_id.is_char_boundary(end) {
        end -= 1;
    }
    let id = &run_id[..end];
    if temp {
        format!("drun_{id}_{suffix}")
    } else {
        format!("{id}_{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_a_file_name_whatever_the_run_id() {
        assert_eq!(name("job-1", "abcd1234", false), "job-1_abcd1234");
        assert_eq!(name("job-1", "abcd1234", true), "drun_job-1_abcd1234");
        let long = "é".repeat(126) + "x"; // 253 bytes, multi-byte characters
        let n = name(&long, "abcd1234", true);
        assert!(n.len() <= 255 && n.ends_with("_abcd1234"), "{}", n.len());
        assert!(n.starts_with("drun_éé"));
    }
}
