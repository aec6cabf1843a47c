//! The rules file's TOML as it is written (`[users]`, `[hosts]`, `[channels.NAME]`,
//! `[[rule]]`), and [`RulesError`], which names the line and the key of whatever is wrong.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// What is wrong with a rules file: the line (from 1) and key, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("access rules, line {line}, {key}: {why}")]
pub struct RulesError {
    pub line: usize,
    pub key: String,
    pub why: String,
}

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRules {
    /// `allow` or `deny`: what no rule names.
    #[serde(default)]
    pub default: Option<Spanned<String>>,
    /// How old (ms) an interlock channel's value may be for the send guard to trust it.
    #[serde(default)]
    pub interlock_max_age_ms: Option<u64>,
    /// How often (ms) the gateway reads the interlock channels.
    #[serde(default)]
    pub interlock_poll_ms: Option<u64>,
    /// Group name → API key names and user names.
    #[serde(default)]
    pub users: BTreeMap<Spanned<String>, Vec<Spanned<String>>>,
    /// Group name → CIDRs (`10.0.0.0/8`) or addresses.
    #[serde(default)]
    pub hosts: BTreeMap<Spanned<String>, Vec<Spanned<String>>>,
    #[serde(default)]
    pub channels: BTreeMap<Spanned<String>, RawChannelGroup>,
    #[serde(default)]
    pub rule: Vec<RawRule>,
}

/// `[channels.NAME]`: every criterion given must match (within one, any of its entries).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawChannelGroup {
    /// Globs on the full name or the alias.
    #[serde(default)]
    pub names: Vec<Spanned<String>>,
    /// Module serials (the full name's third part).
    #[serde(default)]
    pub modules: Vec<Spanned<String>>,
    /// `in`, `out`, `inout`.
    #[serde(default)]
    pub directions: Vec<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub name: Spanned<String>,
    /// Channel groups; `["*"]`-like globs belong in a group.
    #[serde(default)]
    pub channels: Vec<Spanned<String>>,
    #[serde(default)]
    pub users: Vec<Spanned<String>>,
    #[serde(default)]
    pub hosts: Vec<Spanned<String>>,
    #[serde(default)]
    pub allow: Vec<Spanned<String>>,
    #[serde(default)]
    pub deny: Vec<Spanned<String>>,
    /// Only while the caller holds the control lease.
    #[serde(default)]
    pub lease: bool,
    /// Only for writes and transacts of this value.
    #[serde(default)]
    pub value: Option<Spanned<String>>,
    #[serde(default)]
    pub interlock: Option<Spanned<RawInterlock>>,
    /// Only on these stations of a gateway serving several (their `[[station]]` ids); left
    /// out: on every station.
    #[serde(default)]
    pub stations: Option<Spanned<Vec<Spanned<String>>>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawInterlock {
    pub channel: String,
    pub value: String,
}

/// The line (from 1) of byte `offset` in `text`.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Parses `text`; a syntax error or an unknown key names its line.
pub(super) fn parse(text: &str) -> Result<RawRules, RulesError> {
    toml::from_str(text).map_err(|error| {
        let line = error
            .span()
            .map(|span| line_of(text, span.start))
            .unwrap_or(1);
        let message = error.message().to_owned();
        // serde names the key in its message (`unknown field `x``); the key path is the
        // table the line is in.
        let key = key_at(text, line);
        RulesError {
            line,
            key,
            why: message,
        }
    })
}

/// The key written on `line` (or the table it opens), for error messages.
fn key_at(text: &str, line: usize) -> String {
    let written = text
        .lines()
        .nth(line.saturating_sub(1))
        .unwrap_or("")
        .trim();
    if written.starts_with('[') {
        return written.trim_matches(|c| c == '[' || c == ']').to_owned();
    }
    written
        .split('=')
        .next()
        .unwrap_or("")
        .trim()
        .trim_matches('"')
        .to_owned()
}
