//! The responses idem-http answers with itself, as RFC 9457 problem details
//! (`application/problem+json`), as the IETF draft's examples do.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode};

/// A problem response: `status`, a short `title` and a `detail` for the client.
pub(crate) fn problem(status: StatusCode, title: &str, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

/// 409 with `Retry-After` (whole seconds, at least 1).
pub(crate) fn in_flight(retry_after: Duration) -> Response {
    let mut response = problem(
        StatusCode::CONFLICT,
        "A request with this Idempotency-Key is being processed",
        "retry after the first request has finished",
    );
    let seconds = retry_after.as_secs_f64().ceil().max(1.0) as u64;
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_problem_is_json_with_its_status() {
        let response = problem(StatusCode::BAD_REQUEST, "Bad key", "why");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["status"], 400);
        assert_eq!(json["detail"], "why");
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        let after = |d| {
            in_flight(d).headers()["retry-after"]
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(after(Duration::from_millis(200)), "1");
        assert_eq!(after(Duration::from_millis(2500)), "3");
    }
}
