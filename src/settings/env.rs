//! The environment: the AZP_* variables that stand in for flags (below the flags, above
//! the config file, see [`super::env_settings`]), and those that give defaults (`--home`).

use std::ffi::OsString;
use std::path::PathBuf;

/// Reads one variable (`std::env::var_os` in the program).
type Getter = Box<dyn Fn(&str) -> Option<OsString>>;

/// The environment as settings read it: a variable that is unset or empty is absent.
/// [`Env::process`] in the program; a fixed list in tests.
pub struct Env {
    get: Getter,
}

impl Env {
    pub fn process() -> Env {
        Env { get: Box::new(|k| std::env::var_os(k)) }
    }

    pub fn fixed(vars: &[(&str, &str)]) -> Env {
        let vars: Vec<(String, OsString)> = vars.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        Env { get: Box::new(move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())) }
    }

    /// The value of `key` as text (None when unset, empty or not UTF-8).
    pub fn var(&self, key: &str) -> Option<String> {
        self.os(key).and_then(|v| v.into_string().ok())
    }

    pub fn path(&self, key: &str) -> Option<PathBuf> {
        self.os(key).map(PathBuf::from)
    }

    fn os(&self, key: &str) -> Option<OsString> {
        (self.get)(key).filter(|v| !v.is_empty())
    }

    /// AZP_TOKEN: the PAT itself (visible in /proc, so the token file is preferred; see
    /// [`super::read_token`]).
    pub fn token(&self) -> Option<String> {
        self.var("AZP_TOKEN")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_unset() {
        let env = Env::fixed(&[("AZP_POOL", ""), ("AZP_URL", "https://x"), ("AZP_TOKEN", "t")]);
        assert_eq!((env.var("AZP_POOL"), env.var("AZP_URL").as_deref()), (None, Some("https://x")));
        assert_eq!(env.path("AZP_POOL"), None);
        assert_eq!(env.token().as_deref(), Some("t"));
        assert_eq!(env.var("UNSET"), None);
    }
}
