//! Log set-up: one line per event on stderr, sysadmin-oriented. libcontainer logs through
//! `tracing` too; it is kept at `warn` unless `-v` is given twice.

use tracing_subscriber::EnvFilter;

/// `verbosity`: 0 = info, 1 = debug for azp-sandbox, 2+ = debug everywhere; -1 = warnings only.
pub fn init(verbosity: i8) {
    let default = match verbosity {
        i8::MIN..=-1 => "warn",
        0 => "azp_sandbox=info,libcontainer=error,libcgroups=error",
        1 => "azp_sandbox=debug,libcontainer=warn,libcgroups=warn",
        _ => "debug",
    };
    let filter = EnvFilter::try_from_env("AZP_SANDBOX_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}
