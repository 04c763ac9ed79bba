//! `drun`: the per-node agent. Parses the command line, installs logging, runs the agent.

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;
use drun_launcher::status::StatusQuery;
use drun_launcher::{AgentExit, Args, LaunchConfig, GUARD_ARG};

#[path = "common/logging.rs"]
mod logging;

fn main() -> ExitCode {
    drun_launcher::container::catch_early_signals();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == GUARD_ARG) {
        let id = argv
            .get(2)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        drun_launcher::guard_main(&id);
    }
    // An operator's empty `PET_STANDALONE=""` (and the like) is read as unset, with a warning:
    // clap reads `PET_*` while parsing, so they go before it (single-threaded here).
    let unset = drun_launcher::k8s::unset_empty(|k| std::env::var(k).ok());
    for (var, _) in &unset {
        std::env::remove_var(var);
    }
    // `drun doctor ...` (unless a script of that name is meant, as `torchrun doctor` would):
    // its table shows the warnings, which a run says on its own.
    let doctor =
        argv.get(1).is_some_and(|a| a == "doctor") && !std::path::Path::new("doctor").exists();
    if !doctor {
        for (_, warning) in &unset {
            drun_launcher::say!("drun: warning: {warning}");
        }
    }
    if doctor {
        let rest: Vec<String> = std::iter::once("drun".to_string())
            .chain(argv[2..].iter().map(|a| a.to_string_lossy().into_owned()))
            .collect();
        install_tracing(0, true, drun_launcher::LogFormat::Human);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime on the main thread");
        return ExitCode::from(runtime.block_on(drun_launcher::doctor::run(&rest, &unset)));
    }
    let args = match Args::try_parse_from(&argv) {
        Ok(a) => a,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) if e.kind() == ErrorKind::InvalidUtf8 => {
            // clap says only "one or more arguments": name it. Script arguments are UTF-8 in
            // drun (they pass through `${local_rank}` substitution, logs and the run's record).
            let bad = argv
                .iter()
                .skip(1)
                .find(|a| a.to_str().is_none())
                .map(|a| a.to_string_lossy().into_owned())
                .unwrap_or_default();
            drun_launcher::say!(
                "drun: error: the argument '{bad}' is not valid UTF-8 ({} marks the bytes that are not); drun passes only UTF-8 to the training script: rename the file, or pass the value another way (an environment variable, a file)",
                char::REPLACEMENT_CHARACTER
            );
            return ExitCode::from(AgentExit::Usage.code());
        }
        Err(e) => {
            let from_env = drun_launcher::cli::env_source(&e, &argv, |v| std::env::var_os(v))
                .map(|v| format!(", set by {v} in the environment"))
                .unwrap_or_default();
            drun_launcher::say!(
                "drun: {}{from_env} (see drun --help)",
                one_line(&e.render().to_string())
            );
            return ExitCode::from(AgentExit::Usage.code());
        }
    };
    install_tracing(args.verbose, args.quiet, args.log_format);
    if args.status {
        return status(&args);
    }
    let cfg = match LaunchConfig::from_args(&args) {
        Ok(c) => c,
        Err(e) => {
            let from_env = match &e {
                drun_launcher::ConfigError::Invalid { flag, .. }
                | drun_launcher::ConfigError::Empty { flag, .. } => {
                    drun_launcher::cli::flag_env_source(flag, &argv, |v| std::env::var_os(v))
                }
                _ => None,
            }
            .map(|v| format!(" (set by {v} in the environment)"))
            .unwrap_or_default();
            drun_launcher::say!("drun: error: {e}{from_env}");
            let message = drun_launcher::container::termination_json(
                &drun_launcher::container::Termination {
                    exit: AgentExit::Usage,
                    reason: &e.to_string(),
                    run_id: None,
                    restarts: None,
                },
            );
            // Not to a termination log that is itself the problem (said once, above).
            let unusable_log = matches!(
                &e,
                drun_launcher::ConfigError::Invalid {
                    flag: "--termination-log",
                    ..
                }
            );
            if !unusable_log {
                drun_launcher::container::write_termination_log(
                    args.container.termination_log.as_deref(),
                    &message,
                );
            }
            return ExitCode::from(AgentExit::Usage.code());
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("drun-agent")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            drun_launcher::say!("drun: error: cannot start the async runtime: {e}");
            return ExitCode::from(AgentExit::WorkerFailure.code());
        }
    };
    let exit = runtime.block_on(drun_launcher::run(cfg));
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    ExitCode::from(exit.code())
}

/// `drun --status`: the state of the run this agent's rendezvous flags name.
fn status(args: &Args) -> ExitCode {
    let fail = |code: u8, msg: &dyn std::fmt::Display| {
        drun_launcher::say!("drun: error: {msg}");
        ExitCode::from(code)
    };
    let host = drun_launcher::config::Host::probe(args);
    let (mode, run) = match drun_launcher::config::status_target(args, &host) {
        Ok(t) => t,
        Err(e) => return fail(AgentExit::Usage.code(), &e),
    };
    let source = match drun_launcher::status::source(&mode) {
        Ok(s) => s,
        Err(e) => return fail(e.code(), &e),
    };
    let token = match drun_launcher::rdzv::token::resolve(
        args.rdzv_token_file.as_deref(),
        host.var(drun_launcher::rdzv::token::TOKEN_VAR),
    ) {
        Ok(t) => t.or_else(|| drun_launcher::config::slurm_status_token(args, &host, &mode)),
        Err(e) => return fail(AgentExit::Usage.code(), &e),
    };
    let tls = match &args.rdzv_tls_ca {
        Some(ca) => match drun_rendezvous_tls(ca, args) {
            Ok(t) => Some(t),
            Err(e) => return fail(AgentExit::Usage.code(), &e),
        },
        None => None,
    };
    let etcd = match args
        .etcd
        .files()
        .load(host.var(drun_rendezvous::store::etcd::access::PASSWORD_VAR))
    {
        Ok(a) => a,
        Err(e) => return fail(AgentExit::Usage.code(), &e),
    };
    let query = StatusQuery {
        run,
        source,
        json: args.json,
        watch: args.watch,
        token,
        tls,
        etcd,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime on the main thread");
    match runtime.block_on(drun_launcher::status::show(&query)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e.code(), &e),
    }
}

/// `--rdzv-tls-ca` with the client identity of `args`.
fn drun_rendezvous_tls(
    ca: &std::path::Path,
    args: &Args,
) -> Result<drun_rendezvous::server::tls::ClientTls, drun_rendezvous::server::tls::TlsError> {
    drun_rendezvous::server::tls::ClientTls::from_files(
        ca,
        args.rdzv_tls_cert.as_deref(),
        args.rdzv_tls_key.as_deref(),
    )
}

/// clap's message up to its usage/tip section, on one line.
fn one_line(rendered: &str) -> String {
    let head = rendered.split("\n\n").next().unwrap_or(rendered);
    head.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn install_tracing(verbose: u8, quiet: bool, format: drun_launcher::LogFormat) {
    logging::install(
        match (quiet, verbose) {
            (true, _) => "warn",
            (false, 0) => "info",
            (false, 1) => "debug",
            _ => "trace",
        },
        format,
    );
}
