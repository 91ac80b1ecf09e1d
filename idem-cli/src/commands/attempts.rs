//! `idem poisoned` and `idem retry`: they need attempt counts, which this schema lacks.

use crate::error::CliError;

/// Says that the schema records no attempts, so nothing is poisoned or to retry.
pub fn run() -> Result<(), CliError> {
    Err(CliError::failure(
        "this idem schema records no attempts yet: no message is counted as poisoned, so there is nothing to list or retry",
    ))
}
