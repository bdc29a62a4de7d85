//! The global options' defaults: where `--home` is when not given.

use super::env::Env;
use crate::config::Home;
use std::path::PathBuf;

/// `--home` if given, else `AZP_SANDBOX_HOME`, else the default for this user:
/// `/var/lib/azp-sandbox` for root, `$XDG_DATA_HOME/azp-sandbox` otherwise (XDG's
/// default `~/.local/share`, and `/tmp` without a `HOME`).
pub fn home(flag: Option<PathBuf>, env: &Env, is_root: bool) -> Home {
    if let Some(p) = flag.or_else(|| env.path("AZP_SANDBOX_HOME")) {
        return Home::new(p);
    }
    if is_root {
        return Home::new("/var/lib/azp-sandbox");
    }
    let data = env
        .path("XDG_DATA_HOME")
        .or_else(|| env.path("HOME").map(|h| h.join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    Home::new(data.join("azp-sandbox"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn flag_then_env_then_the_users_default() {
        let env = Env::fixed(&[("AZP_SANDBOX_HOME", "/srv/azp"), ("HOME", "/home/u")]);
        assert_eq!(home(Some("/flag".into()), &env, false).root(), Path::new("/flag"));
        assert_eq!(home(None, &env, true).root(), Path::new("/srv/azp"));
        let env = Env::fixed(&[("AZP_SANDBOX_HOME", ""), ("HOME", "/home/u")]);
        assert_eq!(home(None, &env, true).root(), Path::new("/var/lib/azp-sandbox"), "root; empty is unset");
        assert_eq!(home(None, &env, false).root(), Path::new("/home/u/.local/share/azp-sandbox"));
        let env = Env::fixed(&[("XDG_DATA_HOME", "/xdg"), ("HOME", "/home/u")]);
        assert_eq!(home(None, &env, false).root(), Path::new("/xdg/azp-sandbox"));
        assert_eq!(home(None, &Env::fixed(&[]), false).root(), Path::new("/tmp/azp-sandbox"));
    }
}
