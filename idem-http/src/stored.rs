//! The response kept with a request's record, and the response rebuilt from it for a retry.

use axum::body::Body;
use axum::response::Response;
use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};

/// The header a replayed response carries (as Stripe's API does): `Idempotent-Replayed: true`.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The response headers kept by default: what a client reads from the response of a create
/// (`content-type`, `location`, `etag`, `content-language`). Others (`set-cookie`, dates, tracing
/// ids) are not replayed unless a route asks for them.
pub const DEFAULT_KEPT_HEADERS: [HeaderName; 4] = [
    http::header::CONTENT_TYPE,
    http::header::LOCATION,
    http::header::ETAG,
    http::header::CONTENT_LANGUAGE,
];

/// A response as it is stored: status, kept headers, body. Kept as JSON in the record's result
/// column (readable with `idem show`): a UTF-8 body as text, any other in base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    status: u16,
    headers: Vec<(String, String)>,
    #[serde(flatten)]
    body: StoredBody,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum StoredBody {
    Text(String),
    Base64(String),
}

impl StoredResponse {
    /// What is kept of a response: its status, the values of the `kept` headers that are
    /// visible ASCII (all of them, for the headers a create returns), and its body.
    pub fn capture(
        status: StatusCode,
        headers: &HeaderMap,
        body: &Bytes,
        kept: &[HeaderName],
    ) -> Self {
        let headers = kept
            .iter()
            .flat_map(|name| headers.get_all(name).iter().map(move |value| (name, value)))
            .filter_map(|(name, value)| {
                Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
            })
            .collect();
        let body = match std::str::from_utf8(body) {
            Ok(text) => StoredBody::Text(text.to_owned()),
            Err(_) => StoredBody::Base64(base64::engine::general_purpose::STANDARD.encode(body)),
        };
        StoredResponse {
            status: status.as_u16(),
            headers,
            body,
        }
    }

    /// The stored status.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The stored body's bytes (`None` if stored base64 no longer decodes).
    pub fn body(&self) -> Option<Bytes> {
        match &self.body {
            StoredBody::Text(text) => Some(Bytes::copy_from_slice(text.as_bytes())),
            StoredBody::Base64(data) => base64::engine::general_purpose::STANDARD
                .decode(data)
                .ok()
                .map(Bytes::from),
        }
    }

    /// The response a retry gets: the stored status, headers and body, and
    /// `Idempotent-Replayed: true`. `None` if what is stored no longer makes a response.
    pub fn replay(&self) -> Option<Response> {
        let mut response = Response::new(Body::from(self.body()?));
        *response.status_mut() = StatusCode::from_u16(self.status).ok()?;
        let headers = response.headers_mut();
        for (name, value) in &self.headers {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).ok()?,
                HeaderValue::from_str(value).ok()?,
            );
        }
        headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
        Some(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            http::header::LOCATION,
            HeaderValue::from_static("/payments/7"),
        );
        headers.insert(
            http::header::SET_COOKIE,
            HeaderValue::from_static("session=secret"),
        );
        headers
    }

    async fn bytes_of(response: Response) -> Bytes {
        axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_text_body_replays_byte_for_byte_with_the_kept_headers() {
        let body = Bytes::from_static(b"{\"id\":7,\"note\":\"caf\xc3\xa9\"}");
        let stored = StoredResponse::capture(
            StatusCode::CREATED,
            &headers(),
            &body,
            &DEFAULT_KEPT_HEADERS,
        );
        let json = serde_json::to_string(&stored).unwrap();
        assert!(json.contains("\"text\":"), "{json}");
        let back: StoredResponse = serde_json::from_str(&json).unwrap();
        let response = back.replay().unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.headers()["location"], "/payments/7");
        assert_eq!(response.headers()["content-type"], "application/json");
        assert_eq!(response.headers()[REPLAYED_HEADER], "true");
        assert!(response.headers().get("set-cookie").is_none());
        assert_eq!(bytes_of(response).await, body);
    }

    #[tokio::test]
    async fn a_binary_body_is_kept_in_base64() {
        let body = Bytes::from_static(&[0, 159, 146, 150, 255]);
        let stored = StoredResponse::capture(StatusCode::OK, &HeaderMap::new(), &body, &[]);
        let json = serde_json::to_string(&stored).unwrap();
        assert!(json.contains("\"base64\":"), "{json}");
        let back: StoredResponse = serde_json::from_str(&json).unwrap();
        assert_eq!(bytes_of(back.replay().unwrap()).await, body);
    }

    #[test]
    fn a_stored_value_that_no_longer_makes_a_response_is_none() {
        let stored: StoredResponse =
            serde_json::from_str(r#"{"status":1000,"headers":[],"text":""}"#).unwrap();
        assert!(stored.replay().is_none());
        let stored: StoredResponse =
            serde_json::from_str(r#"{"status":200,"headers":[],"base64":"**"}"#).unwrap();
        assert!(stored.replay().is_none());
    }
}
