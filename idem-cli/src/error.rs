//! The one-line errors of the command line and its exit codes.

use std::process::ExitCode;

/// Exit code of a failed operation: a database that cannot be reached, a missing key, ...
pub const FAILURE: u8 = 1;
/// Exit code of bad usage (clap's own code for it).
pub const USAGE: u8 = 2;

/// An error to print on one line of stderr, and the exit code that goes with it.
#[derive(Debug)]
pub struct CliError {
    code: u8,
    message: String,
}

impl CliError {
    /// A failed operation (exit 1).
    pub fn failure(message: impl Into<String>) -> Self {
        CliError {
            code: FAILURE,
            message: message.into(),
        }
    }

    /// Bad usage (exit 2).
    pub fn usage(message: impl Into<String>) -> Self {
        CliError {
            code: USAGE,
            message: message.into(),
        }
    }

    /// A failure already visible, or with nobody left to tell (stdout closed): exit 1, no line.
    pub fn silent() -> Self {
        CliError::failure("")
    }

    /// The exit code.
    #[cfg(test)]
    pub fn code(&self) -> u8 {
        self.code
    }

    /// The message, as printed after `error: `.
    #[cfg(test)]
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Prints `error: <message>` as one line on stderr (unless [`silent`](CliError::silent))
    /// and returns the exit code.
    pub fn report(&self) -> ExitCode {
        if !self.message.is_empty() {
            errln!("error: {}", one_line(&self.message));
        }
        ExitCode::from(self.code)
    }
}

impl From<sqlx::Error> for CliError {
    fn from(err: sqlx::Error) -> Self {
        CliError::failure(format!("database error: {err}"))
    }
}

/// Joins the lines of a message (database errors may span several) into one.
pub fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_become_one_line() {
        assert_eq!(one_line("a\n  b\tc "), "a b c");
    }
}
