//! How the config file's keys are read and its mistakes reported: a number where a person
//! may write `1` or `"1"` takes both, a word key takes a bare number (`gpus_per_agent = 1`,
//! `memory = 4096`), and every error is one line naming the line of the file and, for an
//! unknown key, the nearest valid one (`agentz`: did you mean `agents`?).

use serde::de::{self, Deserializer, Visitor};
use std::fmt;
use std::marker::PhantomData;

/// A config file error as one line: where (line, and the line's text) and what, with the
/// nearest valid key for an unknown one. `table` names the table read (`[setuid]`), if any.
pub fn one_line(e: &toml::de::Error, text: &str, table: Option<&str>) -> String {
    let msg = e.message().trim();
    let msg = unknown_key(msg, table).unwrap_or_else(|| msg.replace('\n', " "));
    match e.span().map(|s| line_of(text, s.start)) {
        Some((n, line)) if !text.is_empty() => format!("line {n} (`{line}`): {msg}"),
        _ => msg,
    }
}

/// serde's "unknown field `x`, expected one of `a`, `b`" as "unknown key `x`: did you
/// mean `a`?".
fn unknown_key(msg: &str, table: Option<&str>) -> Option<String> {
    let rest = msg.strip_prefix("unknown field `")?;
    let (key, rest) = rest.split_once('`')?;
    let valid: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
    let place = table.map(|t| format!(" in {t}")).unwrap_or_default();
    Some(match nearest(key, &valid) {
        Some(k) => format!("unknown key `{key}`{place}: did you mean `{k}`?"),
        None if valid.is_empty() => format!("unknown key `{key}`{place}: remove it"),
        None => format!("unknown key `{key}`{place}: valid keys are {}", valid.join(", ")),
    })
}

fn line_of(text: &str, offset: usize) -> (usize, &str) {
    let offset = offset.min(text.len());
    let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    (text[..offset].matches('\n').count() + 1, text[start..end].trim())
}

/// The valid key closest to `key` in edit distance, if close enough to be a typo.
pub fn nearest<'a>(key: &str, valid: &[&'a str]) -> Option<&'a str> {
    let (best, d) = valid.iter().map(|v| (*v, distance(key, v))).min_by_key(|(_, d)| *d)?;
    (d <= (key.len() / 3).max(2)).then_some(best)
}

/// Levenshtein distance (keys are short ASCII).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// `#[serde(default, deserialize_with = "keys::word")]`: a word key that also takes a
/// bare number (`gpus_per_agent = 1` is `"1"`).
pub fn word<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct Word;
    impl Visitor<'_> for Word {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string or a number")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }
    d.deserialize_any(Word).map(Some)
}

/// `#[serde(default, deserialize_with = "keys::count")]`: a whole number, written `4` or
/// `"4"`.
pub fn count<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
    struct Count<T>(PhantomData<T>);
    impl<T: TryFrom<u64>> Visitor<'_> for Count<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a whole number (e.g. 4 or \"4\")")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
            T::try_from(v).map_err(|_| E::custom(format!("{v} is too large")))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
            let u = u64::try_from(v).map_err(|_| E::custom(format!("{v} is negative: give a whole number >= 0")))?;
            self.visit_u64(u)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            let u: u64 = v.trim().parse().map_err(|_| E::custom(format!("\"{v}\" is not a whole number")))?;
            self.visit_u64(u)
        }
    }
    d.deserialize_any(Count(PhantomData)).map(Some)
}

/// `#[serde(default, deserialize_with = "keys::flag")]`: `true`/`false`, also as a string.
pub fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    struct Flag;
    impl Visitor<'_> for Flag {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("true or false")
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
            match v.trim() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(E::custom(format!("\"{v}\" is not true or false"))),
            }
        }
    }
    d.deserialize_any(Flag).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct T {
        #[serde(default, deserialize_with = "word")]
        gpus: Option<String>,
        #[serde(default, deserialize_with = "count")]
        agents: Option<usize>,
        #[serde(default, deserialize_with = "flag")]
        on: Option<bool>,
    }

    fn parse(text: &str) -> Result<T, String> {
        toml::from_str::<T>(text).map_err(|e| one_line(&e, text, Some("[t]")))
    }

    #[test]
    fn numbers_and_words_either_way() {
        let t = parse("gpus = 1\nagents = \"2\"\non = \"true\"").unwrap();
        assert_eq!((t.gpus.as_deref(), t.agents, t.on), (Some("1"), Some(2), Some(true)));
        let t = parse("gpus = \"all\"\nagents = 3\non = false").unwrap();
        assert_eq!((t.gpus.as_deref(), t.agents, t.on), (Some("all"), Some(3), Some(false)));
        let t = parse("").unwrap();
        assert_eq!((t.gpus, t.agents, t.on), (None, None, None));
        let e = parse("\nagents = \"two\"").unwrap_err();
        assert!(e.starts_with("line 2 (`agents = \"two\"`): ") && e.contains("not a whole number"), "{e}");
        let e = parse("agents = -1").unwrap_err();
        assert!(e.contains("negative"), "{e}");
        let e = parse("gpus = [1]").unwrap_err();
        assert!(e.contains("expected a string or a number") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn unknown_keys_name_the_nearest() {
        let e = parse("agents = 1\nagentz = 2").unwrap_err();
        assert_eq!(e, "line 2 (`agentz = 2`): unknown key `agentz` in [t]: did you mean `agents`?");
        let e = parse("completely_else = 1").unwrap_err();
        assert!(e.contains("unknown key `completely_else` in [t]: valid keys are gpus, agents, on"), "{e}");
        assert_eq!(nearest("gpus_per_agnet", &["gpus_per_agent", "agents"]), Some("gpus_per_agent"));
        assert_eq!(nearest("x", &["agents"]), None);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
