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
        builder.event_format(Plain { cooked: stderr_cooked }).try_init()
    } else {
        let full = tracing_subscriber::fmt::format().with_ansi(false).with_target(false);
        builder.with_ansi(false).event_format(OneLine(full)).try_init()
    };
}

/// Line breaks and other control characters inside one event's text, escaped (`\n`, `\r`,
/// `\u{0}`, `\u{2028}`...; tabs stay): one event is one line. A job controls some of what
/// is logged (names in its cache or its `_diag`), and a break in them forged whole lines
/// under the service, each a journal entry with its own timestamp and level, such as a
/// fake "committed snapshot" (found by a red-team pass). tracing already escapes terminal
/// escape sequences.
fn escape_breaks(text: &str) -> std::borrow::Cow<'_, str> {
    // NUL too: journald's stream reader ends a line there as well.
    let is_break = |c: char| (c.is_control() && c != '\t') || matches!(c, '\u{2028}' | '\u{2029}');
    if !text.contains(is_break) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if is_break(c) => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    out.into()
}

/// A format whose lines keep to one per event (see [`escape_breaks`]).
struct OneLine<F>(F);

impl<S, N, F> FormatEvent<S, N> for OneLine<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut text = String::new();
        self.0.format_event(ctx, Writer::new(&mut text), event)?;
        writeln!(writer, "{}", escape_breaks(text.strip_suffix('\n').unwrap_or(&text)))
    }
}

/// A terminal's line: the level as a word where it matters, then the message and fields.
/// `cooked`: whether the terminal starts a new line at `\n` (see
/// [`crate::sys::tty::output_processed`]); while a job has a terminal of its own (`exec
/// -t`, `shell`) the caller's is raw, and a line logged meanwhile (a firewall reload's,
/// by the table's keeper or the helper) must end with `\r\n`, or the next one begins
/// where it ended. Asked per line: the CLI and its helper both write there.
struct Plain {
    cooked: fn() -> bool,
}

fn stderr_cooked() -> bool {
    crate::sys::tty::output_processed(std::os::fd::AsFd::as_fd(&std::io::stderr()))
}

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
        let end = if (self.cooked)() { "\n" } else { "\r\n" };
        write!(writer, "{}{end}", escape_breaks(&Self::line(*event.metadata().level(), &line)))
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

    /// On a raw terminal (the caller's, while a job has a terminal of its own) a line
    /// ends with a carriage return too, and only then.
    #[test]
    fn terminal_lines_end_with_a_carriage_return_while_it_is_raw() {
        for (cooked, end) in [(false, "\r\n"), (true, "\n")] {
            let buf = Buf::default();
            let out = buf.clone();
            let plain = Plain { cooked: if cooked { || true } else { || false } };
            let sub = tracing_subscriber::fmt().with_ansi(false).event_format(plain).with_writer(move || buf.clone());
            tracing::subscriber::with_default(sub.finish(), || tracing::warn!("made again"));
            assert_eq!(String::from_utf8(out.0.lock().unwrap().clone()).unwrap(), format!("warning: made again{end}"));
        }
        // A file, or a pipe: lines as they are.
        let f = tempfile::tempfile().unwrap();
        assert!(crate::sys::tty::output_processed(std::os::fd::AsFd::as_fd(&f)));
    }

    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A job-controlled name with a forged line in it stays inside its own event's line,
    /// through the service's format (the subscriber writing to a buffer).
    #[test]
    fn an_event_is_one_line_whatever_its_text_holds() {
        let buf = Buf::default();
        let out = buf.clone();
        let full = tracing_subscriber::fmt::format().with_ansi(false).with_target(false);
        let sub = tracing_subscriber::fmt()
            .with_ansi(false)
            .event_format(OneLine(full))
            .with_writer(move || buf.clone())
            .finish();
        let name = "zz\n2026-11-29T17:20:00.000000Z  INFO cache c: committed snapshot 99\r\u{2028}\0x";
        tracing::subscriber::with_default(sub, || tracing::warn!("commit refused: {name}"));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.ends_with(
                "commit refused: zz\\n2026-11-29T17:20:00.000000Z  INFO cache c: committed snapshot 99\\r\\u{2028}\\u{0}x\n"
            ),
            "{text}"
        );
        assert!(text.contains(" WARN "), "{text}");
        assert_eq!(escape_breaks("plain"), "plain");
    }
}
