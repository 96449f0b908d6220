//! INI parse/emit for [`Config`]. (Skeleton: filled in by the parsers work.)
use crate::core::config::Config;

/// A config file error: which file, line and key, and what is allowed there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub key: String,
    pub msg: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}: {}", self.file, self.line, self.key, self.msg)
    }
}

impl std::error::Error for ConfigError {}

pub fn parse(file: &str, _text: &str) -> Result<Config, ConfigError> {
    Err(ConfigError { file: file.into(), line: 0, key: String::new(), msg: "not implemented".into() })
}

pub fn emit(_cfg: &Config) -> String {
    String::new()
}
