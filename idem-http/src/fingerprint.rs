//! What a request's fingerprint covers, for [`IdempotencyLayer::fingerprint`](crate::IdempotencyLayer::fingerprint).

use http::request::Parts;

/// The default: method, path with query, and body. Two requests with one key differ when any of
/// them does (the draft's example: the same key sent to another endpoint or with another
/// payload is refused with 422).
pub fn method_path_body(parts: &Parts, body: &[u8]) -> Vec<u8> {
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    // A method and a request target never contain NUL, so the parts cannot run into each other.
    let mut bytes = Vec::with_capacity(parts.method.as_str().len() + target.len() + body.len() + 2);
    bytes.extend_from_slice(parts.method.as_str().as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(target.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(body);
    bytes
}

/// The body alone: the same payload sent to another path with the same key is the same request.
pub fn body_only(_parts: &Parts, body: &[u8]) -> Vec<u8> {
    body.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, uri: &str) -> Parts {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn method_path_and_body_each_change_the_fingerprint() {
        let base = method_path_body(&parts("POST", "/payments"), b"{}");
        assert_eq!(base, method_path_body(&parts("POST", "/payments"), b"{}"));
        assert_ne!(base, method_path_body(&parts("PUT", "/payments"), b"{}"));
        assert_ne!(base, method_path_body(&parts("POST", "/refunds"), b"{}"));
        assert_ne!(
            base,
            method_path_body(&parts("POST", "/payments?x=1"), b"{}")
        );
        assert_ne!(base, method_path_body(&parts("POST", "/payments"), b"{ }"));
        assert_eq!(
            body_only(&parts("PUT", "/a"), b"x"),
            body_only(&parts("POST", "/b"), b"x")
        );
    }
}
