//! Serves the web console (clients/web): static assets compiled into the
//! binary, so the console works offline and always matches this exchange's
//! protocol, plus `/config.js`, which tells the page where the WebSocket
//! gateway listens, and the REST read API under `/api/v1/`
//! (`gpux_gateway::rest`), over the exchange's bounded HTTP server (`http.rs`).

use tokio::net::TcpListener;

const INDEX_HTML: &str = include_str!("../../clients/web/index.html");
const APP_JS: &str = include_str!("../../clients/web/app.js");
const STYLE_CSS: &str = include_str!("../../clients/web/style.css");
/// The price chart's library (clients/web/vendor/uplot/README.md).
const UPLOT_JS: &str = include_str!("../../clients/web/vendor/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../clients/web/vendor/uplot/uPlot.min.css");

/// The response to `GET path`: content type and body, if the path exists.
fn asset(path: &str, gateway_url: &str) -> Option<(&'static str, String)> {
    match path {
        "/" | "/index.html" => Some(("text/html; charset=utf-8", INDEX_HTML.to_string())),
        "/app.js" => Some(("text/javascript; charset=utf-8", APP_JS.to_string())),
        "/style.css" => Some(("text/css; charset=utf-8", STYLE_CSS.to_string())),
        "/vendor/uPlot.iife.min.js" => Some(("text/javascript; charset=utf-8", UPLOT_JS.to_string())),
        "/vendor/uPlot.min.css" => Some(("text/css; charset=utf-8", UPLOT_CSS.to_string())),
        "/config.js" => Some(("text/javascript; charset=utf-8", format!("window.GPUX_WS = {gateway_url:?};\n"))),
        _ => None,
    }
}

/// Serves the console and the REST API until the process ends (HTTPS with `tls`).
pub async fn serve(
    listener: TcpListener,
    gateway_url: String,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    rest: axum::Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let router = rest.fallback(move |uri: axum::http::Uri| {
        let gateway_url = gateway_url.clone();
        async move {
            use axum::http::{header, StatusCode};
            use axum::response::IntoResponse;
            match asset(uri.path(), &gateway_url) {
                Some((content_type, body)) => {
                    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
                }
                None => StatusCode::NOT_FOUND.into_response(),
            }
        }
    });
    crate::http::serve(listener, "console", metrics.gateway.clone(), router, tls).await
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
        assert!(asset("/vendor/uPlot.iife.min.js", "ws://x").is_some_and(|(_, body)| body.contains("uPlot")));
    }
}
