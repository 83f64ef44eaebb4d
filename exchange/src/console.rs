//! Serves the web console (clients/web): static assets compiled into the
//! binary, so the console works offline and always matches this exchange's
//! protocol, plus `/config.js`, which tells the page where the WebSocket
//! gateway listens. A minimal HTTP/1.1 GET responder like the metrics
//! endpoint's: the console is a handful of files, not a web application.

use tokio::net::TcpListener;

const INDEX_HTML: &str = include_str!("../../clients/web/index.html");
const APP_JS: &str = include_str!("../../clients/web/app.js");
const STYLE_CSS: &str = include_str!("../../clients/web/style.css");

/// The response to `GET path`: content type and body, if the path exists.
fn asset(path: &str, gateway_url: &str) -> Option<(&'static str, String)> {
    match path {
        "/" | "/index.html" => Some(("text/html; charset=utf-8", INDEX_HTML.to_string())),
        "/app.js" => Some(("text/javascript; charset=utf-8", APP_JS.to_string())),
        "/style.css" => Some(("text/css; charset=utf-8", STYLE_CSS.to_string())),
        "/config.js" => Some(("text/javascript; charset=utf-8", format!("window.GPUX_WS = {gateway_url:?};\n"))),
        _ => None,
    }
}

pub async fn serve(listener: TcpListener, gateway_url: String, metrics: std::sync::Arc<crate::metrics::Metrics>) {
    gpux_gateway::admission::serve_http(listener, "console", metrics.gateway.clone(), move |request| {
        let line = String::from_utf8_lossy(request);
        let path = line.strip_prefix("GET ").and_then(|rest| rest.split_whitespace().next()).unwrap_or("");
        let path = path.split('?').next().unwrap_or("");
        match asset(path, &gateway_url) {
            Some((content_type, body)) => format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
            None => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string(),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_serves_its_pages_and_where_the_gateway_is_and_nothing_else() {
        assert!(asset("/", "ws://127.0.0.1:7300").is_some_and(|(kind, body)| kind.starts_with("text/html") && body.contains("app.js")));
        assert_eq!(
            asset("/config.js", "ws://127.0.0.1:7300").map(|(_, body)| body),
            Some("window.GPUX_WS = \"ws://127.0.0.1:7300\";\n".into())
        );
        assert!(asset("/../Cargo.toml", "ws://x").is_none());
        assert!(asset("/metrics", "ws://x").is_none());
    }
}
