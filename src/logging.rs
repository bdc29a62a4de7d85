//! Log set-up: one line per event on stderr, sysadmin-oriented. libcontainer logs through
//! `tracing` too; it is kept at `warn` unless `-v` is given twice.
//!
//! On a terminal a person reads the lines as they come: `warning: ...`, `error: ...`, plain
//! info, no timestamps (as cargo and git write). Anywhere else (a file, a pipe, journald
//! under the service) each line keeps its UTC timestamp and level, for reading later.

use std::fmt;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
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
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if terminal {
        builder.event_format(Plain).try_init()
    } else {
        builder.with_ansi(false).with_target(false).try_init()
    };
}

/// A terminal's line: the level as a word where it matters, then the message and fields.
struct Plain;

impl Plain {
    fn prefix(level: Level) -> &'static str {
        match level {
            Level::ERROR => "error: ",
            Level::WARN => "warning: ",
            Level::INFO => "",
            Level::DEBUG => "debug: ",
            Level::TRACE => "trace: ",
        }
    }
}

impl Plain {
    /// The level word once: loud warnings already say `WARNING: ...` themselves.
    fn line(level: Level, message: &str) -> String {
        if level == Level::WARN && message.starts_with("WARNING: ") {
            return message.to_string();
        }
        format!("{}{message}", Self::prefix(level))
    }
}

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut line = String::new();
        ctx.field_format().format_fields(Writer::new(&mut line), event)?;
        writeln!(writer, "{}", Self::line(*event.metadata().level(), &line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_prefixes_name_the_level_only() {
        assert_eq!(Plain::prefix(Level::WARN), "warning: ");
        assert_eq!(Plain::prefix(Level::ERROR), "error: ");
        assert_eq!(Plain::prefix(Level::INFO), "");
        assert_eq!(Plain::line(Level::WARN, "x"), "warning: x");
        assert_eq!(Plain::line(Level::WARN, "WARNING: loud"), "WARNING: loud");
        assert_eq!(Plain::line(Level::INFO, "done"), "done");
    }
}
