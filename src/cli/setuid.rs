//! The binary installed setuid-root and run by an ordinary user (see
//! `azp_sandbox::setuid`): `exec` and `run` go to the privileged side as requests checked
//! against the site policy; any other verb runs right here, with the caller's ids only.

use super::{Cli, Command};
use anyhow::Result;
use azp_sandbox::setuid::{split, Request, Side};
use clap::Parser;

/// In setuid mode whose ids jobs run as is the site's choice (`[setuid] userns`).
pub fn refuse_userns(flag: Option<azp_sandbox::identity::Choice>) -> Result<()> {
    if flag.is_some() {
        anyhow::bail!(
            "--userns is the administrator's choice in setuid mode (userns in the [setuid] table of {})",
            azp_sandbox::setuid::POLICY_FILE
        );
    }
    Ok(())
}

/// Call first thing in `main` (before threads, before anything reads the environment).
pub fn main() -> Result<i32> {
    match split()? {
        Side::Privileged(monitor) => Ok(monitor.serve()),
        Side::Unprivileged(sender) => {
            let cli = Cli::parse();
            let request = match cli.command {
                Command::Exec(args) => {
                    refuse_userns(args.job.userns)?;
                    Request::Exec(args.request())
                }
                Command::Shell(args) => {
                    refuse_userns(args.job.userns)?;
                    Request::Exec(args.request())
                }
                // `run --check` starts nothing: checked as the caller, like `check`.
                Command::Run(args) if !args.check_only() => args.setuid_request()?,
                other => {
                    drop(sender);
                    return super::dispatch(Cli { command: other, ..cli });
                }
            };
            sender.send(&request)?;
            Ok(0)
        }
    }
}
