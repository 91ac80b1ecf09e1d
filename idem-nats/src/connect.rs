//! From the URLs a user gives to a connected client: the list split into servers, and the
//! credentials in them (`nats://user:password@host`, `nats://token@host`) moved into the
//! connection options. async-nats reads no credentials from a URL, and logs the URLs it dials
//! (at DEBUG): so the servers it is given carry none.

use async_nats::{Client, ConnectOptions};

use crate::error::Error;

/// Connects to `urls` (one or several, separated by commas) with `options`, and with the
/// credentials of the first URL that has any (the user's and password, or a token).
pub(crate) async fn connect(urls: &str, options: ConnectOptions) -> Result<Client, Error> {
    let (servers, credentials) = servers(urls);
    let options = match credentials {
        Some(Credentials::User { user, password }) => options.user_and_password(user, password),
        Some(Credentials::Token(token)) => options.token(token),
        None => options,
    };
    options
        .connect(servers)
        .await
        .map_err(|source| Error::connect(urls, source))
}

/// What a URL's user information holds.
#[derive(Debug, PartialEq, Eq)]
enum Credentials {
    /// `user:password@`
    User { user: String, password: String },
    /// `token@`
    Token(String),
}

/// The servers of `urls` without their user information, and the credentials of the first
/// that has any (percent-decoded).
fn servers(urls: &str) -> (Vec<String>, Option<Credentials>) {
    let mut credentials = None;
    let servers = urls
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(|url| {
            let (server, found) = strip(url);
            if credentials.is_none() {
                credentials = found;
            }
            server
        })
        .collect();
    (servers, credentials)
}

/// `url` without its user information, and what that held.
fn strip(url: &str) -> (String, Option<Credentials>) {
    let start = url.find("://").map_or(0, |scheme| scheme + 3);
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |end| start + end);
    let Some(at) = url[start..end].rfind('@').map(|at| start + at) else {
        return (url.to_string(), None);
    };
    let decode = |part: &str| {
        percent_encoding::percent_decode_str(part)
            .decode_utf8_lossy()
            .into_owned()
    };
    let info = &url[start..at];
    let credentials = match info.split_once(':') {
        Some((user, password)) => Credentials::User {
            user: decode(user),
            password: decode(password),
        },
        None => Credentials::Token(decode(info)),
    };
    (
        format!("{}{}", &url[..start], &url[at + 1..]),
        Some(credentials),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_of_urls_is_several_servers() {
        let (list, credentials) = servers("nats://a:4222, nats://b:4223,tls://c:4224,");
        assert_eq!(list, ["nats://a:4222", "nats://b:4223", "tls://c:4224"]);
        assert_eq!(credentials, None);
        assert_eq!(servers("a:4222").0, ["a:4222"]);
    }

    #[test]
    fn credentials_leave_the_urls_for_the_options() {
        let (list, credentials) = servers("nats://h1:4222,nats://ada:p%40ss:w@h2:4222/x");
        assert_eq!(list, ["nats://h1:4222", "nats://h2:4222/x"]);
        let user = Credentials::User {
            user: "ada".into(),
            password: "p@ss:w".into(),
        };
        assert_eq!(credentials, Some(user));
        let (list, credentials) = servers("tls://s3cr3t@h1,nats://bob:x@h2");
        assert_eq!(list, ["tls://h1", "nats://h2"]);
        assert_eq!(credentials, Some(Credentials::Token("s3cr3t".into())));
        assert_eq!(strip("nats://h/a@b").0, "nats://h/a@b");
    }
}
