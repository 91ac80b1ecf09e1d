//! The operator's dead letters: filled by the dead-letter admin work.
