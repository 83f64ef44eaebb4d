//! Serves the web console (clients/web): static assets compiled into the
//! binary, so the console works offline and always matches this exchange's
//! protocol, plus `/config.js`, which tells the page where the WebSocket
//! gateway listens, and the REST read API under `/api/v1/`
//! (`gpux_gateway::rest`), over the exchange's bounded HTTP server (`http.rs`).

use tokio::net::TcpListener;

const INDEX_HTML: &str = include_str!("../../clients/web/index.html");
/// The console's ES modules (clients/web/*.js), served as they are: the
/// page loads app.js, which imports the others.
const MODULES: [(&str, &str); 9] = [
    ("/app.js", include_str!("../../clients/web/app.js")),
    ("/state.js", include_str!("../../clients/web/state.js")),
    ("/util.js", include_str!("../../clients/web/util.js")),
    ("/connection.js", include_str!("../../clients/web/connection.js")),
    ("/market.js", include_str!("../../clients/web/market.js")),
    ("/account.js", include_str!("../../clients/web/account.js")),
    ("/ticket.js", include_str!("../../clients/web/ticket.js")),
    ("/documents.js", include_str!("../../clients/web/documents.js")),
    ("/search.js", include_str!("../../clients/web/search.js")),
];
const STYLE_CSS: &str = include_str!("../../clients/web/style.css");
/// The price chart's library (clients/web/vendor/uplot/README.md).
const UPLOT_JS: &str = include_str!("../../clients/web/vendor/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../clients/web/vendor/uplot/uPlot.min.css");

/// The response to `GET path`: content type and body, if the path exists.
fn asset(path: &str, gateway_url: &str) -> Option<(&'static str, String)> {
    match path {
        "/" | "/index.html" => Some(("text/html; charset=utf-8", INDEX_HTML.to_string())),
        "/style.css" => Some(("text/css; charset=utf-8", STYLE_CSS.to_string())),
        "/vendor/uPlot.iife.min.js" => Some(("text/javascript; charset=utf-8", UPLOT_JS.to_string())),
        "/vendor/uPlot.min.css" => Some(("text/css; charset=utf-8", UPLOT_CSS.to_string())),
        "/config.js" => Some(("text/javascript; charset=utf-8", format!("window.GPUX_WS = {gateway_url:?};\n"))),
        _ => MODULES.iter().find(|(name, _)| *name == path).map(|(_, text)| ("text/javascript; charset=utf-8", text.to_string())),
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

    /// Every module in clients/web is served, and every module a module
    /// imports is one of them: a new file cannot be left out.
    #[test]
    fn every_console_module_is_served_and_every_import_is_one_of_them() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/web");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("clients/web")
            .map(|entry| entry.expect("an entry").file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".js"))
            .map(|name| format!("/{name}"))
            .collect();
        on_disk.sort();
        let mut served: Vec<String> = MODULES.iter().map(|(name, _)| name.to_string()).collect();
        served.sort();
        assert_eq!(on_disk, served);
        for (name, text) in MODULES {
            assert_eq!(std::fs::read_to_string(dir.join(&name[1..])).expect("a module"), text, "{name} is served as it is on disk");
            for line in text.lines().filter(|line| line.starts_with("import ")) {
                let target = line.split('"').nth(1).expect("a quoted module").trim_start_matches('.');
                assert!(asset(target, "ws://x").is_some(), "{name} imports {target}, which is not served");
            }
        }
    }
}
