//! Which responses are stored, so that a retry gets them back, and which roll back, so that a
//! retry runs the handler again.
//!
//! The draft leaves this to the server. idem-http follows Stripe's documented practice for what
//! the endpoint itself answered, with one difference that idem's transaction makes possible:
//!
//! - **2xx and 3xx** are stored, with the handler's writes, in one commit.
//! - **4xx** are stored too: they are the endpoint's answer to this request (a validation
//!   error, a declined card, a missing account), and a retry with the same key and body would
//!   get the same answer. The exceptions are the ones that say "try again later": 408 Request
//!   Timeout, 409 Conflict, 425 Too Early and 429 Too Many Requests roll back and are not stored.
//! - **5xx** roll back and are not stored (Stripe stores them; here the handler's writes roll
//!   back with them, so nothing was done and the retry runs again).
//!
//! A route chooses otherwise with
//! [`IdempotencyLayer::store_when`](crate::IdempotencyLayer::store_when).

use http::StatusCode;

/// The default rule: 2xx, 3xx, and 4xx other than 408, 409, 425 and 429.
pub fn stored_by_default(status: StatusCode) -> bool {
    match status.as_u16() {
        200..=399 => true,
        408 | 409 | 425 | 429 => false,
        400..=499 => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_stored_and_failures_roll_back() {
        let stored = |code| stored_by_default(StatusCode::from_u16(code).unwrap());
        for code in [200, 201, 204, 303, 400, 402, 404, 422] {
            assert!(stored(code), "{code}");
        }
        for code in [408, 409, 425, 429, 500, 502, 503, 504, 101] {
            assert!(!stored(code), "{code}");
        }
    }
}
