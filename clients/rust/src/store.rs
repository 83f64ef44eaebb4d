//! Reaching the job store (docs/protocol.md "The job store"). A token's
//! `url` names one base URL, or several separated by commas: a cluster's
//! nodes, every one of which serves the store and accepts the token. A
//! request goes to the first that answers; one that cannot be reached (a
//! node down, its leader killed mid-transfer) is passed over for the next,
//! so an upload or a sync in flight completes on another node.

/// The base URLs a token's `url` names, in order.
pub fn bases(url: &str) -> impl Iterator<Item = &str> {
    url.split(',').map(str::trim).filter(|base| !base.is_empty()).map(|base| base.trim_end_matches('/'))
}

/// Sends the request `build` makes for each base URL in turn (given the
/// whole URL, base and `path`) until one is answered, whatever its status;
/// the last connection error when none is. `path` starts with `/`.
pub async fn send(url: &str, path: &str, build: impl Fn(&str) -> reqwest::RequestBuilder) -> Result<reqwest::Response, reqwest::Error> {
    let mut failed = None;
    for base in bases(url) {
        match build(&format!("{base}{path}")).send().await {
            Ok(answer) => return Ok(answer),
            // Not reached, or cut before an answer: the next node. A status
            // (even 5xx) is the store's answer and goes back to the caller.
            Err(error) if error.is_connect() || error.is_request() || error.is_timeout() => {
                tracing::warn!(%base, %error, "the job store at this address did not answer; trying the next");
                failed = Some(error);
            }
            Err(error) => return Err(error),
        }
    }
    match failed {
        Some(error) => Err(error),
        // No base at all: reqwest's own error for the malformed URL.
        None => build(path).send().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_one_base_or_several() {
        assert_eq!(bases("http://a:1").collect::<Vec<_>>(), ["http://a:1"]);
        assert_eq!(bases("http://a:1/, http://b:2,,").collect::<Vec<_>>(), ["http://a:1", "http://b:2"]);
    }

    /// The first address refuses connections (nothing listens); the request
    /// is answered by the second.
    #[tokio::test]
    async fn a_base_that_cannot_be_reached_is_passed_over() {
        // A port that was free a moment ago: nothing listens on it now.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("address");
        let alive = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = alive.local_addr().expect("address");
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut socket, _) = alive.accept().await.expect("a connection");
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await;
            let _ = socket.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n").await;
        });
        let client = reqwest::Client::new();
        let url = format!("http://{dead},http://{address}");
        let answer = send(&url, "/v1/list/7", |url| client.get(url)).await.expect("answered by the second");
        assert_eq!(answer.status(), reqwest::StatusCode::NO_CONTENT);
        let refused = send(&format!("http://{dead}"), "/v1/list/7", |url| client.get(url)).await.expect_err("nobody answers");
        assert!(refused.is_connect(), "{refused}");
    }
}
