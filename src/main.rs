//! The `azp-sandbox` command line: parse, dispatch to the verb (`src/cli/`), map errors
//! to exit codes. Errors print as one line (`azp-sandbox: error: ...`) and exit 125;
//! `exec` otherwise exits with the job's own exit code.

mod cli;

/// Exit code for failures of azp-sandbox itself (as `docker run` uses 125).
const EXIT_SANDBOX_ERROR: i32 = 125;

fn main() {
    // Before any thread or I/O exists, so `azp-sandbox gpu list | head` ends quietly
    // instead of panicking.
    azp_sandbox::sys::signals::restore_default(azp_sandbox::sys::Signal::SIGPIPE);
    let result = if azp_sandbox::setuid::invoked_setuid() { cli::setuid::main() } else { cli::dispatch(cli::parse()) };
    std::process::exit(match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("azp-sandbox: error: {}", one_line(&e));
            EXIT_SANDBOX_ERROR
        }
    })
}

/// `a: b: c` on one line, without repeating a cause the context already quotes.
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if out.contains(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out.replace('\n', " ")
}
