//! `azp-sandbox shell`: an interactive shell in a fresh, throwaway sandbox, with a terminal
//! of its own (as `apptainer shell`, `enroot start`): `exec -t` of the rootfs's shell.

use super::exec::JobArgs;
use super::{Context, Needs, Verb};
use anyhow::Result;

#[derive(clap::Args)]
pub struct ShellArgs {
    #[command(flatten)]
    pub job: JobArgs,
}

impl ShellArgs {
    /// The same request as `exec -t` with no command.
    pub fn request(self) -> azp_sandbox::sandbox::exec::ExecRequest {
        self.job.request(vec![], true)
    }
}

impl Verb for ShellArgs {
    fn needs(&self) -> Needs {
        Needs::Sandboxes
    }

    /// The shell's exit code.
    fn run(self: Box<Self>, ctx: &Context) -> Result<i32> {
        let userns = self.job.userns;
        super::exec::run_job(ctx, userns, self.request())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Cli, Command};
    use clap::Parser;

    #[test]
    fn a_shell_is_exec_with_a_terminal_and_no_command() {
        let cli = Cli::try_parse_from(["azp-sandbox", "shell", "--rootfs", "r", "-u", "1000", "-w", "/tmp"]).unwrap();
        let Command::Shell(a) = cli.command else { unreachable!() };
        let r = a.request();
        assert!(r.terminal && r.command.is_empty());
        assert_eq!((r.user, r.workdir.to_str()), (Some((1000, 1000)), Some("/tmp")));
        assert!(Cli::try_parse_from(["azp-sandbox", "shell", "--rootfs", "r", "ls"]).is_err(), "no command");
    }
}
